"""The thinker's language model of a Qwen3-Omni checkpoint as a plain `Qwen3MoeForCausalLM` directory.

vLLM serves the thinker for text prompts from this layout on machines where its own Qwen3-Omni
thinker cannot load (the CPU build: that model's image processor path needs torchvision, which the
CPU environment cannot import). For text-only prompts nothing is lost: the thinker's text model is a
Qwen3-MoE decoder (q/k norms, top-k softmax router with normalized weights, no shared expert), and
its interleaved M-RoPE with the same position on all three axes (what a prompt without media gets)
is ordinary RoPE over the full rotary width, so `rope_type: default` with the same theta is exact.

The conversion renames `thinker.model.*` -> `model.*`, `thinker.lm_head.*` -> `lm_head.*` and leaves
the audio and vision towers out. One more step for small test models: vLLM's CPU attention kernels
take head sizes of 32 and up (`SUPPORTED_HEAD_DIMS`), and the tiny checkpoint's are 16. Such heads
are widened from D to P = r D dimensions (`pad_heads`) so that attention computes the same thing:
each original rotary pair (i, i + D/2) sits at (i r, P/2 + i r), where the RoPE frequency is the
same. The other slots of q and k hold copies of the original rows, so the q/k norms' RMS over P
slots is exactly the one over D, and the norms' weights are zero there, so the copies leave the
norm as zeros (and RoPE keeps zeros zero): q and k are the original ones in their slots and zero
elsewhere. The q norm's weight is multiplied by sqrt(r) to undo the wider softmax scale 1/sqrt(P).
v's extra slots are zero and o_proj reads nothing from them. What differs is rounding only. The
real checkpoint (head_dim 128) is copied unchanged.

It is deterministic (sorted tensors, fixed metadata) and cached next to the source
(`<model>-vllm-thinker/`), keyed by this module's source and the source checkpoint's config and
weight files, so a rebuilt tiny model or a new converter rebuilds it.

Self-contained on purpose (json, safetensors, torch only; no transformers): it runs in the vLLM
environment, whose transformers is older than the project's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

ARCHITECTURE = "Qwen3MoeForCausalLM"
# Head sizes vLLM's CPU attention backend takes (CPUAttentionBackend.get_supported_head_sizes).
SUPPORTED_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
STAMP = "omnistream_vllm_thinker.json"
SUFFIX = "-vllm-thinker"
# Tokenizer files copied as they are (vLLM runs with skip_tokenizer_init, but a person pointing
# vLLM's own server at the directory gets the same tokenizer and chat template).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)
# Text-model config keys that carry over to Qwen3MoeConfig unchanged.
TEXT_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "rms_norm_eps",
    "attention_bias",
    "attention_dropout",
    "num_experts",
    "num_experts_per_tok",
    "norm_topk_prob",
    "decoder_sparse_step",
    "mlp_only_layers",
    "initializer_range",
)


def default_output(model_dir: str | Path) -> Path:
    """Where the converted directory of `model_dir` is cached: beside it."""
    source = Path(model_dir).absolute()
    return source.parent / f"{source.name}{SUFFIX}"


def _weight_files(model_dir: Path) -> list[Path]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir} has no *.safetensors weights")
    return files


def source_key(model_dir: str | Path) -> str:
    """What the converted directory depends on: this converter's source, the source config, and the
    name and size of each weight file (content hashing a 60 GB checkpoint would take minutes)."""
    model_dir = Path(model_dir)
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update((model_dir / "config.json").read_bytes())
    for path in _weight_files(model_dir):
        digest.update(f"{path.name}:{path.stat().st_size}".encode())
    return digest.hexdigest()[:16]


def padded_head_dim(head_dim: int) -> int:
    """The head size the converted model uses: the original one if vLLM's CPU kernels take it, else
    the smallest multiple of it they take (the padding needs a whole ratio, see the docstring)."""
    if head_dim in SUPPORTED_HEAD_DIMS:
        return head_dim
    for size in SUPPORTED_HEAD_DIMS:
        if size > head_dim and size % head_dim == 0:
            return size
    raise ValueError(f"no supported head size is a multiple of head_dim {head_dim}")


def _head_dim(text: dict[str, Any]) -> int:
    return int(text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"])


def pad_heads(tensors: dict[str, Any], text: dict[str, Any], width: int) -> dict[str, Any]:
    """Widen every attention head of the renamed tensors from the config's head_dim to `width` (see
    the module docstring for why the result computes the same attention)."""
    import torch

    dim = _head_dim(text)
    if width == dim:
        return tensors
    ratio = width // dim
    half = dim // 2
    slots = [i * ratio for i in range(half)] + [width // 2 + i * ratio for i in range(half)]
    others = [j for j in range(width) if j not in set(slots)]
    # Row j of the original head goes to slots[j], and once more to each of its copies in `others`.
    source = torch.tensor(list(range(dim)) + [j % dim for j in range(len(others))])
    place = torch.tensor(slots + others)
    heads = {"q_proj": text["num_attention_heads"], "k_proj": text["num_key_value_heads"]}
    out = dict(tensors)
    for name, tensor in tensors.items():
        if ".self_attn." not in name:
            continue
        part = name.split(".self_attn.")[1].split(".")[0]
        if part in heads:  # [H * D, ...] -> [H * P, ...], copies in the extra slots
            h = heads[part]
            rows = tensor.view(h, dim, *tensor.shape[1:])
            wide = rows.new_zeros(h, width, *tensor.shape[1:])
            wide[:, place] = rows[:, source]
            out[name] = wide.reshape(h * width, *tensor.shape[1:])
        elif part == "v_proj":  # zeros in the extra slots
            h = text["num_key_value_heads"]
            rows = tensor.view(h, dim, *tensor.shape[1:])
            wide = rows.new_zeros(h, width, *tensor.shape[1:])
            wide[:, slots] = rows
            out[name] = wide.reshape(h * width, *tensor.shape[1:])
        elif part == "o_proj" and name.endswith(".weight"):  # [hidden, H * D] -> [hidden, H * P]
            h = text["num_attention_heads"]
            wide = tensor.new_zeros(tensor.shape[0], h, width)
            wide[:, :, slots] = tensor.view(tensor.shape[0], h, dim)
            out[name] = wide.reshape(tensor.shape[0], h * width)
        elif part in ("q_norm", "k_norm"):  # [D] -> [P], zero on the copies
            wide = tensor.new_zeros(width)
            wide[slots] = tensor * ratio**0.5 if part == "q_norm" else tensor
            out[name] = wide
    return out


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The Qwen3MoeForCausalLM config.json of a Qwen3-Omni config.json (plain dicts)."""
    thinker = config["thinker_config"]
    text = thinker["text_config"]
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    theta = rope.get("rope_theta", text.get("rope_theta", 10000.0))
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", "mrope"):
        kind = rope.get("rope_type")
        raise ValueError(f"the thinker's rope type {kind!r} has no text-only equivalent here")
    out = {key: text[key] for key in TEXT_KEYS if key in text}
    eos = config.get("im_end_token_id", text.get("eos_token_id"))
    out.update(
        architectures=[ARCHITECTURE],
        model_type="qwen3_moe",
        # M-RoPE with equal positions on its three axes is plain RoPE (module docstring).
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        rope_theta=theta,
        rope_scaling=None,
        tie_word_embeddings=bool(thinker.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        sliding_window=None,
        use_sliding_window=False,
        bos_token_id=text.get("bos_token_id"),
        eos_token_id=eos,
        pad_token_id=text.get("pad_token_id"),
        dtype="float32",
        head_dim=padded_head_dim(_head_dim(text)),
    )
    return out


def renamed(name: str) -> str | None:
    """The Qwen3MoeForCausalLM name of a checkpoint tensor, or None for tensors it does not hold."""
    if name.startswith("thinker.model."):
        return "model." + name[len("thinker.model.") :]
    if name.startswith("thinker.lm_head."):
        return "lm_head." + name[len("thinker.lm_head.") :]
    return None


def convert(model_dir: str | Path, output: str | Path) -> Path:
    """Write the text model of `model_dir` into `output` (replaced atomically when complete)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    model_dir, output = Path(model_dir), Path(output)
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("model_type") != "qwen3_omni_moe":
        kind = config.get("model_type")
        raise ValueError(f"{model_dir} is not a Qwen3-Omni checkpoint (model_type {kind!r})")
    tensors = {}
    for path in _weight_files(model_dir):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                new = renamed(name)
                if new is not None:
                    tensors[new] = f.get_tensor(name).contiguous()
    if "model.embed_tokens.weight" not in tensors:
        raise ValueError(f"{model_dir} holds no thinker.model.embed_tokens weight")
    text = config["thinker_config"]["text_config"]
    tensors = pad_heads(tensors, text, padded_head_dim(_head_dim(text)))
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        weights = dict(sorted(tensors.items()))
        save_file(weights, str(staging / "model.safetensors"), metadata={"format": "pt"})
        (staging / "config.json").write_text(json.dumps(text_config(config), indent=2, sort_keys=True) + "\n")
        for name in TOKENIZER_FILES:
            if (model_dir / name).exists():
                shutil.copyfile(model_dir / name, staging / name)
        stamp = {"source": str(model_dir.absolute()), "key": source_key(model_dir)}
        stamp["architecture"] = ARCHITECTURE
        (staging / STAMP).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
        staging.chmod(0o755)  # mkdtemp's 0700 would keep it from other users of the cache
        if output.exists():
            shutil.rmtree(output, ignore_errors=True)
        try:
            os.replace(staging, output)
        except OSError:
            if not is_current(output, model_dir):  # another process won the race with the same result
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output


def is_current(output: str | Path, model_dir: str | Path) -> bool:
    """Was `output` converted from `model_dir` as it is now, by this converter?"""
    try:
        stamp = json.loads((Path(output) / STAMP).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return stamp.get("key") == source_key(model_dir) and (Path(output) / "model.safetensors").exists()


def ensure_converted(model_dir: str | Path, output: str | Path | None = None) -> Path:
    """The converted directory of `model_dir`, converting it first when missing or stale."""
    from omnistream.models.build_lock import build_lock

    output = Path(output) if output is not None else default_output(model_dir)
    with build_lock(output):  # `convert` replaces a stale output: never under another's reader
        if not is_current(output, model_dir):
            convert(model_dir, output)
    return output


def main(argv: list[str] | None = None) -> int:
    """`python -m omnistream.models.qwen3_omni.thinker.vllm_checkpoint MODEL [OUTPUT]`: convert (or
    reuse) and print the directory."""
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("output", nargs="?", default=None)
    args = p.parse_args(argv)
    print(ensure_converted(args.model, args.output))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
