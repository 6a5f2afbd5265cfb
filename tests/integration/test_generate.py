"""`omnistream generate` (what `make generate` runs): streams text and writes the four artefacts;
takes media files as `omnistream chat` does; `--system ""` means no system turn.

An integration test (it was tests/unit/cli/): each runs the command as a user does, a process that
loads the three engines and generates (30-60 s a test on the 2-core machine under load)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

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


def _generate(model_dir: str, out, *flags: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "omnistream.cli", "generate", "--model", model_dir]
    args += ["--output-dir", str(out), "--max-tokens", "8", "--max-audio-frames", "12", *flags]
    # Seeded: unseeded, the tiny checkpoint's talker now and then samples the end of speech at once.
    args += ["--seed", "3"]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def plain_prompt_ids(tiny_model_dir, tmp_path_factory) -> list[int]:
    """The prompt ids of the text-only run the media runs are compared with (one run for both)."""
    out = tmp_path_factory.mktemp("plain")
    done = _generate(tiny_model_dir, out, "--prompt", "What is this?")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((out / "tokens.json").read_text())["prompt_ids"]


@pytest.mark.parametrize("kind", ["image", "audio"])
def test_generate_takes_media_files_and_writes_text_and_audio(
    tiny_model_dir, tmp_path, kind, plain_prompt_ids
):
    """`--image/--audio FILE` as `omnistream chat` takes them: the file is decoded as the gateway
    would, its placeholder tokens are in the prompt, and the same four files are written."""
    from tests.media_files import audio_file, image_file

    path = tmp_path / ("in.png" if kind == "image" else "in.wav")
    path.write_bytes(image_file() if kind == "image" else audio_file("wav", seconds=0.5))
    done = _generate(tiny_model_dir, tmp_path / "out", "--prompt", "What is this?", f"--{kind}", str(path))
    assert done.returncode == 0, done.stderr[-2000:]
    out = tmp_path / "out"
    assert (out / "text.txt").read_text(encoding="utf-8").strip() == done.stdout.strip()
    prompt = json.loads((out / "tokens.json").read_text())["prompt_ids"]
    config = json.loads((Path(tiny_model_dir) / "config.json").read_text())["thinker_config"]
    placeholder = config["image_token_id" if kind == "image" else "audio_token_id"]
    assert prompt.count(placeholder) > 0
    assert len(prompt) > len(plain_prompt_ids)
    audio, rate = read_float32_wav(out / "audio.wav")
    assert rate == 24000 and audio.size > 0 and np.load(out / "codes.npy").shape[1] == 12


def test_generate_refuses_an_unreadable_media_file_with_a_clear_error(tiny_model_dir, tmp_path):
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    done = _generate(tiny_model_dir, tmp_path / "out", "--prompt", "hi", "--audio", str(empty))
    assert done.returncode == 2
    error = json.loads(done.stderr.strip().splitlines()[-1])["error"]
    assert error["field"] == "--audio[0].data" and "empty" in error["message"]


def _prompt_tokens(tiny_model_dir: str, *flags: str) -> int:
    from omnistream.cli.generate import request_from_args
    from omnistream.cli.main import build_parser
    from omnistream.models.family import family_for

    args = build_parser().parse_args(
        ["generate", "--model", tiny_model_dir, "--prompt", "Hello there", "--output-dir", "x", *flags]
    )
    messages = request_from_args(args).messages
    tokenizer = family_for(tiny_model_dir).load_tokenizer(tiny_model_dir)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_an_empty_system_flag_means_no_system_turn(tiny_model_dir):
    """`--system ""` is "no system prompt": the prompt of no flag at all, not an empty system turn
    (which costs its framing tokens: 5 more with the ChatML template)."""
    none = _prompt_tokens(tiny_model_dir)
    assert _prompt_tokens(tiny_model_dir, "--system", "") == none
    assert _prompt_tokens(tiny_model_dir, "--system", "Be brief.") > none + 5


def test_chat_starts_without_a_system_turn_for_an_empty_system_flag():
    from omnistream.cli.chat import system_turns

    assert system_turns("") == [] and system_turns(None) == []
    assert system_turns("Be brief.") == [{"role": "system", "content": "Be brief."}]
