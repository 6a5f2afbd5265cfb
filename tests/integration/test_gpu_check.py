"""`tools/gpu-check --all` on the CPU at the small sizes, as a real process: the prepared device run
keeps working while no GPU is lent. Each checkpoint (the tiny one in `make test`, it and the
real-shaped one in `make test-slow`) gets every row of the table as numbers (step times at each
batch, each experts kernel's, RTF and TTFP through a real `omnistream up` at each concurrency),
parity with transformers holds, the `omnistream up` stacks are gone afterwards, and a spent
--budget-s leaves the later parts skipped, not crashed.

An integration test: it starts `omnistream up` (once a checkpoint) and loads every stage (about 40 s
a checkpoint on the 2-core machine)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from omnistream.bench.gpu_check.parts import PARTS
from omnistream.bench.gpu_check.run_all import JSON_NAME, TABLE_NAME, errors
from omnistream.bench.gpu_check.table import ROWS, render
from tests.procs import kill_all, marked_pids, wait_until

ROOT = Path(__file__).resolve().parents[2]
MARK = "OMNISTREAM_TEST_GPU_CHECK_MARK"  # inherited by the `omnistream up` it starts, and its services
CHECKPOINTS = ("tiny", "real-shaped")
PART_NAMES = [name for name, _ in PARTS]
SMALL = ["--device", "cpu", "--dtype", "float32", "--batches", "1,2", "--concurrency", "1,2", "--small"]


def _gpu_check(tiny: str, real_shaped: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """The tool as a process; afterwards nothing it started may be left (then killed, and failed)."""
    mark = secrets.token_hex(8)
    env = {**os.environ, "PYTHONPATH": str(ROOT), MARK: mark}
    cmd = [sys.executable, str(ROOT / "tools" / "gpu-check"), "--all", *SMALL]
    cmd += ["--model", tiny, "--real-shaped", real_shaped, "--out", str(out), *extra]
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=500)
    finally:
        gone = wait_until(lambda: not marked_pids(MARK, mark), 30)
        left = marked_pids(MARK, mark)
        kill_all(left)
        assert gone, f"gpu-check left processes behind: {left}"


def _output(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout[-6000:] + done.stderr[-6000:]


# The tiny checkpoint alone in `make test` (every part's path); both in `make test-slow`.
@pytest.mark.parametrize(
    "checkpoints", [("tiny",), pytest.param(CHECKPOINTS, marks=pytest.mark.slow)], ids=["tiny", "both"]
)
def test_all_prints_every_row_for_each_checkpoint_on_the_cpu(
    checkpoints, tiny_model_dir, real_shaped_model_dir, tmp_path
):
    done = _gpu_check(tiny_model_dir, real_shaped_model_dir, tmp_path, "--checkpoints", ",".join(checkpoints))
    assert done.returncode == 0, _output(done)
    report = json.loads((tmp_path / JSON_NAME).read_text())
    parts = report["parts"]
    assert errors(parts) == [], _output(done)
    assert list(parts) == [f"{c}/{p}" for p in PART_NAMES for c in checkpoints]
    for label in checkpoints:
        steps = parts[f"{label}/steps"]
        assert steps["ok"] and steps["dtype"] == "float32" and steps["cuda_graphs"] is False, steps
        for key in ("thinker_ms_per_token", "talker_ms_per_frame", "code2wav_ms_per_chunk"):
            assert set(steps[key]) == {"1", "2"}, steps
            assert all(isinstance(ms, float) and ms > 0 for ms in steps[key].values()), steps
        kernels = parts[f"{label}/experts"]
        for stage in ("thinker_ms_per_token", "talker_ms_per_frame"):
            for kernel in ("grouped_mm", "fixed"):
                cells = kernels[f"{stage}_{kernel}"]
                assert set(cells) == {"1", "2"} and all(ms > 0 for ms in cells.values()), kernels
        assert kernels["thinker_profile"].startswith("== thinker, batch 2"), kernels["thinker_profile"]
        parity = parts[f"{label}/parity"]
        assert parity["ok"] and parity["prompts"] == parity["tokens_equal"] == parity["codes_equal"] == 1
        assert parity["batch_invariant"] and parity["audio_max_abs_diff"] < 1e-4, parity
        served = parts[f"{label}/served"]
        assert served["ok"] and served["start_s"] > 0, served
        assert set(served["cells"]) == {"1", "2"}, served
        for conc, cell in served["cells"].items():
            assert cell["completed"] == cell["requests"] >= max(int(conc), 2) and not cell["failed"], cell
            assert cell["rtf"] > 0 and cell["ttfp_ms"] > 0, cell
            assert cell["audio_s_per_request"] > 1.0, cell  # 16 frames of 80 ms
        for part in PART_NAMES:
            assert parts[f"{label}/{part}"]["seconds"] > 0
    # The table: printed and written, every checkpoint's rows with numbers, vLLM-Omni's figures.
    table = (tmp_path / TABLE_NAME).read_text().strip()
    assert table == report["table"] and table in done.stdout
    rows = [
        line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| checkpoint")
    ]
    assert len(rows) == len(checkpoints) * (len(ROWS) + 1), table
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[0] in checkpoints and cells[2] and cells[-1], row
        if "parity" in cells[1]:
            assert cells[2].startswith("tokens 1/1, codes 1/1 equal") and "invariant" in cells[2], row
        else:
            assert all(float(c.replace(",", "")) > 0 for c in cells[2:4]), row
    assert "0.22 (c1), 0.29 (c4), 0.41 (c10)" in table and "523 (c1)" in table
    assert "error" not in table and "skipped" not in table
    for label in checkpoints:  # each part said how long it took, as it ended
        for part in PART_NAMES:
            assert f"[{label}/{part}] ok (" in done.stdout


def test_a_spent_budget_skips_the_parts_left(tiny_model_dir, real_shaped_model_dir, tmp_path):
    done = _gpu_check(tiny_model_dir, real_shaped_model_dir, tmp_path, "--budget-s", "1")
    assert done.returncode == 0, _output(done)
    report = json.loads((tmp_path / JSON_NAME).read_text())
    parts = report["parts"]
    assert errors(parts) == [], _output(done)
    first = parts["tiny/steps"]  # started with the budget unspent: its first cell measured, then cut
    assert first["ok"] and first["thinker_ms_per_token"]["1"] > 0, first
    assert first["code2wav_ms_per_chunk"]["2"] == {"skipped": "the time budget was spent"}, first
    later = [name for name in parts if name != "tiny/steps"]
    assert len(later) == 2 * len(PART_NAMES) - 1 and all("skipped" in parts[name] for name in later), parts
    assert "skipped" in report["table"] and "[tiny/parity] ok" not in done.stdout
    assert "[real-shaped/served] skipped: budget spent" in done.stdout


def test_the_table_of_a_cut_run_says_why_each_cell_is_empty():
    """Rendered from JSON alone: a failed part, a cell that errored and a skipped part read as such."""
    results = {
        "torch": "2.x",
        "device": "cpu only",
        "settings": {
            "checkpoints": {"tiny": "t"},
            "dtype": "float32",
            "batches": [1, 16],
            "concurrencies": [1, 64],
            "budget_s": 480,
            "sizes": {
                "steps": 3,
                "warmup": 1,
                "served": {"input_len": 16, "output_len": 8, "audio_frames": 16, "min_requests": 2},
            },
        },
        "parts": {
            "tiny/steps": {
                "ok": True,
                "seconds": 2.0,
                "thinker_ms_per_token": {"1": 6.7, "16": {"error": "OutOfMemoryError: ..."}},
                "talker_ms_per_frame": {"1": 2.45, "16": 3.72},
                "code2wav_ms_per_chunk": {"1": 18.3, "16": {"skipped": "the time budget was spent"}},
            },
            "tiny/parity": {"ok": False, "error": "RuntimeError: no", "seconds": 1.0},
            "tiny/served": {"ok": False, "skipped": "the 480 s budget was spent", "seconds": 0.0},
        },
    }
    table = render(results)
    lines = {line.split("|")[2].strip(): line for line in table.splitlines() if line.startswith("| tiny")}
    assert "| 6.7 | error |  |" in lines["thinker ms/token (decode), batch"]
    assert "| 18.3 | skipped |  |" in lines["Code2Wav ms/chunk (25 frames), batch"]
    assert "| skipped | skipped | skipped |" in lines["RTF via `omnistream up` (mean), concurrency"]
    assert "| error |" in lines["parity vs transformers (float32)"]
    assert errors(results["parts"]) == ["tiny/steps/thinker_ms_per_token/16", "tiny/parity"]
