"""The thinker continuing an answer it did not start (ThinkerParams.answer_ids: a request resumed after
its replica was lost): given the first n tokens of an answer, it gives the rest of that very answer,
text included, greedy and sampled; an answer that cannot be continued is refused naming the field."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from omnistream.engine.sampling import SamplingParams
from omnistream.engine.settings import ThinkerEngineSettings
from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine, ThinkerParams
from omnistream.request.errors import InvalidRequest
from omnistream.request.structured import StructuredOutput


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    e = ThinkerEngine(tiny_model_dir, ThinkerEngineSettings(dtype="float64", max_batch=4, max_model_len=256))
    e.start()
    yield e
    e.stop()


async def _answer(engine, rid, prompt, params) -> tuple[list[int], list[str], list[int]]:
    """Its tokens, each output's text and each output's token index (an output is one token)."""
    tokens, texts, indexes = [], [], []
    async for out in engine.add_request(rid, prompt, params):
        assert len(out.token_ids) == 1
        tokens += out.token_ids
        texts.append(out.text_delta)
        indexes.append(out.index)
    return tokens, texts, indexes


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(), SamplingParams(temperature=1.0, top_p=0.9, seed=3), SamplingParams(temperature=0.8)],
    ids=["greedy", "seeded", "unseeded-but-given-one"],
)
def test_an_answer_continued_from_any_point_is_the_rest_of_that_answer(engine, sampling):
    prompt = engine.encode_chat([{"role": "user", "content": "Tell me about the sea."}])
    if sampling.seed is None and not sampling.greedy:
        sampling = dataclasses.replace(sampling, seed=99)  # what the gateway does for such a request
    params = ThinkerParams(max_tokens=20, ignore_eos=True, sampling=sampling)

    async def main() -> None:
        tokens, texts, _ = await _answer(engine, "whole", prompt, params)
        for n in (1, 7, 19):
            resumed = dataclasses.replace(params, answer_ids=tuple(tokens[:n]))
            rest, rest_texts, indexes = await _answer(engine, f"from-{n}", prompt, resumed)
            assert tokens[:n] + rest == tokens, n
            assert indexes == list(range(n, len(tokens))), n
            # Its text goes on where the first replica's left off, output for output (the bytes of
            # a character the cut split come whole with its next text, as they would have).
            assert rest_texts == texts[n:], n

    asyncio.run(main())


def test_an_answer_that_cannot_be_continued_is_refused_naming_the_field(engine):
    prompt = engine.encode_chat([{"role": "user", "content": "hi"}])
    refused = [
        ThinkerParams(max_tokens=4, answer_ids=(1, 2, 3, 4)),  # nothing left to generate
        ThinkerParams(max_tokens=8, answer_ids=(-1,)),
        ThinkerParams(max_tokens=8, answer_ids=(10**9,)),
        ThinkerParams(max_tokens=8, answer_ids=(5,), assistant_text="given"),  # nothing is generated
    ]
    for params in refused:
        with pytest.raises(InvalidRequest) as caught:
            engine.add_request("refused", prompt, params)
        assert caught.value.field == "answer_ids", params


def test_a_json_answer_continued_mid_way_keeps_its_grammar(engine):
    """The grammar stands where the answer so far left it: the rest is the rest of the same JSON."""
    prompt = engine.encode_chat([{"role": "user", "content": "The weather, as JSON."}])
    sampling = SamplingParams(temperature=1.0, seed=5)
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "note": {"type": "string"}},
        "required": ["city", "note"],
    }
    spec = StructuredOutput("json_schema", json.dumps(schema))
    params = ThinkerParams(48, sampling=sampling, structured_output=spec)

    async def main() -> None:
        tokens, texts, _ = await _answer(engine, "json-whole", prompt, params)
        assert len(tokens) > 6
        for n in (2, len(tokens) // 2):
            resumed = dataclasses.replace(params, answer_ids=tuple(tokens[:n]))
            rest, rest_texts, _ = await _answer(engine, f"json-from-{n}", prompt, resumed)
            assert tokens[:n] + rest == tokens and rest_texts == texts[n:], n
        assert "".join(texts).startswith('{"')  # the grammar held the answer (cut by max_tokens)

    asyncio.run(main())
