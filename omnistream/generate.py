"""`omnistream generate`: one request through the in-process pipeline, streamed to the terminal."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from omnistream.load_options import LoadOptions
from omnistream.pipeline import GenerationRequest, Pipeline, collect
from omnistream.sampling import SamplingParams
from omnistream.wav import write_float32_wav


def request_from_args(args: argparse.Namespace) -> GenerationRequest:
    messages = [{"role": "user", "content": args.prompt}]
    if args.system:
        messages.insert(0, {"role": "system", "content": args.system})
    return GenerationRequest(
        messages=messages,
        max_tokens=args.max_tokens,
        ignore_eos=args.ignore_eos,
        sampling=SamplingParams(args.temperature, args.top_p, args.top_k, 1.0, args.seed).validate(),
        return_audio=not args.no_audio,
        speaker=args.speaker,
        max_audio_frames=args.max_audio_frames,
        talker_sampling=SamplingParams(
            args.talker_temperature,
            args.talker_top_p,
            args.talker_top_k if args.talker_temperature else 0,
            args.talker_repetition_penalty,
            args.seed,
        ).validate("talker_"),
        initial_codec_chunk_frames=args.initial_codec_chunk_frames,
        mode=args.mode,
    )


async def run_generate(args: argparse.Namespace) -> int:
    request = request_from_args(args)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)

    def stream(delta: str) -> None:
        sys.stdout.write(delta)
        sys.stdout.flush()

    with Pipeline(args.model, LoadOptions(args.device, args.dtype)) as pipeline:
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
