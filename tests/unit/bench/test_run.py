"""`--codec-chunk-schedules` and the A B B A order the schedules run in."""

from __future__ import annotations

import pytest

from omnistream.bench.cells import audio_holds, chunk_schedules, interleave, ratios


def test_chunk_schedules_are_parsed_and_checked():
    assert chunk_schedules("fixed,grow") == ["fixed", "grow"]
    assert chunk_schedules(" grow ") == ["grow"]
    assert chunk_schedules("") == [None]  # none given: the table's default, no target suffix
    with pytest.raises(ValueError, match="unknown chunk schedule"):
        chunk_schedules("fixed,steady")
    with pytest.raises(ValueError, match="twice"):
        chunk_schedules("grow,grow")


def test_schedules_and_targets_interleave_a_b_b_a():
    units = [("services", "fixed"), ("services", "grow")]
    assert interleave(units, 2) == [units[0], units[1], units[1], units[0]]
    assert interleave(units, 3) == [*units, *units[::-1], *units]
    assert interleave(["a"], 2) == ["a", "a"]


def test_ratios_put_the_new_schedule_beside_todays():
    def row(target: str, ttfp: float) -> dict:
        metric = {"samples": 1, "mean": ttfp, "median": ttfp, "p99": ttfp, "std": 0.0}
        return {"target": target, "async": True, "concurrency": 4, "ttfp_ms": metric, "e2e_ms": metric,
                "rtf": metric}  # fmt: skip

    out = ratios([row("services[fixed]", 400.0), row("services[grow]", 300.0)])
    assert out["services[grow] vs [fixed]: TTFP grow/fixed @c4"] == 0.75


def test_audio_holds_are_the_settings_to_run_in_order():
    assert audio_holds("on") == [True]
    assert audio_holds("on,off") == [True, False]
    assert audio_holds(" off , on ") == [False, True]
    for bad in ("", "on,on", "maybe", "on,off,on"):
        with pytest.raises(ValueError):
            audio_holds(bad)


def test_the_hold_is_compared_with_no_hold_per_concurrency():
    def row(target: str, conc: int, audio: float, ttfp: float) -> dict:
        return {
            "target": target,
            "async": True,
            "concurrency": conc,
            "audio_throughput": audio,
            "ttfp_ms": {"mean": ttfp},
            "rtf": {"mean": 0.5},
        }

    got = ratios([row("services", 16, 27.0, 900.0), row("services[no-hold]", 16, 30.0, 1000.0)])
    assert got["services hold/no-hold audio s/s @c16"] == pytest.approx(0.9)
    assert got["services hold/no-hold TTFP @c16"] == pytest.approx(0.9)
