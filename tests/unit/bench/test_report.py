"""The bench's outputs carry the listener's numbers: the table's columns, the CSV's fields, the
plots; a cell without audio says n/a (table) and nothing (CSV), never 0."""

from __future__ import annotations

import csv

from omnistream.bench import report
from omnistream.bench.stats import RequestResult, merge_runs, summarize


def _row(target: str, *chunks: tuple[float, float], concurrency: int = 1) -> dict:
    result = RequestResult(ok=True, start=0.0, token_times=[0.1], tokens=1, end=3.0)
    for time, seconds in chunks:
        result.add_audio(time, round(seconds * 24_000), 24_000)
    row = merge_runs([summarize([result], 3.0)])
    return {"target": target, "async": True, "concurrency": concurrency, **row}


def _rows() -> list[dict]:
    return [
        _row("services[fixed]", (0.5, 0.16), (1.0, 2.0)),  # waits 0.34 s
        _row("services[grow]", (0.5, 0.16), (0.6, 2.0)),  # no wait
        _row("services[grow]", (0.5, 0.16), (0.6, 2.0), concurrency=4),
        _row("text-only"),
    ]


def test_the_table_has_the_listener_columns():
    lines = report.table(_rows()).splitlines()
    titles = [c.strip() for c in lines[0].strip("|").split("|")]
    assert titles[-5:] == ["stalled", "continuity", "underrun p50 ms", "underrun p99 ms", "stall ms"]
    fixed = [c.strip() for c in lines[2].strip("|").split("|")]
    assert fixed[-5:] == ["100%", "0%", "340.0", "340.0", "340.0"]
    grow = [c.strip() for c in lines[3].strip("|").split("|")]
    assert grow[-5:] == ["0%", "100%", "0.0", "0.0", "0.0"]
    silent = [c.strip() for c in lines[5].strip("|").split("|")]
    assert silent[-5:] == ["n/a"] * 5


def test_the_csv_has_the_listener_fields(tmp_path):
    report.write_csv(tmp_path / "r.csv", _rows())
    with (tmp_path / "r.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["stalled_share"] == "1.0" and rows[0]["continuity_rate"] == "0.0"
    assert abs(float(rows[0]["underrun_ms_p99"]) - 340.0) < 1e-6 and rows[0]["listened"] == "1"
    assert rows[0]["continuity_threshold_ms"] == "100.0"
    assert abs(float(rows[0]["longest_stall_ms_mean"]) - 340.0) < 1e-6
    assert rows[3]["stalled_share"] == "" and rows[3]["underrun_ms_p99"] == ""


def test_the_plots_include_the_listener_ones(tmp_path):
    written = report.plot(tmp_path / "bench", _rows())
    names = {p.name for p in written}
    assert {"bench_stalled.png", "bench_continuity.png", "bench_underrun.png", "bench_ttfp.png"} <= names
    assert all(p.stat().st_size > 0 for p in written)
