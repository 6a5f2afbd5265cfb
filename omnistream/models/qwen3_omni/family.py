"""Qwen3-Omni as a `ModelFamily`: the one place the rest of omnistream reaches this model through.

The stage engines under services/<stage>/engine.py are this family's engines (their forward code
calls Qwen3-Omni submodules); they are built here, so callers never name them to get one. Nothing
heavy is imported at module level: the gateway imports this (for voices) without torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnistream.engine.load_options import ThinkerLoadSettings, is_accelerator
from omnistream.engine.settings import (
    STAGE_SETTINGS,
    Code2WavEngineSettings,
    EngineSettings,
    PrefixCacheSettings,
    TalkerEngineSettings,
    ThinkerEngineSettings,
)
from omnistream.models.family import STAGES, ModelFamily, ModelInfo
from omnistream.models.qwen3_omni.constants import (
    CODEBOOK_SIZE,
    DEFAULT_SPEAKER,
    MODEL_TYPE,
    NUM_CODEBOOKS,
    SAMPLE_RATE,
    TALKER_LENGTH_FACTOR,
    UPSAMPLE_RATES,
    UPSAMPLING_RATIOS,
    VOICES,
)

if TYPE_CHECKING:
    from omnistream.engine.api import FrameShipping, StageEngine
    from omnistream.request.chunk_plan import ChunkPlan

# The prompt content the thinker takes: text, and decoded audio, images and video (with its sound).
INPUT_MODALITIES = ("text", "audio", "image", "video")
# The thinker's engines: ours, and vLLM's (text only, thinker/vllm_engine.py).
BACKENDS = ("transformers", "vllm")


def _check_backend(stage: str, settings: EngineSettings) -> None:
    """A thinker backend that does not exist, or vLLM asked of another stage: refused by name."""
    if isinstance(settings, ThinkerLoadSettings):
        if settings.backend not in BACKENDS:
            raise ValueError(f"unknown backend {settings.backend!r}; backends are {BACKENDS}")
        if settings.backend == "vllm" and stage != "thinker":
            raise ValueError(f"the vllm backend serves the thinker only, not the {stage}")


def _check_fits(config: Any, stage: str, settings: EngineSettings) -> None:
    """Refuse (InvalidRequest, with the numbers) a stage its device's free memory cannot hold."""
    from omnistream.models.qwen3_omni.memory import check_stage_fits

    vllm = isinstance(settings, ThinkerEngineSettings) and settings.backend == "vllm"  # vLLM's own cache
    prefix = settings.prefix_cache_bytes if isinstance(settings, PrefixCacheSettings) and not vllm else 0
    check_stage_fits(
        config, stage, settings, settings.max_batch, settings.max_model_len, prefix, settings.request_limit
    )


class Qwen3OmniFamily:
    name = "qwen3_omni"

    def detect(self, config: Mapping[str, Any]) -> bool:
        return config.get("model_type") == MODEL_TYPE

    def describe(self, config: Mapping[str, Any]) -> ModelInfo:
        talker = config.get("talker_config") or {}
        code2wav = config.get("code2wav_config") or {}
        speakers = talker.get("speaker_id") or {}
        voices = tuple(sorted(k.lower() for k in speakers)) or VOICES
        rates = code2wav.get("upsample_rates") or UPSAMPLE_RATES
        ratios = code2wav.get("upsampling_ratios") or UPSAMPLING_RATIOS
        return ModelInfo(
            family=self.name,
            model_type=str(config.get("model_type", MODEL_TYPE)),
            sample_rate=SAMPLE_RATE,  # not in the config: Code2Wav's decoder is built for 24 kHz
            codebooks=int(code2wav.get("num_quantizers", NUM_CODEBOOKS)),
            codebook_size=int(code2wav.get("codebook_size", CODEBOOK_SIZE)),
            samples_per_frame=math.prod(rates) * math.prod(ratios),
            voices=voices,
            default_voice=DEFAULT_SPEAKER if DEFAULT_SPEAKER in voices else voices[0],
            talker_codebooks=int(talker.get("num_code_groups", NUM_CODEBOOKS)),
            input_modalities=INPUT_MODALITIES,
        )

    def load_config(self, model_dir: str | Path) -> Any:
        from omnistream.models.qwen3_omni.checkpoint import load_config

        return load_config(model_dir)

    def load_tokenizer(self, model_dir: str | Path) -> Any:
        from omnistream.models.qwen3_omni.checkpoint import load_tokenizer

        return load_tokenizer(model_dir)

    def engine(self, stage: str, model_dir: str | Path, settings: EngineSettings) -> StageEngine:
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages are {STAGES}")
        _check_backend(stage, settings)
        expected = STAGE_SETTINGS[stage]
        if not isinstance(settings, expected):
            raise TypeError(f"the {stage} takes {expected.__name__}, got {type(settings).__name__}")
        if is_accelerator(settings.device):
            # Before any weight is read: a stage that cannot fit its device says so, with the numbers.
            _check_fits(self.load_config(model_dir), stage, settings)
        if isinstance(settings, ThinkerEngineSettings) and settings.backend == "vllm":
            from omnistream.models.qwen3_omni.thinker.vllm_engine import VllmThinkerEngine

            return VllmThinkerEngine(str(model_dir), settings)
        if isinstance(settings, ThinkerEngineSettings):
            from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine

            return ThinkerEngine(str(model_dir), settings)
        if isinstance(settings, TalkerEngineSettings):
            from omnistream.models.qwen3_omni.talker.engine import TalkerEngine

            # Its codec frames outnumber the thinker's tokens: its context is the thinker's, scaled.
            length = settings.max_model_len * TALKER_LENGTH_FACTOR
            return TalkerEngine(str(model_dir), dataclasses.replace(settings, max_model_len=length))
        from omnistream.models.qwen3_omni.code2wav.engine import Code2WavEngine

        assert isinstance(settings, Code2WavEngineSettings)  # (the check above: STAGE_SETTINGS)
        return Code2WavEngine(str(model_dir), settings)

    async def warm_up(self, stage: str, engine: StageEngine) -> None:
        from omnistream.models.qwen3_omni.warmup import WARMERS

        await WARMERS[stage](engine)

    async def probe_speed(self, stage: str, engine: StageEngine) -> None:
        from omnistream.models.qwen3_omni.warmup import PROBES

        probe = PROBES.get(stage)
        if probe is not None:
            await probe(engine)

    def random_prompts(
        self, config: Any, tokenizer: Any, count: int, input_len: int, seed: int = 0
    ) -> list[list[int]]:
        from omnistream.models.qwen3_omni.random_prompts import random_prompts

        return random_prompts(config, tokenizer, count, input_len, seed)

    def talker_rows(self, positions: Sequence[int], rows: Any) -> Mapping[int, Any]:
        from omnistream.models.qwen3_omni.talker.deep_rows import DeepRows

        return DeepRows(positions, rows)

    def frame_shipper(self, plan: ChunkPlan, lookahead: int = 0) -> FrameShipping:
        from omnistream.models.qwen3_omni.codec_chunks import FrameShipper

        return FrameShipper(plan, lookahead=lookahead)

    def make_tiny(self, directory: str | Path, **options: Any) -> Path:
        from omnistream.models.qwen3_omni.tiny import make_tiny_model

        return make_tiny_model(directory, **options)

    def tiny_is_current(self, directory: str | Path) -> bool:
        from omnistream.models.qwen3_omni.tiny import is_current

        return is_current(directory)


FAMILY: ModelFamily = Qwen3OmniFamily()  # annotated: a type checker holds the class to the interface
