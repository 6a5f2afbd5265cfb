"""The thinker's grammar compile time in its stage metrics: one observation per compile, none for a
grammar taken from the cache."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from omnistream.engine.grammar import Grammars
from omnistream.engine.stats import EngineStats
from omnistream.request.structured import StructuredOutput
from omnistream.service.metrics import StageMetrics

pytestmark = pytest.mark.unit


class _Thinker:
    """What StageMetrics reads of a thinker engine, with a real grammar compiler."""

    def __init__(self, tokenizer) -> None:
        self.stats = EngineStats()
        self.grammars = Grammars(tokenizer, 512, [483], stats=self.stats)

    def counts(self) -> tuple[int, int]:
        return 0, 0

    def add_step_listener(self, listener) -> None:
        pass


def test_each_compile_is_observed_and_a_cached_grammar_is_not(tiny_model_dir):
    engine = _Thinker(AutoTokenizer.from_pretrained(tiny_model_dir))
    metrics = StageMetrics("thinker", engine)
    try:

        def count() -> float | None:
            return metrics.registry.get_sample_value(
                "omnistream_stage_grammar_compile_seconds_count", {"stage": "thinker"}
            )

        assert count() == 0
        spec = StructuredOutput("json_schema", json.dumps({"type": "array", "items": {"type": "integer"}}))
        engine.grammars.compile(spec)
        engine.grammars.compile(spec)
        engine.grammars.compile(StructuredOutput("json_object"))
        assert count() == 2 and engine.stats.grammar_compiles == 2 and engine.stats.grammar_cache_hits == 1
        total = metrics.registry.get_sample_value(
            "omnistream_stage_grammar_compile_seconds_sum", {"stage": "thinker"}
        )
        assert total == pytest.approx(engine.stats.grammar_compile_seconds)
    finally:
        engine.grammars.close()
