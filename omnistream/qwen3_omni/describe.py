"""The Qwen3-Omni facts a stage reports in its Info, read from the checkpoint's config.

One place reads them, so the three stages (and any tool) agree on what "the model" is. It takes the
config as a plain mapping (config.json, or `PretrainedConfig.to_dict()`), so it needs no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omnistream.qwen3_omni.chunk_plan import SAMPLE_RATE

FAMILY = "qwen3_omni"
# The prompt content kinds the thinker service turns into ids today (audio, image and video are the
# model's, not yet the service's).
INPUT_MODALITIES = ("text",)


@dataclass(frozen=True)
class ModelFacts:
    family: str
    voices: tuple[str, ...]  # lowercase, sorted
    sample_rate: int
    talker_codebooks: int  # code groups the talker generates per frame
    decoder_codebooks: int  # quantizers Code2Wav decodes per frame; equal in a sound checkpoint
    samples_per_frame: int

    @property
    def frames_per_second(self) -> float:
        return self.sample_rate / self.samples_per_frame


def describe(config: Mapping[str, Any]) -> ModelFacts:
    """The facts of a Qwen3-Omni checkpoint config.

    The sample rate is not in the config: Code2Wav's output rate is fixed by the model (24 kHz).
    Samples per frame is the decoder's total upsampling, as transformers' Code2Wav computes it.
    """
    talker = config.get("talker_config") or {}
    code2wav = config.get("code2wav_config") or {}
    upsampling = [*code2wav.get("upsample_rates", ()), *code2wav.get("upsampling_ratios", ())]
    if not upsampling:
        raise ValueError("the checkpoint config has no code2wav upsampling rates")
    return ModelFacts(
        family=FAMILY,
        voices=tuple(sorted(k.lower() for k in talker.get("speaker_id") or {})),
        sample_rate=SAMPLE_RATE,
        talker_codebooks=int(talker.get("num_code_groups") or 0),
        decoder_codebooks=int(code2wav.get("num_quantizers") or 0),
        samples_per_frame=math.prod(int(r) for r in upsampling),
    )
