"""The stage metrics of the audio stages' scheduling: deferred request-steps and buffered audio."""

from __future__ import annotations

from omnistream.engine.stats import EngineStats
from omnistream.service.metrics import StageMetrics


class _Engine:
    """What StageMetrics reads of an engine: its stats, its counts and its step listeners."""

    def __init__(self) -> None:
        self.stats = EngineStats()
        self.listeners = []

    def counts(self) -> tuple[int, int]:
        return 0, 0

    def add_step_listener(self, listener) -> None:
        self.listeners.append(listener)

    def step(self, deferred: int, buffered: tuple[float, ...]) -> None:
        self.stats.last_deferred = deferred
        self.stats.deferred += deferred
        self.stats.last_buffered = buffered
        for listener in self.listeners:
            listener(self, 0.01)


def test_each_step_adds_its_deferred_requests_and_the_buffered_audio_it_ran():
    engine = _Engine()
    metrics = StageMetrics("talker", engine)
    labels = {"stage": "talker"}

    def value(name: str, **extra: str) -> float | None:
        return metrics.registry.get_sample_value(name, {**labels, **extra})

    assert value("omnistream_stage_deferred_steps_total") == 0
    engine.step(2, (0.05,))
    engine.step(0, (1.5, -0.3, 12.0))
    engine.step(1, ())
    assert value("omnistream_stage_deferred_steps_total") == 3
    assert value("omnistream_stage_buffered_audio_seconds_count") == 4
    assert value("omnistream_stage_buffered_audio_seconds_bucket", le="0.0") == 1  # the late one, as 0
    assert value("omnistream_stage_buffered_audio_seconds_bucket", le="0.1") == 2
    assert value("omnistream_stage_buffered_audio_seconds_bucket", le="10.0") == 3
    assert value("omnistream_stage_buffered_audio_seconds_sum") == 0.05 + 1.5 + 12.0
