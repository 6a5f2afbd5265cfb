"""The model-family boundary: what the services, the pipeline and the CLI may ask of a model.

Everything specific to one model (its checkpoint layout, tiny builder, warm-up inputs, audio
constants, the engines that run its stages) lives in that family's package behind `ModelFamily`.
The gateway and the protos never see a family: stages speak token ids, codec frames and audio on
the wire, so a new family plugs in here and in its own package only.

This module imports no torch: the gateway reads voices through it, and `family_for` picks a family
from config.json alone. A family's own module must keep the same promise at import time and load
its heavy parts inside the methods that need them.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from omnistream.request.errors import InvalidRequest

if TYPE_CHECKING:
    from omnistream.engine.api import FrameShipping, StageEngine
    from omnistream.engine.settings import EngineSettings
    from omnistream.request.chunk_plan import ChunkPlan

# Re-exported: a family builds one engine per stage.
from omnistream.request.stage_chain import STAGES as STAGES

# The one place a family is registered: a module exposing `FAMILY`. Loaded on first use, so a
# family nobody asks for costs nothing.
FAMILY_MODULES: tuple[str, ...] = ("omnistream.models.qwen3_omni.family",)
DEFAULT_FAMILY = "qwen3_omni"  # the family of the built-in tiny checkpoint


@dataclass(frozen=True)
class ModelInfo:
    """What a stage can tell its callers about the model it serves, read from config.json only."""

    family: str
    model_type: str
    sample_rate: int  # Hz of the audio Code2Wav emits
    codebooks: int  # codes per codec frame
    codebook_size: int
    samples_per_frame: int  # audio samples one codec frame decodes to
    voices: tuple[str, ...]  # speaker names the talker accepts, lower case, sorted
    default_voice: str
    talker_codebooks: int  # code groups the talker generates per frame (= codebooks when sound)
    input_modalities: tuple[str, ...] = ("text",)  # prompt content the thinker service takes today

    @property
    def frames_per_second(self) -> float:
        return self.sample_rate / self.samples_per_frame


class ModelFamily(Protocol):
    """What a model family implements. Nothing else in the project is model-specific."""

    name: str

    def detect(self, config: Mapping[str, Any]) -> bool:
        """Does this config.json (as a dict) belong to the family? Must not import torch."""
        ...

    def describe(self, config: Mapping[str, Any]) -> ModelInfo:
        """The facts stages report (sample rate, codebooks, voices), from config.json; no torch."""
        ...

    def load_config(self, model_dir: str | Path) -> Any:
        """The checkpoint's loaded configuration object (what the engines hold as `.config`)."""
        ...

    def load_tokenizer(self, model_dir: str | Path) -> Any:
        """The thinker's tokenizer (chat template included)."""
        ...

    def engine(self, stage: str, model_dir: str | Path, settings: EngineSettings) -> StageEngine:
        """The stage's engine with its weights loaded, built from the stage's settings
        (omnistream/engine/settings.py `STAGE_SETTINGS[stage]`: a `TalkerEngineSettings` for the
        talker, ...; TypeError for another class). `settings.max_model_len` is the thinker's
        context; the family sizes the other stages from it."""
        ...

    async def warm_up(self, stage: str, engine: StageEngine) -> None:
        """Run one tiny request through a started engine, so the first client pays no lazy setup."""
        ...

    async def probe_speed(self, stage: str, engine: StageEngine) -> None:
        """Run batches of a few sizes up to the engine's batch through a warmed engine (a stage
        without a probe returns at once): their steps seed the step-time model that the gateway
        admits audio by (omnistream/service/step_model.py)."""
        ...

    def random_prompts(
        self, config: Any, tokenizer: Any, count: int, input_len: int, seed: int = 0
    ) -> list[list[int]]:
        """`count` chat prompts of exactly `input_len` token ids, random text in the family's chat
        framing (the benchmark's workload); `config` and `tokenizer` as `load_config`/`load_tokenizer`."""
        ...

    def talker_rows(self, positions: Sequence[int], rows: Any) -> Mapping[int, Any]:
        """The thinker's deep hidden rows at the prompt's multimodal positions ([n, H], checked by the
        caller) as the talker's engine takes them: the thinker -> talker edge's own piece."""
        ...

    def frame_shipper(self, plan: ChunkPlan, lookahead: int = 0) -> FrameShipping:
        """The talker's side of the talker -> Code2Wav edge: collects frames, ships them by `plan`
        (+ `lookahead` frames where Code2Wav's decode needs them)."""
        ...

    def make_tiny(self, directory: str | Path, **options: Any) -> Path:
        """Write a small random checkpoint of the family's real architecture into `directory`."""
        ...

    def tiny_is_current(self, directory: str | Path) -> bool:
        """Did this version of `make_tiny` write `directory`? (An older one is rebuilt.)"""
        ...


def families() -> dict[str, ModelFamily]:
    """Every registered family by name."""
    found: dict[str, ModelFamily] = {}
    for module in FAMILY_MODULES:
        family = importlib.import_module(module).FAMILY
        found[family.name] = family
    return found


def family_named(name: str) -> ModelFamily:
    known = families()
    if name not in known:
        raise InvalidRequest(f"unknown model family {name!r}; known: {sorted(known)}", field="family")
    return known[name]


def read_config(model_dir: str | Path) -> dict[str, Any]:
    """A checkpoint's config.json as a plain dict (no transformers involved)."""
    path = Path(model_dir) / "config.json"
    try:
        config: dict[str, Any] = json.loads(path.read_text())
        return config
    except FileNotFoundError:
        raise InvalidRequest(f"{path} does not exist: not a checkpoint directory", field="model") from None
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"{path} is not valid JSON ({exc})", field="model") from None


def family_for_config(config: Mapping[str, Any]) -> ModelFamily:
    """The family whose `detect` accepts this config; refuses a config none of them knows."""
    for family in families().values():
        if family.detect(config):
            return family
    model_type = config.get("model_type")
    raise InvalidRequest(
        f"no model family serves model_type {model_type!r}; known families: {sorted(families())}",
        field="model",
    )


def family_for(model_dir: str | Path) -> ModelFamily:
    """The family of the checkpoint in `model_dir`, chosen by its config.json."""
    return family_for_config(read_config(model_dir))


def model_info(model_dir: str | Path) -> ModelInfo:
    """What a stage serving `model_dir` can report about it (voices, sample rate, codebooks), without
    loading a tensor: config.json and the family's `describe`."""
    config = read_config(model_dir)
    return family_for_config(config).describe(config)


def _config_data(config: Any) -> dict[str, Any]:
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def describe_loaded(config: Any) -> ModelInfo:
    """The ModelInfo of a loaded config object (what an engine holds as `.config`), for a stage's
    Info: the same reading as `model_info`, from the config the stage actually runs."""
    data = _config_data(config)
    return family_for_config(data).describe(data)


def family_of_loaded(config: Any) -> ModelFamily:
    """The family of a loaded config object (what an engine holds as `.config`): the one a
    servicer asks for its edge's pieces."""
    return family_for_config(_config_data(config))
