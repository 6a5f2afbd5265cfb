"""Benchmark statistics: a metric without samples is explicit, never NaN."""

from __future__ import annotations

import json

from omnistream.bench import report
from omnistream.bench.cells import ratios
from omnistream.bench.stats import RequestResult, merge_runs, summarize


def _result(token_times: list[float], tokens: int, audio: bool = True) -> RequestResult:
    return RequestResult(
        ok=True,
        start=0.0,
        token_times=token_times,
        tokens=tokens,
        first_audio=0.5 if audio else None,
        last_audio=1.0 if audio else None,
        audio_seconds=2.0 if audio else 0.0,
        end=1.5,
    )


def test_text_in_one_chunk_gives_an_itl_without_samples():
    summary = summarize([_result([0.1], tokens=6)], duration=2.0)
    empty = {"samples": 0, "mean": None, "median": None, "p90": None, "p99": None, "std": None}
    assert summary["itl_ms"] == empty
    assert summary["ttft_ms"]["samples"] == 1 and summary["ttft_ms"]["mean"] == 100.0


def test_itl_pools_gaps_over_every_request():
    summary = summarize([_result([0.1, 0.2, 0.4], 3), _result([0.1], 3), _result([0.0, 0.3], 2)], 2.0)
    assert summary["itl_ms"]["samples"] == 3
    assert abs(summary["itl_ms"]["mean"] - 200.0) < 1e-9


def test_merge_ignores_runs_without_samples_and_keeps_empty_cells_empty():
    with_gap = summarize([_result([0.1, 0.3], 2)], 2.0)
    without = summarize([_result([0.1], 2)], 2.0)
    merged = merge_runs([without, with_gap])
    assert merged["itl_ms"]["samples"] == 1 and abs(merged["itl_ms"]["mean"] - 200.0) < 1e-9
    empty = merge_runs([without, without])
    assert empty["itl_ms"]["mean"] is None and empty["itl_ms"]["samples"] == 0


def test_reports_write_no_nan(tmp_path):
    rows = []
    for target in ("services", "in-process"):
        for async_chunk in (True, False):
            row = merge_runs([summarize([_result([0.1], 4, audio=async_chunk)], 1.0)])
            rows.append({"target": target, "async": async_chunk, "concurrency": 1, **row})
    payload = {"rows": rows, "ratios": ratios(rows)}
    report.write_json(tmp_path / "r.json", payload)  # allow_nan=False: raises on a NaN
    report.write_csv(tmp_path / "r.csv", rows)
    assert "nan" not in (tmp_path / "r.csv").read_text().lower()
    loaded = json.loads((tmp_path / "r.json").read_text())
    assert loaded["ratios"]["services: TTFP async/sequential @c1"] is None  # sequential had no audio
    assert "n/a" in report.table(rows)


def test_ratios_put_the_exact_stream_beside_the_recompute_baseline():
    def row(target: str, ttfp: float) -> dict:
        metric = {"samples": 1, "mean": ttfp, "median": ttfp, "p99": ttfp, "std": 0.0}
        return {"target": target, "async": True, "concurrency": 10, "ttfp_ms": metric, "rtf": metric}

    out = ratios([row("in-process", 500.0), row("in-process-recompute", 625.0)])
    assert out["in-process stream/recompute Code2Wav TTFP @c10"] == 0.8


def _heard(*arrivals: tuple[float, float]) -> RequestResult:
    """A request whose audio came as (arrival time, seconds at 24 kHz) chunks."""
    result = RequestResult(ok=True, start=0.0, end=5.0)
    for time, seconds in arrivals:
        result.add_audio(time, round(seconds * 24_000), 24_000)
    return result


def test_every_audio_chunk_is_recorded_and_empty_ones_are_not_audio():
    result = RequestResult(start=0.0)
    result.add_audio(0.2, 0, 24_000)  # an empty chunk neither starts TTFP nor counts
    result.add_audio(0.5, 2400, 24_000)
    result.add_audio(0.9, 1600, 16_000)
    assert result.ttfp == 0.5 and result.last_audio == 0.9
    assert abs(result.audio_seconds - 0.2) < 1e-12
    assert [tuple(a) for a in result.audio_chunks] == [(0.5, 2400, 24_000), (0.9, 1600, 16_000)]
    heard = result.listening()
    assert heard.stalls == 1 and abs(heard.stall_s - 0.3) < 1e-9


def test_summary_counts_stalled_and_continuous_requests_among_those_with_audio():
    smooth = _heard((1.0, 0.5), (1.4, 0.5))
    short_gap = _heard((1.0, 0.1), (1.15, 0.5))  # waits 0.05 s: a stall, continuity kept
    stalled = _heard((1.0, 0.16), (1.5, 2.0))  # waits 0.34 s
    silent = RequestResult(ok=True, start=0.0, end=1.0)  # text only: not judged
    failed = _heard((1.0, 0.1), (3.0, 0.1))
    failed.ok = False
    summary = summarize([smooth, short_gap, stalled, silent, failed], 5.0)
    assert summary["listened"] == 3
    assert (summary["stalled_requests"], summary["continuous_requests"]) == (2, 2)
    assert abs(summary["stalled_share"] - 2 / 3) < 1e-12
    assert abs(summary["continuity_rate"] - 2 / 3) < 1e-12
    underrun = summary["underrun_ms"]
    assert underrun["samples"] == 3 and abs(underrun["median"] - 50.0) < 1e-6
    assert 300.0 < underrun["p99"] <= 340.0 + 1e-6
    assert abs(summary["stall_ms"]["mean"] - (0 + 50 + 340) / 3) < 1e-6
    assert abs(summary["longest_stall_ms"]["p99"] - underrun["p99"]) < 1e-6
    assert summary["continuity_threshold_ms"] == 100.0
    assert summary["audio_chunks_per_request"] == 2
    strict = summarize([smooth, short_gap, stalled], 5.0, threshold_s=0.01)
    assert strict["continuous_requests"] == 1


def test_a_cell_without_audio_has_no_listener_numbers():
    summary = summarize([_result([0.1], 4, audio=False)], 1.0)
    assert summary["listened"] == 0
    assert summary["stalled_share"] is None and summary["continuity_rate"] is None
    assert summary["underrun_ms"]["samples"] == 0 and summary["underrun_ms"]["p99"] is None


def test_merge_pools_the_listener_counts_of_the_runs():
    one = summarize([_heard((1.0, 0.16), (1.5, 2.0))], 2.0)  # 1 of 1 stalled
    three = summarize([_heard((1.0, 0.5), (1.4, 0.5))] * 3, 2.0)  # 0 of 3
    merged = merge_runs([one, three])
    assert merged["listened"] == 4 and merged["stalled_requests"] == 1
    assert merged["stalled_share"] == 0.25 and merged["continuity_rate"] == 0.75
    assert merged["audio_chunks_per_request"] == 2.0
    assert merged["underrun_ms"]["samples"] == 4
    assert abs(merged["underrun_ms"]["p99"] - 340.0) < 1e-6  # the worse run's p99
    assert merged["stall_ms"]["run_spread"] > 300.0


def test_refusals_are_counted_apart_from_other_failures():
    results = [
        _result([0.1, 0.2], 2),
        RequestResult(ok=False, start=0.0, error="HTTP 429"),
        RequestResult(ok=False, start=0.0, error="RESOURCE_EXHAUSTED: no audio capacity within 10s"),
        RequestResult(ok=False, start=0.0, error="HTTP 503"),
    ]
    summary = summarize(results, 1.0)
    assert (summary["completed"], summary["failed"], summary["refused"]) == (1, 3, 2)
    assert merge_runs([summary, summary])["refused"] == 4


def _first_audio_at(seconds: float) -> RequestResult:
    result = _result([0.05], 1)
    result.first_audio = seconds
    return result


def test_ttfp_has_a_p90_the_table_shows_and_runs_merge_as_the_worse_one():
    """A burst's tail: the 90th percentile of the time to first audio (10 requests, 0.1 to 1.0 s:
    linear interpolation puts it at 0.91 s), in the table beside the mean, the worse run's when
    runs merge."""
    early = summarize([_first_audio_at(0.1 * k) for k in range(1, 11)], 2.0)
    assert abs(early["ttfp_ms"]["p90"] - 910.0) < 1e-6 and abs(early["ttfp_ms"]["mean"] - 550.0) < 1e-6
    late = summarize([_first_audio_at(2.0)] * 3, 2.0)
    merged = merge_runs([early, late])
    assert merged["ttfp_ms"]["p90"] == 2000.0
    row = {**merged, "target": "services", "async": True, "concurrency": 10}
    header, _, cells = report.table([row]).splitlines()
    titles = [t.strip() for t in header.strip("|").split("|")]
    values = [v.strip() for v in cells.strip("|").split("|")]
    assert values[titles.index("TTFP p90 ms")] == "2000.0"
