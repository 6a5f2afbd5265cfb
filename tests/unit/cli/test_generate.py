"""`omnistream generate` (what `make generate` runs): streams text and writes the four artefacts."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from omnistream.audio.wav import read_float32_wav


def test_generate_streams_text_and_writes_files(tiny_model_dir, tmp_path):
    out = tmp_path / "gen"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "omnistream.cli.main",
            "generate",
            "--model",
            tiny_model_dir,
            "--prompt",
            "Hello there",
            "--max-tokens",
            "12",
            "--max-audio-frames",
            "30",
            "--mode",
            "sequential",
            "--output-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = (out / "text.txt").read_text(encoding="utf-8")
    assert proc.stdout.strip() == text.strip()
    assert "time to first token" in proc.stderr and "time to first audio" in proc.stderr
    tokens = json.loads((out / "tokens.json").read_text())
    assert tokens["prompt_ids"] and 1 <= len(tokens["output_ids"]) <= 12
    codes = np.load(out / "codes.npy")
    assert codes.shape[0] == 16 and 1 <= codes.shape[1] <= 30
    audio, rate = read_float32_wav(out / "audio.wav")
    assert rate == 24000 and audio.dtype == np.float32
    assert audio.size == codes.shape[1] * 1920 - 555  # the exact length of a full decode
    assert 0 < float(np.sqrt(np.mean(audio**2))) < 1
