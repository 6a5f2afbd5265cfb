"""Smoke test of `omnistream bench`: one prompt per cell, every metric reported, no failures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# One request per cell, 6 output tokens and 12 audio frames: each of these has exactly one sample.
ALWAYS_MEASURED = ("ttft_ms", "tpot_ms", "ttfp_ms", "e2e_ms", "rtf")


def _refuse_nan(name: str) -> float:
    raise AssertionError(f"results.json holds {name} as a number")


@pytest.mark.timeout(400)
def test_bench_smoke_reports_every_metric(tiny_model_dir, tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "omnistream.cli.main",
            "bench",
            "--model",
            tiny_model_dir,
            "--max-concurrency",
            "1,2",
            "--num-prompts",
            "1",
            "--input-len",
            "24",
            "--output-len",
            "6",
            "--audio-frames",
            "12",
            "--repeats",
            "1",
            "--warmup",
            "1",
            "--audio-input-seconds",
            "1",
            "--chunk-cost",
            "--chunk-cost-prompts",
            "16,64",
            "--output-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=360,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    payload = json.loads((out / "results.json").read_text(), parse_constant=_refuse_nan)
    rows = payload["rows"]
    cells = {(r["target"], r["async"], r["concurrency"]) for r in rows}
    targets = ("in-process", "services", "in-process+audio-in-1s", "services+audio-in-1s")  # spoken input too
    assert cells == {(t, a, c) for t in targets for a in (True, False) for c in (1, 2)}
    for row in rows:
        assert row["failed"] == 0 and row["completed"] == 1, row
        for metric in ALWAYS_MEASURED:
            assert row[metric]["samples"] == 1 and row[metric]["mean"] >= 0, (row["target"], metric)
        # ITL has a sample only where the text reached the client in several chunks, which depends
        # on scheduling; what is guaranteed is that an empty metric says so instead of holding NaN.
        itl = row["itl_ms"]
        if itl["samples"]:
            assert itl["mean"] >= 0 and itl["p99"] >= itl["median"] >= 0
        else:
            assert all(itl[s] is None for s in ("mean", "median", "p99", "std")), itl
        assert row["request_throughput"] > 0 and row["audio_throughput"] > 0
    assert payload["machine"]["commit"] and payload["machine"]["cores"]
    assert any(key.startswith("services/in-process TTFP") for key in payload["ratios"])
    assert set(payload["chunk_cost"]) == {"16", "64"}
    csv_lines = (out / "results.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + len(rows)
    assert "nan" not in (out / "results.csv").read_text().lower()
    for name in ("bench_ttfp.png", "bench_rtf.png", "bench_e2e.png"):
        assert (out / name).stat().st_size > 1000
    assert "| target |" in proc.stdout
