"""Benchmark statistics: a metric without samples is explicit, never NaN."""

from __future__ import annotations

import json

from omnistream.bench import report
from omnistream.bench.run import ratios
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
    assert summary["itl_ms"] == {"samples": 0, "mean": None, "median": None, "p99": None, "std": None}
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
