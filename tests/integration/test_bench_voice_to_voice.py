"""Smoke test of `omnistream bench --voice-to-voice` (omnistream/bench/voice_to_voice.py): a ~1 s
utterance, one session, one turn in each mode against the session's stages, every time reported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.conftest import gateway_process, gateway_url


@pytest.mark.timeout(120)
def test_voice_to_voice_bench_times_both_modes(stages, tmp_path):
    out = tmp_path / "v2v"
    with gateway_process(stages) as gateway:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "omnistream.cli.main",
                "bench",
                "--voice-to-voice",
                "--gateway",
                gateway_url(gateway),
                "--v2v-seconds",
                "1",
                "--v2v-sessions",
                "1",
                "--v2v-turns",
                "1",
                "--output-dir",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=100,
        )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    cells = {c["mode"]: c for c in json.loads((out / "voice_to_voice.json").read_text())["cells"]}
    assert set(cells) == {"server_vad", "commit"}
    for mode, cell in cells.items():
        assert cell["failed"] == 0 and 0.5 < cell["speech_s"] < 1.5, cell
        (turn,) = cell["per_turn"]
        assert turn["v2v_ms"] > 0, (mode, turn)
        assert turn["first_chunk_ms"] is not None and turn["first_chunk_ms"] >= 80, (mode, turn)  # a frame
    vad = cells["server_vad"]["per_turn"][0]
    # the detector waits out its 500 ms window of silence before it decides
    assert vad["detector_ms"] > 0 and vad["after_detector_ms"] == pytest.approx(
        vad["v2v_ms"] - vad["detector_ms"]
    )
    assert cells["commit"]["per_turn"][0]["detector_ms"] is None
    assert "| server_vad 500 ms | " in (out / "voice_to_voice.md").read_text()
