"""Load one stage of a Hugging Face Qwen3-Omni checkpoint.

Each stage service loads only the weights it runs: a thin `PreTrainedModel` holder exposes just the
submodules of that stage under the checkpoint's own prefixes, so `from_pretrained` reads those
tensors (and applies transformers' own checkpoint conversions) and skips the rest. The same code
loads the embedded tiny checkpoint and the real 30B one.
"""

import logging
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn
from transformers import AutoConfig, AutoTokenizer, PreTrainedConfig
from transformers.conversion_mapping import (
    get_checkpoint_conversion_mapping,
    register_checkpoint_conversion_mapping,
)
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeCode2Wav,
    Qwen3OmniMoePreTrainedModel,
    Qwen3OmniMoeTalkerForConditionalGeneration,
    Qwen3OmniMoeThinkerForConditionalGeneration,
)

from omnistream.engine.load_options import DeviceSettings, LoadOptions
from omnistream.models import moe_experts

log = logging.getLogger(__name__)


class ThinkerWeights(Qwen3OmniMoePreTrainedModel):  # type: ignore[no-untyped-call]  # transformers' __init_subclass__
    """Holds `thinker.*` only."""

    config: Qwen3OmniMoeConfig

    def __init__(self, config: Qwen3OmniMoeConfig) -> None:
        super().__init__(config)
        self.thinker = Qwen3OmniMoeThinkerForConditionalGeneration._from_config(config.thinker_config)  # type: ignore[no-untyped-call]  # transformers: unannotated
        self.post_init()  # type: ignore[no-untyped-call]  # transformers: unannotated


class _ThinkerEmbedding(nn.Module):
    """The thinker's token embedding table, under its checkpoint name `thinker.model.embed_tokens`."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab_size, hidden_size)


class TalkerWeights(Qwen3OmniMoePreTrainedModel):  # type: ignore[no-untyped-call]  # transformers' __init_subclass__
    """Holds `talker.*` plus the thinker's embedding table: with it the talker turns thinker token ids
    into its text rows itself, so the thinker only ships token ids per step."""

    config: Qwen3OmniMoeConfig

    def __init__(self, config: Qwen3OmniMoeConfig) -> None:
        super().__init__(config)
        thinker = config.thinker_config
        # Annotated `dict | PreTrainedConfig | None` for __init__'s argument; __init__ made it a config.
        assert isinstance(thinker, PreTrainedConfig)
        text = thinker.text_config
        self.thinker = _ThinkerEmbedding(text.vocab_size, text.hidden_size)
        self.talker = Qwen3OmniMoeTalkerForConditionalGeneration._from_config(config.talker_config)  # type: ignore[no-untyped-call]  # transformers: unannotated
        self.post_init()  # type: ignore[no-untyped-call]  # transformers: unannotated


class Code2WavWeights(Qwen3OmniMoePreTrainedModel):  # type: ignore[no-untyped-call]  # transformers' __init_subclass__
    """Holds `code2wav.*` only."""

    config: Qwen3OmniMoeConfig

    def __init__(self, config: Qwen3OmniMoeConfig) -> None:
        super().__init__(config)
        self.code2wav = Qwen3OmniMoeCode2Wav._from_config(config.code2wav_config)  # type: ignore[no-untyped-call]  # transformers: unannotated
        self.post_init()  # type: ignore[no-untyped-call]  # transformers: unannotated


STAGE_CLASSES: dict[str, type[Qwen3OmniMoePreTrainedModel]] = {
    "thinker": ThinkerWeights,
    "talker": TalkerWeights,
    "code2wav": Code2WavWeights,
}

_registered = False


def _register_conversions() -> None:
    """Our holder classes live outside transformers, which skips "custom" classes when it looks up
    checkpoint conversions (fused MoE experts, renamed prefixes); register the model's own table."""
    global _registered
    if _registered:
        return
    mapping = get_checkpoint_conversion_mapping("qwen3_omni_moe")  # type: ignore[no-untyped-call]  # transformers: unannotated
    for cls in STAGE_CLASSES.values():
        register_checkpoint_conversion_mapping(cls.__name__, mapping, overwrite=True)
    _registered = True


def load_config(model_dir: str | Path) -> Qwen3OmniMoeConfig:
    config: Qwen3OmniMoeConfig = AutoConfig.from_pretrained(str(model_dir))
    return config


def load_tokenizer(model_dir: str | Path) -> Any:
    """The checkpoint's Hugging Face tokenizer (its class depends on the checkpoint)."""
    return AutoTokenizer.from_pretrained(str(model_dir))


MOE_STAGES = ("thinker", "talker")


def stage_experts(stage: str, model_dir: str | Path, options: DeviceSettings) -> str:
    """The experts implementation `stage` loads with (`--experts`, omnistream/models/moe_experts.py)."""
    moe_experts.register()
    config = load_config(model_dir)
    text = getattr(config, f"{stage}_config").text_config
    dims = (text.hidden_size, text.moe_intermediate_size)
    requested = getattr(options, "experts", "auto")
    return moe_experts.experts_for(requested, torch.device(options.device), options.torch_dtype(), dims)


def load_stage(stage: str, model_dir: str | Path, options: DeviceSettings = LoadOptions()) -> Any:
    """Return the stage's holder module (eval mode, on the requested device and dtype).

    The weights are read straight onto the device (`device_map`): building the stage in host RAM
    first and then moving it would need the whole stage twice over (host, then device) and, for the
    30B thinker, more host memory than a GPU node may have."""
    _register_conversions()
    # The load report would list the other stages' weights as unexpected: that is the point.
    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # transformers: unannotated
    transformers.logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers: unannotated
    cls = STAGE_CLASSES[stage]
    dtype = options.torch_dtype()
    kwargs: dict[str, Any] = {"dtype": dtype, "device_map": str(options.device)}
    # grouped_mm is what the stage's own modules pick by default; asked of the holder, transformers
    # refuses it (it looks for its decorator in the holder's source).
    if stage in MOE_STAGES and (experts := stage_experts(stage, model_dir, options)) != "grouped_mm":
        kwargs["experts_implementation"] = experts
    model = cls.from_pretrained(str(model_dir), **kwargs)
    return model.eval()  # type: ignore[no-untyped-call]  # transformers: unannotated
