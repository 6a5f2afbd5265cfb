"""Load one stage of a Hugging Face Qwen3-Omni checkpoint.

Each stage service loads only the weights it runs: a thin `PreTrainedModel` holder exposes just the
submodules of that stage under the checkpoint's own prefixes, so `from_pretrained` reads those
tensors (and applies transformers' own checkpoint conversions) and skips the rest. The same code
loads the embedded tiny checkpoint and the real 30B one.
"""

import logging
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers import AutoConfig, AutoTokenizer
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

from omnistream.engine.load_options import LoadOptions

log = logging.getLogger(__name__)


class ThinkerWeights(Qwen3OmniMoePreTrainedModel):
    """Holds `thinker.*` only."""

    config: Qwen3OmniMoeConfig

    def __init__(self, config: Qwen3OmniMoeConfig) -> None:
        super().__init__(config)
        self.thinker = Qwen3OmniMoeThinkerForConditionalGeneration._from_config(config.thinker_config)
        self.post_init()


class _ThinkerEmbedding(nn.Module):
    """The thinker's token embedding table, under its checkpoint name `thinker.model.embed_tokens`."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab_size, hidden_size)


class TalkerWeights(Qwen3OmniMoePreTrainedModel):
    """Holds `talker.*` plus the thinker's embedding table: with it the talker turns thinker token ids
    into its text rows itself, so the thinker only ships token ids per step."""

    config: Qwen3OmniMoeConfig

    def __init__(self, config: Qwen3OmniMoeConfig) -> None:
        super().__init__(config)
        text = config.thinker_config.text_config
        self.thinker = _ThinkerEmbedding(text.vocab_size, text.hidden_size)
        self.talker = Qwen3OmniMoeTalkerForConditionalGeneration._from_config(config.talker_config)
        self.post_init()


class Code2WavWeights(Qwen3OmniMoePreTrainedModel):
    """Holds `code2wav.*` only."""

    config: Qwen3OmniMoeConfig

    def __init__(self, config: Qwen3OmniMoeConfig) -> None:
        super().__init__(config)
        self.code2wav = Qwen3OmniMoeCode2Wav._from_config(config.code2wav_config)
        self.post_init()


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
    mapping = get_checkpoint_conversion_mapping("qwen3_omni_moe")
    for cls in STAGE_CLASSES.values():
        register_checkpoint_conversion_mapping(cls.__name__, mapping, overwrite=True)
    _registered = True


def load_config(model_dir: str | Path) -> Qwen3OmniMoeConfig:
    return AutoConfig.from_pretrained(str(model_dir))


def load_tokenizer(model_dir: str | Path):
    return AutoTokenizer.from_pretrained(str(model_dir))


def load_stage(stage: str, model_dir: str | Path, options: LoadOptions = LoadOptions()):
    """Return the stage's holder module (eval mode, on the requested device and dtype).

    The weights are read straight onto the device (`device_map`): building the stage in host RAM
    first and then moving it would need the whole stage twice over (host, then device) and, for the
    30B thinker, more host memory than a GPU node may have."""
    _register_conversions()
    # The load report would list the other stages' weights as unexpected: that is the point.
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    cls = STAGE_CLASSES[stage]
    dtype = options.torch_dtype()
    # The default grouped-matmul MoE kernel rejects float64; eager experts run every dtype.
    experts = "eager" if dtype == torch.float64 else None
    kwargs: dict = {"dtype": dtype, "device_map": str(options.device)}
    if experts:
        kwargs["experts_implementation"] = experts
    model = cls.from_pretrained(str(model_dir), **kwargs)
    return model.eval()
