"""`omnistream generate`: one request through the in-process pipeline, streamed to the terminal."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from omnistream.audio.wav import write_float32_wav
from omnistream.cli.media import MEDIA_FLAGS, decode_media, encoded_parts, media_parts, user_content
from omnistream.engine.settings import EngineSettings
from omnistream.models.family import model_info
from omnistream.pipeline import GenerationRequest, Pipeline, collect
from omnistream.request.defaults import RequestInput, ServingDefaults, resolve
from omnistream.request.errors import InvalidRequest
from omnistream.service.device_flags import stage_devices
from omnistream.service.settings import build


def checkpoint_serving(model_dir: str | Path) -> ServingDefaults:
    """The built-in serving values with the checkpoint's voices and default voice (what its talker
    reports to a gateway in its Info), so a request gets the same voice here as through the gateway;
    neither known when config.json is not readable (the talker then speaks its default)."""
    try:
        info = model_info(model_dir)
    except InvalidRequest:
        return ServingDefaults()
    return ServingDefaults(voices=info.voices, voice=info.default_voice)


def request_input_from_args(args: argparse.Namespace) -> RequestInput:
    """The flags as given: argparse defaults are None, so what the user left out stays "not given".
    Media files are still encoded here (`run_generate` decodes them, as the gateway would)."""
    parts = encoded_parts(media_parts(args)) if any(getattr(args, k, None) for k in MEDIA_FLAGS) else []
    return RequestInput(
        messages=[{"role": "user", "content": user_content(args.prompt, parts)}],
        system=args.system,
        max_tokens=args.max_tokens,
        ignore_eos=args.ignore_eos,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        return_audio=None if args.no_audio is None else not args.no_audio,
        voice=args.speaker,
        max_audio_frames=args.max_audio_frames,
        talker_temperature=args.talker_temperature,
        talker_top_p=args.talker_top_p,
        talker_top_k=args.talker_top_k,
        talker_repetition_penalty=args.talker_repetition_penalty,
        talker_seed=args.talker_seed,
        initial_codec_chunk_frames=args.initial_codec_chunk_frames,
        codec_chunk_schedule=args.codec_chunk_schedule,
        async_chunk=None if args.mode is None else args.mode == "async",
    )


def request_from_args(
    args: argparse.Namespace, deployment: ServingDefaults | None = None
) -> GenerationRequest:
    """The request the flags ask for, defaults from the one table the gateway also uses."""
    if deployment is None:
        deployment = checkpoint_serving(args.model)
    return resolve(request_input_from_args(args), deployment)


async def run_generate(args: argparse.Namespace) -> int:
    request = request_from_args(args)
    await decode_media(request.messages, request.use_audio_in_video)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)

    def stream(delta: str) -> None:
        sys.stdout.write(delta)
        sys.stdout.flush()

    settings = build(EngineSettings, args)  # --device, --dtype, --allow-float64; the rest: serve's defaults
    with Pipeline(args.model, settings, devices=stage_devices(args)) as pipeline:
        result = await collect(pipeline, request, on_text=stream)
    done, wav = result.done, result.audio
    sys.stdout.write("\n")
    (out / "text.txt").write_text(result.text, encoding="utf-8")
    (out / "tokens.json").write_text(
        json.dumps({"prompt_ids": done.prompt_ids, "output_ids": done.output_ids})
    )
    np.save(out / "codes.npy", result.codes)
    sample_rate = pipeline.code2wav.sample_rate
    write_float32_wav(out / "audio.wav", wav, sample_rate)
    ttfp = f"{done.ttfp * 1000:.1f} ms" if done.ttfp is not None else "n/a"
    ttft = f"{done.ttft * 1000:.1f} ms" if done.ttft is not None else "n/a"
    print(
        f"[{request.mode}] time to first token {ttft}, time to first audio {ttfp}, total "
        f"{done.e2e * 1000:.1f} ms; {len(done.output_ids)} tokens ({done.finish_reason}), "
        f"{done.frames} frames, "
        f"{wav.size / sample_rate:.2f} s of audio -> {out}",
        file=sys.stderr,
    )
    return 0
