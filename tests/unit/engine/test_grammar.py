"""Compiled grammars (cached, shared, bounded in time, refusals naming the client's param) and the
batch's token mask (constrained rows masked, the others untouched), on the tiny tokenizer."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import torch
import xgrammar as xgr
from transformers import AutoTokenizer

from omnistream.engine.grammar import BatchMask, Grammars, unpack_bitmask
from omnistream.request.errors import InvalidRequest
from omnistream.request.structured import StructuredOutput

pytestmark = pytest.mark.unit

VOCAB = 512  # the tiny thinker's logits width (its tokenizer has fewer ids)
IM_END = 483

SCHEMA = StructuredOutput(
    "json_schema",
    json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
)


def _big_schema(n: int) -> StructuredOutput:
    """A schema that takes a while to compile (many properties, each its own pattern)."""
    props = {
        f"p{i}": {"type": "string", "pattern": f"[a-z]{{{i % 7 + 1},{i % 7 + 30}}}x{i}"} for i in range(n)
    }
    return StructuredOutput(
        "json_schema", json.dumps({"type": "object", "properties": props, "required": list(props)})
    )


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def grammars(tokenizer):
    g = Grammars(tokenizer, VOCAB, [IM_END])
    yield g
    g.close()


def test_a_grammar_compiles_once_and_is_reused(grammars):
    first = grammars.compile(SCHEMA)
    assert grammars.stats.grammar_compiles == 1 and grammars.stats.grammar_compile_seconds > 0
    again = asyncio.run(grammars.compile_async(StructuredOutput(SCHEMA.kind, SCHEMA.spec)))
    assert again is first
    assert grammars.stats.grammar_compiles == 1 and grammars.stats.grammar_cache_hits == 1
    assert grammars.cached(SCHEMA)


def test_requests_asking_at_once_share_one_compile(grammars):
    schema = _big_schema(40)
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(grammars.compile(schema))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and all(r is results[0] for r in results)
    assert grammars.stats.grammar_compiles == 1


def test_the_cache_keeps_its_bound(tokenizer):
    grammars = Grammars(tokenizer, VOCAB, [IM_END], entries=2)
    try:
        specs = [
            StructuredOutput("json_schema", json.dumps({"type": "integer", "minimum": i})) for i in range(3)
        ]
        for spec in specs:
            grammars.compile(spec)
        assert not grammars.cached(specs[0]) and grammars.cached(specs[1]) and grammars.cached(specs[2])
    finally:
        grammars.close()


@pytest.mark.parametrize(
    ("structured", "param", "says"),
    [
        (StructuredOutput("json_schema", '{"type": "objec"}'), "response_format", "does not compile"),
        (
            StructuredOutput("json_schema", '{"type": "string", "pattern": "(("}'),
            "response_format",
            "compile",
        ),
        (StructuredOutput("json_schema", "{not json"), "response_format", "not JSON"),
        (StructuredOutput("json_schema", "[1, 2]"), "response_format", "object or a boolean"),
        (
            StructuredOutput("structural_tag", '{"type": "structural_tag", "format": {"type": "nope"}}'),
            "tools",
            "",
        ),
        (StructuredOutput("structural_tag", '"a string"'), "tools", "JSON object"),
    ],
)
def test_a_grammar_that_does_not_compile_is_refused_naming_the_param(grammars, structured, param, says):
    with pytest.raises(InvalidRequest) as err:
        grammars.compile(structured)
    assert err.value.field == param and says in err.value.message
    compiles = grammars.stats.grammar_compiles
    with pytest.raises(InvalidRequest) as again:  # remembered: refused again without compiling
        asyncio.run(grammars.compile_async(structured))
    assert again.value.message == err.value.message and grammars.stats.grammar_compiles == compiles
    assert grammars.compile(SCHEMA) is not None  # and the next request is served


def test_a_compile_past_the_bound_is_refused_and_the_next_served(tokenizer):
    grammars = Grammars(tokenizer, VOCAB, [IM_END], timeout=0.001)
    try:
        slow = _big_schema(300)
        with pytest.raises(InvalidRequest) as err:
            grammars.compile(slow)
        assert err.value.field == "response_format" and "did not compile within 0.001 s" in err.value.message
        tag = StructuredOutput(
            "structural_tag", json.dumps({"type": "structural_tag", "format": _tag_format()})
        )
        with pytest.raises(InvalidRequest) as err:
            asyncio.run(grammars.compile_async(_big_schema(301)))
        assert grammars.stats.grammar_timeouts == 2
        grammars.timeout = 30
        assert grammars.compile(tag) is not None
    finally:
        grammars.close()


def _tag_format() -> dict:
    return {
        "type": "triggered_tags",
        "triggers": ["<tool_call>"],
        "tags": [
            {
                "begin": "<tool_call>",
                "content": {"type": "json_schema", "json_schema": {"type": "integer"}},
                "end": "</tool_call>",
            }
        ],
        "at_least_one": True,
    }


def test_both_structural_tag_forms_compile(grammars):
    new = StructuredOutput("structural_tag", json.dumps({"type": "structural_tag", "format": _tag_format()}))
    legacy = StructuredOutput(
        "structural_tag",
        json.dumps(
            {
                "type": "structural_tag",
                "structures": [
                    {"begin": "<tool_call>", "schema": {"type": "integer"}, "end": "</tool_call>"}
                ],
                "triggers": ["<tool_call>"],
            }
        ),
    )
    for structured in (new, legacy):
        matcher = grammars.matcher(grammars.compile(structured))
        assert matcher.accept_string("<tool_call>42</tool_call>")


def test_a_completed_grammar_allows_only_the_stop_token(grammars, tokenizer):
    matcher = grammars.matcher(grammars.compile(StructuredOutput("json_object")))
    assert matcher.accept_string("{}")
    mask = BatchMask(VOCAB, 1)
    mask.fill(matcher, 0)
    allowed = unpack_bitmask(mask.bitmask, VOCAB)[0]
    assert allowed.nonzero().flatten().tolist() == [IM_END]
    assert matcher.accept_token(IM_END) and matcher.is_terminated()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_mask_touches_only_the_constrained_rows(grammars, dtype):
    matcher = grammars.matcher(grammars.compile(StructuredOutput("json_object")))
    mask = BatchMask(VOCAB, 4)
    logits = torch.randn(3, VOCAB, dtype=dtype, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    mask.fill(matcher, 1)
    mask.apply(logits, [1])
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    allowed = unpack_bitmask(mask.bitmask[1:2], VOCAB)[0]
    assert torch.equal(logits[1][allowed], before[1][allowed])
    assert bool(torch.isinf(logits[1][~allowed]).all()) and 0 < int(allowed.sum()) < VOCAB
    mask.apply(logits, [])  # no constrained row: nothing happens
    assert torch.equal(logits[0], before[0])


def test_unpack_agrees_with_xgrammar(grammars):
    matcher = grammars.matcher(grammars.compile(SCHEMA))
    bitmask = xgr.allocate_token_bitmask(1, VOCAB)
    matcher.fill_next_token_bitmask(bitmask, 0)
    logits = torch.zeros(1, VOCAB)
    xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=VOCAB)
    assert torch.equal(unpack_bitmask(bitmask, VOCAB)[0], ~torch.isinf(logits[0]))


def test_rows_filled_together_are_the_rows_filled_one_by_one(grammars):
    compiled = grammars.compile(SCHEMA)
    matchers = [grammars.matcher(compiled) for _ in range(3)]
    assert matchers[1].accept_string('{"n":')
    assert matchers[2].accept_string('{"n":12')
    together, alone = BatchMask(VOCAB, 4), BatchMask(VOCAB, 4)
    together.fill_rows(matchers, [0, 2, 3])
    for matcher, row in zip(matchers, [0, 2, 3], strict=True):
        alone.fill(matcher, row)
    assert torch.equal(together.bitmask[[0, 2, 3]], alone.bitmask[[0, 2, 3]])
    assert not torch.equal(alone.bitmask[0], alone.bitmask[2])  # different states, different rows


def test_a_fill_started_beside_the_forward_is_the_fill_done_at_sampling(grammars):
    """`start` fills in the mask's own thread (the engine's forward runs meanwhile); once waited
    for, its rows are those `fill` makes, and a failing matcher's error comes out of `wait`."""
    compiled = grammars.compile(SCHEMA)
    matchers = [grammars.matcher(compiled) for _ in range(2)]
    assert matchers[1].accept_string('{"n":3')
    started, alone = BatchMask(VOCAB, 4), BatchMask(VOCAB, 4)
    filling = started.start(matchers, [1, 3])
    for matcher, row in zip(matchers, [1, 3], strict=True):
        alone.fill(matcher, row)
    filling.wait()
    assert filling.rows == [1, 3]
    assert torch.equal(started.bitmask[[1, 3]], alone.bitmask[[1, 3]])
    ended = grammars.matcher(compiled)
    assert ended.accept_string('{"n":1}') and ended.accept_token(grammars.stop_ids[0])
    failing = started.start([ended], [0])  # terminated: xgrammar refuses to fill it
    with pytest.raises(RuntimeError):
        failing.wait()
    started.close()


@pytest.mark.parametrize("rows", [[0, 1, 2], [1, 3]])
def test_the_additive_mask_masks_as_xgrammar_does(grammars, rows):
    """On the CPU a started fill is applied as one add of 0 / -inf per token, built in the fill
    thread: the logits it leaves are those xgrammar's apply leaves (the same -inf, the rest bit
    for bit), for the first rows and for rows with gaps, in float32 and float64."""
    compiled = grammars.compile(SCHEMA)
    matchers = [grammars.matcher(compiled) for _ in rows]
    assert matchers[-1].accept_string('{"n":')
    mask = BatchMask(VOCAB, 4, additive=True)
    filling = mask.start(matchers, rows)
    filling.wait()
    for dtype in (torch.float32, torch.float64):
        logits = torch.randn(4, VOCAB, dtype=dtype)
        expected = logits.clone()
        mask.apply(expected, rows)
        mask.apply_filled(logits, filling)
        assert torch.equal(logits, expected)
        assert torch.isinf(logits[rows[-1]]).any() and not torch.isinf(logits[rows[-1]]).all()
    mask.close()
