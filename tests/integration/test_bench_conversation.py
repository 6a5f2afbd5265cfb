"""Smoke test of `omnistream bench --conversation` (omnistream/bench/conversation/): two turns of
each workload on the tiny model, cache on and off, every number reported, the targets checked."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow  # 60 s on 2 cores; make test-slow runs it
@pytest.mark.timeout(300)
def test_conversation_bench_smoke_reports_every_turn(tiny_model_dir, tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "omnistream.cli.main",
            "bench",
            "--conversation",
            "--conversation-models",
            tiny_model_dir,
            "--conversation-turns",
            "2",
            "--conversation-concurrency",
            "2",
            "--conversation-concurrent-turns",
            "2",
            "--conversation-max-tokens",
            "4",
            "--conversation-audio-frames",
            "8",
            "--repeats",
            "1",
            "--output-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    payload = json.loads((out / "conversation.json").read_text())
    assert payload["order"] == ["on", "off"]
    (checkpoint,) = payload["checkpoints"].values()
    runs = {run["cache"]: run for run in checkpoint["runs"]}
    for cache, run in runs.items():
        assert not run["errors"], run["errors"]
        for workload in ("realtime", "rest"):
            turns = run[workload]
            assert [t["turn"] for t in turns] == [1, 2]
            for t in turns:
                assert not t["error"], (cache, workload, t)
                assert t["ttft_ms"] > 0 and t["ttfp_ms"] > 0 and t["audio_seconds"] > 0
                assert t["input_tokens"] > 0 and t["cached_tokens"] is not None
            # turn 2 re-sends turn 1: more input; with the cache some of it comes from there
            assert turns[1]["input_tokens"] > turns[0]["input_tokens"]
            if cache == "on":
                assert turns[1]["cached_tokens"] > 0
            else:
                assert all(t["cached_tokens"] == 0 for t in turns)
        conc = run["concurrent"]
        assert conc["turns"] == 4 and conc["failed"] == 0 and conc["audio_throughput"] > 0
    assert len(payload["targets"]) == 5
    text = (out / "conversation.md").read_text()
    assert "| turn | TTFT on ms |" in text and "### Targets" in text
    assert text.count("PASS") + text.count("FAIL") == 5
