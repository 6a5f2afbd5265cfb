"""What a thinker request asks of vLLM: its `SamplingParams`, and its output grammar (tool calls,
response_format) as vLLM's structured outputs, checked by vLLM's own validation.

Split from vllm_engine.py (the engine API over vLLM); vLLM is imported only inside the functions,
so this module imports without it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from typing import Any

from omnistream.engine.json_grammar import strict_grammar
from omnistream.request.errors import InvalidRequest, InvalidValue, OmniError
from omnistream.request.stage_chain import ThinkerParams
from omnistream.request.structured import StructuredOutput


@contextlib.contextmanager
def grammar_refusals(param: str) -> Iterator[None]:
    """Building or checking a grammar: a failure that is not already an OmniError is the client's
    grammar refused (InvalidValue naming `param`), never an internal error."""
    try:
        yield
    except OmniError:
        raise
    except Exception as exc:
        raise InvalidValue(f"the output grammar does not compile: {exc}", field=param) from None


def structured_outputs(structured: StructuredOutput) -> Any:
    """Our grammar as vLLM's structured outputs: the strict grammars the transformers thinker
    compiles (json_grammar.py), built here with this environment's xgrammar, EBNF for the JSON
    kinds and the strict structural tag for tool calls. vLLM's own refusals stay: a schema
    nested too deeply, or with what vLLM knows xgrammar does not enforce. A spec that cannot be
    built is InvalidValue naming the client's param."""
    from vllm.sampling_params import StructuredOutputsParams, check_json_nesting
    from vllm.v1.structured_output.backend_xgrammar import has_xgrammar_unsupported_json_features

    kind, spec = structured.kind, structured.spec
    if kind not in ("json_schema", "json_object", "structural_tag"):
        raise InvalidRequest(f"unknown structured output kind {kind!r}", field=structured.param)
    with grammar_refusals(structured.param):
        if kind == "json_schema":
            check_json_nesting(spec)
            schema = json.loads(spec)
            if isinstance(schema, dict) and has_xgrammar_unsupported_json_features(schema):
                raise InvalidValue(
                    "the JSON schema has features xgrammar does not enforce", field=structured.param
                )
        if kind == "structural_tag":
            check_json_nesting(spec, structural_tag=True)
        built = strict_grammar(kind, spec)
    if kind == "structural_tag":
        return StructuredOutputsParams(structural_tag=built)
    return StructuredOutputsParams(grammar=built)


def checked_structured_outputs(structured: StructuredOutput, eos_ids: Iterable[int]) -> Any:
    """`structured_outputs(structured)`, checked by vLLM's own validation (which parses it with
    xgrammar) as a request's sampling params would be: what vLLM would refuse is InvalidValue
    naming the client's param. Blocking (call it off the event loop)."""
    from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

    outputs = structured_outputs(structured)
    with grammar_refusals(structured.param):
        validate_xgrammar_grammar(
            sampling_params(ThinkerParams(structured_output=structured), outputs, eos_ids)
        )
    return outputs


def sampling_params(params: ThinkerParams, structured: Any, eos_ids: Iterable[int]) -> Any:
    """vLLM's SamplingParams for a request's `params`, with `structured` (its structured outputs,
    or None); `eos_ids`: the thinker's end-of-turn ids."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    s = params.sampling
    # A grammar ends the answer at its end: its stop tokens (our end-of-turn ids) stop it even
    # with ignore_eos, which never runs a grammar past its end.
    stops = sorted(eos_ids) if structured is not None or not params.ignore_eos else []
    return SamplingParams(
        n=1,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        repetition_penalty=s.repetition_penalty,
        seed=s.seed,
        max_tokens=params.max_tokens,
        # Our end-of-turn ids stop it (and are sent, as the transformers thinker sends them),
        # unless the request ignores them; vLLM's own EOS handling stays out of it.
        ignore_eos=True,
        stop_token_ids=stops,
        output_kind=RequestOutputKind.DELTA,
        detokenize=False,
        structured_outputs=structured,
    )
