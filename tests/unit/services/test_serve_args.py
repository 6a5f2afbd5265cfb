"""Stage service flags: --cuda-graphs belongs to the talker and Code2Wav, is on by default for CUDA
only and is refused off CUDA before loading;
the per-step scheduling flags belong to the talker and Code2Wav."""

from __future__ import annotations

import asyncio

import pytest

from omnistream.cli.main import build_parser
from omnistream.engine.playout import DEFAULT_FIRST_AUDIO_TARGET_S
from omnistream.engine.settings import STAGE_SETTINGS, AudioScheduleSettings
from omnistream.request.chunk_plan import DEFAULT_CODE2WAV_STEP_FRAMES
from omnistream.service.settings import build
from services import serve, serve_args


def _parse(*argv: str):
    return build_parser().parse_args(["serve", *argv, "--model", "unused"])


def _settings(stage: str, *argv: str):
    """The stage engine's settings as `serve` builds them from these flags."""
    return build(STAGE_SETTINGS[stage], _parse(stage, *argv))


@pytest.mark.parametrize("stage", ["talker", "code2wav"])
def test_cuda_graphs_is_a_talker_and_code2wav_flag_on_by_default_for_cuda_only(stage):
    from omnistream.engine.load_options import LoadOptions
    from omnistream.engine.settings import Code2WavEngineSettings, derive

    assert _parse(stage).cuda_graphs is None  # not asked: decided by the device
    assert _parse(stage, "--cuda-graphs").cuda_graphs is True
    assert _parse(stage, "--no-cuda-graphs").cuda_graphs is False
    assert LoadOptions("cuda:1").graphs and LoadOptions("cuda").graphs
    assert not LoadOptions("cpu").graphs and not LoadOptions("cuda", cuda_graphs=False).graphs
    # The pipeline's and the tools' one LoadOptions flag reaches Code2Wav too.
    assert not derive(Code2WavEngineSettings, LoadOptions("cuda", cuda_graphs=False)).graphs
    assert derive(Code2WavEngineSettings, LoadOptions("cuda:0")).graphs
    with pytest.raises(SystemExit):
        _parse("thinker", "--cuda-graphs")


@pytest.mark.parametrize("stage", ["talker", "code2wav"])
def test_cuda_graphs_refused_off_cuda(stage):
    assert serve_args.load_options_refusal(_settings(stage)) is None
    assert serve_args.load_options_refusal(_settings(stage, "--no-cuda-graphs")) is None
    assert serve_args.load_options_refusal(_settings(stage, "--cuda-graphs", "--device", "cuda:0")) is None
    refusal = serve_args.load_options_refusal(_settings(stage, "--cuda-graphs"))
    assert refusal is not None and "--cuda-graphs needs a CUDA --device" in refusal and "'cpu'" in refusal


@pytest.mark.parametrize("stage", ["thinker", "talker"])
def test_experts_refused_where_they_cannot_run(stage):
    assert serve_args.load_options_refusal(_settings(stage, "--experts", "fixed")) is None
    assert serve_args.load_options_refusal(_settings(stage, "--experts", "grouped_mm")) is None
    refusal = serve_args.load_options_refusal(
        _settings(stage, "--experts", "grouped_mm", "--dtype", "float64")
    )
    assert refusal is not None and "does not run float64" in refusal
    if stage == "thinker":
        refusal = serve_args.load_options_refusal(_settings(stage, "--experts", "fixed", "--backend", "vllm"))
        assert refusal is not None and "vLLM brings its own" in refusal
        assert serve_args.load_options_refusal(_settings(stage, "--backend", "vllm")) is None


def test_serve_exits_before_loading_when_refused(capsys):
    # "unused" is no checkpoint: reaching the loader would raise instead of returning 2.
    assert asyncio.run(serve.serve(_parse("talker", "--cuda-graphs"))) == 2
    assert "omnistream serve talker: --cuda-graphs needs a CUDA --device" in capsys.readouterr().err


def test_scheduling_flags_belong_to_the_audio_stages_with_their_defaults():
    talker = _parse("talker")
    assert (talker.max_step_batch, talker.first_audio_target) == (None, DEFAULT_FIRST_AUDIO_TARGET_S)
    code2wav = _parse("code2wav")
    # Code2Wav's steps are bounded by default: an urgent window waits behind at most one of them.
    assert code2wav.max_step_frames == DEFAULT_CODE2WAV_STEP_FRAMES == 100
    assert code2wav.first_audio_target == DEFAULT_FIRST_AUDIO_TARGET_S
    talker_settings = _settings("talker")
    assert (talker_settings.max_step_batch, talker_settings.first_audio_target) == (
        None,
        DEFAULT_FIRST_AUDIO_TARGET_S,
    )
    code2wav_settings = _settings("code2wav", "--max-step-frames", "50")
    assert (code2wav_settings.max_step_frames, code2wav_settings.first_audio_target) == (
        50,
        DEFAULT_FIRST_AUDIO_TARGET_S,
    )
    assert not isinstance(_settings("thinker"), AudioScheduleSettings)  # no per-step audio schedule
    assert _parse("talker", "--max-step-batch", "2", "--first-audio-target", "0").max_step_batch == 2
    for stage, flag in (
        ("thinker", "--max-step-batch"),
        ("code2wav", "--max-step-batch"),
        ("thinker", "--max-step-frames"),
        ("talker", "--max-step-frames"),
        ("thinker", "--first-audio-target"),
    ):
        with pytest.raises(SystemExit):
            _parse(stage, flag, "1")
    for stage, flag, value in (
        ("talker", "--max-step-batch", "0"),
        ("code2wav", "--max-step-frames", "0"),
        ("talker", "--first-audio-target", "-1"),
        ("code2wav", "--first-audio-target", "nan"),
    ):
        with pytest.raises(SystemExit):
            _parse(stage, flag, value)


def test_a_step_batch_above_the_batch_is_refused_before_loading():
    assert (
        serve_args.load_options_refusal(_settings("talker", "--max-batch", "4", "--max-step-batch", "4"))
        is None
    )
    refusal = serve_args.load_options_refusal(
        _settings("talker", "--max-batch", "4", "--max-step-batch", "5")
    )
    assert refusal == "--max-step-batch 5 exceeds --max-batch 4"


def test_static_frames_is_a_talker_flag_and_on_by_default():
    assert _parse("talker").static_frames is True
    assert _parse("talker", "--no-static-frames").static_frames is False
    assert serve_args.load_options_refusal(_settings("talker", "--static-frames")) is None  # CPU too
    for stage in ("thinker", "code2wav"):
        with pytest.raises(SystemExit):
            _parse(stage, "--static-frames")


SHARED_FLAGS = {
    "--model", "--served-model-name", "--device", "--dtype", "--allow-float64", "--host", "--port",
    "--metrics-host", "--metrics-port", "--max-batch", "--max-model-len", "--prefill-chunk",
    "--max-requests", "--max-message-bytes", "--grace-seconds", "--threads", "--nice", "--tls-cert",
    "--tls-key", "--tls-client-ca", "--otlp-traces-endpoint",
}  # fmt: skip
STAGE_FLAGS = {
    "thinker": {"--backend", "--vllm-load", "--prefix-cache-gib", "--experts"},
    "talker": {
        "--max-step-batch", "--first-audio-target", "--cuda-graphs", "--no-cuda-graphs",
        "--static-frames", "--no-static-frames", "--prefix-cache-gib", "--experts",
    },
    "code2wav": {"--max-step-frames", "--first-audio-target", "--cuda-graphs", "--no-cuda-graphs"},
}  # fmt: skip


@pytest.mark.parametrize("stage", ["thinker", "talker", "code2wav"])
def test_the_generated_stage_flags_keep_their_names_and_defaults(stage, monkeypatch):
    """deploy/, `omnistream up` and the README use these names: generating them from the settings
    dataclasses kept every one, and the values a stage reads when none is given."""
    from omnistream.cli.main import build_parser
    from omnistream.wire.limits import MAX_MESSAGE_BYTES

    serve_parser = build_parser()._subparsers._group_actions[0].choices["serve"]
    parser = serve_parser._subparsers._group_actions[0].choices[stage]
    flags = {f for action in parser._actions for f in action.option_strings} - {"-h", "--help"}
    assert flags == SHARED_FLAGS | STAGE_FLAGS[stage]
    args = _parse(stage)
    assert (args.served_model_name, args.device, args.host, args.port, args.max_batch) == (
        "qwen3-omni",
        "cpu",
        "127.0.0.1",
        0,
        16,
    )
    assert (args.max_model_len, args.max_requests, args.max_message_bytes, args.grace_seconds) == (
        4096,
        None,
        MAX_MESSAGE_BYTES,
        30.0,
    )
    assert (args.threads, args.nice, args.tls_cert) == (1, 0, None)
    if stage == "thinker":
        assert (args.backend, args.vllm_load) == ("transformers", "auto")
    if stage in ("thinker", "talker"):
        assert args.experts == "auto"
        assert args.prefix_cache_gib is None
        assert _settings(stage).prefix_cache_bytes is None  # the engine's default
        given = build_parser().parse_args(["serve", stage, "--model", "m", "--prefix-cache-gib", "0.5"])
        assert build(STAGE_SETTINGS[stage], given).prefix_cache_bytes == 1 << 29
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", stage, "--model", "m", "--prefix-cache-gib", "-1"])
    monkeypatch.setenv(serve_args.MODEL_ENV, "/ckpt")
    assert (
        build_parser().parse_args(["serve", stage]).model == "/ckpt"
    )  # the checkpoint from $OMNISTREAM_MODEL
    monkeypatch.delenv(serve_args.MODEL_ENV)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", stage])  # no $OMNISTREAM_MODEL: --model is required
