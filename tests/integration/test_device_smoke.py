"""tools/gpu-smoke on the CPU with the tiny model: every stage loads, runs its request to the end,
and reports step times, host syncs and aten ops per step (so the tool still works when a GPU comes).

An integration test (it was tests/unit/bench/): it runs the tool as a process that loads every
stage (about a minute on the 2-core machine under load)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from omnistream.bench.device_smoke import _OwnSyncCounter, step_until_done

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_smoke_runs_every_stage_on_the_cpu(tiny_model_dir, tmp_path):
    out = tmp_path / "smoke.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(ROOT / "tools" / "gpu-smoke"), "--device", "cpu", "--model", tiny_model_dir]
    cmd += ["--max-tokens", "4", "--max-frames", "8", "--out", str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["thinker"]["outputs"] == 4 and report["talker"]["outputs"] == 8
    assert report["code2wav"]["outputs"] >= 2  # 8 frames in windows of 4 then 8, plus the end
    for stage in ("thinker", "talker", "code2wav"):
        r = report[stage]
        assert r["ok"] and r["device"] == "cpu" and r["dtype"] == "float32", r
        assert r["steps"] >= 1 and r["median_step_ms"] > 0 and r["estimated_gib"] > 0
        # Every stage hands something back to the host per step (ids, audio): counted, not zero.
        assert r["syncs_per_step"]["max"] >= 1 and sum(r["sync_calls"].values()) >= r["steps"]
    ops = report["op_counts"]
    assert ops["ok"], ops
    assert {(r["stage"], r["batch"]) for r in ops["per_step"]} == {
        (stage, batch) for stage in ("thinker", "talker", "talker-static", "code2wav") for batch in (1, 4)
    }
    for r in ops["per_step"]:
        assert r["total"] == r["inside"] + r["outside"] > 0, r


def test_own_counter_counts_only_inside_and_restores_the_methods():
    counter = _OwnSyncCounter()
    item = torch.Tensor.item
    t = torch.tensor([3.0])
    with counter.counting() as counts:
        t.item()
        t.tolist()
        int(t)
    t.item()  # outside: not counted
    assert counts == {"item": 1, "tolist": 1, "__int__": 1}
    assert torch.Tensor.item is item


def test_step_until_done_stops_when_the_engine_has_no_work():
    class Idle:
        def plan_step(self):
            return None

    assert step_until_done(Idle(), "cpu", _OwnSyncCounter()) == []
