"""Stage service flags: --cuda-graphs belongs to the talker and is refused off CUDA before loading."""

from __future__ import annotations

import asyncio

import pytest

from omnistream.cli import build_parser
from services import serve, serve_args


def _parse(*argv: str):
    return build_parser().parse_args(["serve", *argv, "--model", "unused"])


def test_cuda_graphs_is_a_talker_flag_and_off_by_default():
    assert _parse("talker").cuda_graphs is False
    assert _parse("talker", "--cuda-graphs").cuda_graphs is True
    for stage in ("thinker", "code2wav"):
        with pytest.raises(SystemExit):
            _parse(stage, "--cuda-graphs")


def test_cuda_graphs_refused_off_cuda():
    assert serve_args.load_options_refusal(_parse("talker")) is None
    assert serve_args.load_options_refusal(_parse("talker", "--cuda-graphs", "--device", "cuda:0")) is None
    refusal = serve_args.load_options_refusal(_parse("talker", "--cuda-graphs"))
    assert refusal is not None and "--cuda-graphs needs a CUDA --device" in refusal and "'cpu'" in refusal


def test_serve_exits_before_loading_when_refused(capsys):
    # "unused" is no checkpoint: reaching the loader would raise instead of returning 2.
    assert asyncio.run(serve.serve(_parse("talker", "--cuda-graphs"))) == 2
    assert "omnistream serve talker: --cuda-graphs needs a CUDA --device" in capsys.readouterr().err


def test_static_frames_is_a_talker_flag_and_off_by_default():
    assert _parse("talker").static_frames is False
    assert _parse("talker", "--static-frames").static_frames is True
    assert serve_args.load_options_refusal(_parse("talker", "--static-frames")) is None  # CPU too
    for stage in ("thinker", "code2wav"):
        with pytest.raises(SystemExit):
            _parse(stage, "--static-frames")
