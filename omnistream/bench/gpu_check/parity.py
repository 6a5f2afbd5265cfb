"""The pipeline check of tools/gpu-check: the in-process pipeline and transformers' `generate` on one
device, greedy, the same prompt ids; tokens and codes must be equal, the audio close.

Moved out of the tool so that `--all` runs the very same check on each checkpoint (and the test
suite runs it on the CPU) instead of a second copy of it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from omnistream.engine.load_options import LoadOptions

if TYPE_CHECKING:
    from omnistream.pipeline import GenerationRequest, GenerationResult
    from omnistream.request.sampling_params import SamplingParams

PROMPTS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Hello, how are you?"}],
    [{"role": "user", "content": "Tell me a story about the sea."}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "caf\u00e9 na\u00efve \u4f60\u597d, and tomorrow?"},
    ],
]
MAX_TOKENS = 24
MAX_FRAMES = 40


@dataclass(frozen=True)
class ParitySizes:
    """How much the check generates: the first `prompts` of PROMPTS, each to `max_tokens` and
    `max_frames`, and `concurrency` requests at once for batch invariance."""

    prompts: int = len(PROMPTS)
    max_tokens: int = MAX_TOKENS
    max_frames: int = MAX_FRAMES
    concurrency: int = 8


@dataclass
class PipelineRuns:
    """The pipeline's side: each prompt alone, its one-shot Code2Wav decode (when asked) and what the
    batched run found (JSON-ready `summary`)."""

    solo: list[GenerationResult]
    summary: dict[str, Any]
    full_decodes: list[np.ndarray] = field(default_factory=list)


Reference = tuple[list[int], np.ndarray, np.ndarray]  # tokens, codes [codebooks, T], audio


def greedy() -> SamplingParams:
    """Greedy sampling (the default params): the only mode two implementations can agree on exactly."""
    from omnistream.request.sampling_params import SamplingParams

    return SamplingParams()


def request(messages: list[dict[str, Any]], sizes: ParitySizes, **kw: Any) -> GenerationRequest:
    """One greedy request of the check (text and voice greedy, small first codec chunk)."""
    from omnistream.pipeline import GenerationRequest

    return GenerationRequest(
        messages=messages,
        max_tokens=sizes.max_tokens,
        max_audio_frames=sizes.max_frames,
        initial_codec_chunk_frames=4,
        sampling=greedy(),
        talker_sampling=greedy(),
        **kw,
    )


def pipeline_runs(
    model: str, options: LoadOptions, sizes: ParitySizes = ParitySizes(), full_decode: bool = False
) -> PipelineRuns:
    """Each prompt alone, then `sizes.concurrency` at once: are the batched answers the solo ones?
    `full_decode`: also decode each solo answer's codes in one shot (the streamed audio's yardstick)."""
    from omnistream.engine.settings import EngineSettings, derive
    from omnistream.pipeline import Pipeline, collect

    prompts = PROMPTS[: sizes.prompts]
    settings = derive(EngineSettings, options, max_batch=max(16, sizes.concurrency))
    with Pipeline(model, settings) as pipeline:
        solo = [asyncio.run(collect(pipeline, request(p, sizes))) for p in prompts]
        full: list[np.ndarray] = []
        if full_decode:
            with torch.no_grad():
                for r in solo:
                    codes = torch.from_numpy(r.codes)[None].to(options.device)
                    wav = pipeline.code2wav.code2wav(codes)  # type: ignore[attr-defined]  # the Qwen3-Omni engine's
                    full.append(wav.reshape(-1).float().cpu().numpy())

        async def together() -> list[GenerationResult]:
            jobs = [
                collect(pipeline, request(prompts[i % len(prompts)], sizes)) for i in range(sizes.concurrency)
            ]
            return list(await asyncio.gather(*jobs))

        started = time.perf_counter()
        batched = asyncio.run(together())
        wall = time.perf_counter() - started
    invariant = all(
        b.output_ids == solo[i % len(prompts)].output_ids
        and np.array_equal(b.codes, solo[i % len(prompts)].codes)
        for i, b in enumerate(batched)
    )
    summary = {
        "tokens": [r.output_ids for r in solo],
        "frames": [int(r.codes.shape[1]) for r in solo],
        "solo_e2e_s": [round(r.done.e2e, 3) for r in solo],
        "solo_ttfp_s": [round(r.done.ttfp or -1, 3) for r in solo],
        "batched": sizes.concurrency,
        "batched_wall_s": round(wall, 3),
        "batch_invariant": invariant,
    }
    return PipelineRuns(solo, summary, full)


def reference_runs(
    model: str,
    device: str,
    dtype: torch.dtype,
    solo: list[GenerationResult],
    sizes: ParitySizes = ParitySizes(),
) -> list[Reference]:
    """transformers' `generate` on the exact prompt ids the pipeline ran, greedy, the same lengths;
    the codes are those its Code2Wav was given (captured), the audio what it returned."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    # The eager experts: transformers' per-expert loop, the reference tests' (tests/reference_runs.py);
    # its default kernel may round a float32 logit otherwise and flip a near tie. Any: transformers'
    # wrapped `.to` and `eval` are untyped; loaded, then moved, as the first GPU run did.
    model_: Any = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        model, dtype=dtype, experts_implementation="eager"
    )
    model_ = model_.to(device).eval()
    captured: list[torch.Tensor] = []
    decode = model_.code2wav.chunked_decode

    def capture(codes: torch.Tensor, *a: Any, **kw: Any) -> Any:
        captured.append(codes.clone())
        return decode(codes, *a, **kw)

    model_.code2wav.chunked_decode = capture
    out: list[Reference] = []
    for result in solo:
        ids = list(result.prompt_ids)
        captured.clear()
        with torch.no_grad():
            sequences, wav = model_.generate(
                torch.tensor([ids], device=device),
                return_audio=True,
                thinker_do_sample=False,
                talker_do_sample=False,
                talker_repetition_penalty=1.0,
                thinker_max_new_tokens=sizes.max_tokens,
                talker_max_new_tokens=sizes.max_frames + 1,
                thinker_eos_token_id=model_.config.im_end_token_id,
            )
        out.append(
            (
                sequences[0, len(ids) :].tolist(),
                captured[0][0].cpu().numpy(),
                wav.reshape(-1).float().cpu().numpy(),
            )
        )
    return out


def compare(
    reference: list[Reference],
    solo: list[GenerationResult],
    full_decodes: list[np.ndarray] | None = None,
    tokenizer: Any = None,
) -> dict[str, Any]:
    """Per prompt: tokens and codes equal, audio lengths and largest difference; with `full_decodes`,
    how far the streamed audio is from a one-shot decode of the same codes.

    A random checkpoint's answer may hold a tool call (`<tool_call>` is one token of the tiny
    vocabulary), which the talker does not speak by design (omnistream/request/spoken.py) while
    `generate` speaks every token; with `tokenizer`, such an answer's codes are compared on the
    frames before the call (`codes_compared`), the only ones the two make from the same text."""
    rows = []
    for (tokens, codes, wav), result in zip(reference, solo, strict=True):
        frames = _frames_before_call(tokenizer, result.output_ids)
        if frames is None:
            same_codes = codes.shape == result.codes.shape and bool(np.array_equal(codes, result.codes))
        else:
            ours = result.codes[:, :frames]
            same_codes = ours.shape[1] == min(frames, codes.shape[1]) and bool(
                np.array_equal(codes[:, :frames], ours)
            )
        n = min(wav.size, result.audio.size)
        rows.append(
            {
                "tokens_equal": tokens == result.output_ids,
                "codes_equal": same_codes,
                "codes_compared": "all" if frames is None else f"{frames} frames, before a tool call",
                "audio_len": [int(wav.size), int(result.audio.size)],
                "audio_max_abs_diff": float(np.abs(wav[:n] - result.audio[:n]).max()) if n else None,
            }
        )
    report: dict[str, Any] = {"prompts": rows}
    if full_decodes is not None:
        report["streamed_vs_full_decode_max_abs_diff"] = [
            round(float(np.abs(r.audio - full).max()), 6) if full.size == r.audio.size else "length differs"
            for r, full in zip(solo, full_decodes, strict=True)
        ]
    return report


def _frames_before_call(tokenizer: Any, answer: list[int]) -> int | None:
    """The frames the talker makes before an answer's first unspoken token (None: all spoken):
    generated token i is the text row of frame i (omnistream/models/qwen3_omni/talker/prompt.py)."""
    if tokenizer is None:
        return None
    from omnistream.request.spoken import spoken_of

    spoken = spoken_of(tokenizer, answer)
    if spoken == answer:
        return None
    return next((i for i, (a, b) in enumerate(zip(spoken, answer, strict=False)) if a != b), len(spoken))


def check(model: str, device: str, sizes: ParitySizes = ParitySizes()) -> dict[str, Any]:
    """The whole check in float32 (what `--all` records per checkpoint): the pipeline's runs, the
    reference, and the verdict in a few numbers (tokens and codes equal, the largest audio difference,
    batch invariance) beside the per-prompt detail."""
    runs = pipeline_runs(model, LoadOptions(device, "float32"), sizes)
    reference = reference_runs(model, device, torch.float32, runs.solo, sizes)
    from omnistream.models.qwen3_omni.checkpoint import load_tokenizer

    compared = compare(reference, runs.solo, tokenizer=load_tokenizer(model))
    rows = compared["prompts"]
    diffs = [r["audio_max_abs_diff"] for r in rows if r["audio_max_abs_diff"] is not None]
    return {
        "dtype": "float32",
        "prompts": len(rows),
        "tokens_equal": sum(r["tokens_equal"] for r in rows),
        "codes_equal": sum(r["codes_equal"] for r in rows),
        "audio_max_abs_diff": max(diffs) if diffs else None,
        "batch_invariant": runs.summary["batch_invariant"],
        "pipeline": runs.summary,
        "per_prompt": rows,
    }
