"""Make the tiny checkpoint's random answers end, in text and in speech, as a real model's do.

A random thinker rarely samples `<|im_end|>` (1 in 512 a token) and a random talker never picks the
end-of-speech code (`codec_eos_token_id`), so every answer of the tiny model ran to `max_tokens` and
`max_audio_frames` (2,048 frames, 164 s of noise). A real thinker ends after a sentence; a real
talker stops a frame or two after the text ends, when its text input becomes `tts_eos`, then
`tts_pad` rows. Both behaviours are wired into the random weights the same way, everything else
staying random:

- one reserved coordinate of a residual stream is written by one thing only (every other writer,
  attention and MLP outputs, embeddings, projections, gets a zero row / column there), so it is
  exactly 0 except where that one thing fires;
- one output row (the end token's) reads that coordinate alone, and no other row reads it, so
  after the final norm the end logit is 0 where nothing fired and far above the rest where it did.

Thinker: the coordinate is set by the input embedding of "sentence-final" tokens ('.', '!', '?'
and every 16th id of the BPE vocabulary, ~7% of sampled tokens), and `<|im_end|>` reads it: an
answer ends right after such a token, ~14 tokens on average (about 1 s of speech), under 60 tokens
in 99 answers of 100. Greedy decoding ends the same way, at its first such token (or never).

Talker: the coordinate is set by a `tts_pad` detector, one hidden unit of `text_projection` whose
input weights are the thinker's `tts_pad` embedding and whose threshold no other thinker token
reaches, and the EOS code reads it: speech ends at the frame after `tts_eos`, two frames after the
last text token. `ignore_eos` requests mask EOS in the talker too, so the benchmark's answers still
run to `max_audio_frames`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

_MARK = 4.0  # what a sentence-final token's embedding holds at the thinker's reserved coordinate
_END_WEIGHT = 4.0  # <|im_end|>'s weight on it (its logit ~ 4 x the normalised mark)
_EVERY = 16  # besides punctuation, every 16th BPE id ends a sentence
# The talker's tts_pad detector: input gain and threshold (a fraction of the pad's own score).
_GAIN = 1000.0
_THRESHOLD = 0.75
_PAD_VALUE = 100.0  # what a tts_pad row writes at the reserved coordinate: dominates the norm
_EOS_WEIGHT = 2.0  # the EOS row's weight on it: logit ~ 2 x sqrt(hidden) after the norm
_LEAK_LIMIT = 1e-4  # the largest detector output any other thinker token may produce


def make_answers_end(model: Any, tokenizer_dir: str | Path, bpe_vocab: int) -> None:
    """Rewire `model` (a `Qwen3OmniMoeForConditionalGeneration`) in place; see the module doc.
    `bpe_vocab`: the tiny tokenizer's BPE ids (tiny.py's BPE_VOCAB, passed in: tiny.py imports this)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    with torch.no_grad():
        end_text_after_sentence(model, sentence_final_ids(tokenizer, bpe_vocab))
        end_speech_after_text(model)


def sentence_final_ids(tokenizer: Any, bpe_vocab: int) -> list[int]:
    """Ids after which the tiny thinker ends its answer: punctuation, and every 16th BPE id."""
    roles = {tokenizer.convert_tokens_to_ids(r) for r in ("system", "user", "assistant")}
    final = []
    for i in range(bpe_vocab):
        text = tokenizer.decode([i])
        if i not in roles and (any(c in text for c in ".!?") or i % _EVERY == _EVERY - 1):
            final.append(i)
    return final


def _silence_coordinate(layers: Iterable[Any], v: int) -> None:
    """No attention or MLP output of these decoder layers writes residual coordinate `v`."""
    for layer in layers:
        layer.self_attn.o_proj.weight[v] = 0.0
        mlp = layer.mlp
        mlp.experts.down_proj[:, v, :] = 0.0  # [experts, hidden, intermediate]
        shared = getattr(mlp, "shared_expert", None)
        if shared is not None:
            shared.down_proj.weight[v] = 0.0


def end_text_after_sentence(model: Any, final_ids: list[int]) -> None:
    """The thinker's `<|im_end|>` wins right after a sentence-final token (see the module doc)."""
    text = model.thinker.model.language_model
    embed = text.embed_tokens.weight
    v = embed.shape[1] - 1
    embed[:, v] = 0.0
    embed[final_ids, v] = _MARK
    _silence_coordinate(text.layers, v)
    head = model.thinker.lm_head.weight
    end = model.config.im_end_token_id
    head[:, v] = 0.0
    head[end] = 0.0
    head[end, v] = _END_WEIGHT
    # The talker reads thinker embeddings too (its text rows): the mark is not for it.
    model.talker.text_projection.linear_fc1.weight[:, v] = 0.0


def end_speech_after_text(model: Any) -> None:
    """The talker's EOS code wins at the first `tts_pad` row (see the module doc)."""
    config = model.config
    talker = model.talker
    embed = model.thinker.model.language_model.embed_tokens.weight  # [V, H_thinker]
    projection = talker.text_projection
    u = projection.linear_fc2.out_features - 1  # the talker's reserved coordinate
    unit = projection.linear_fc1.out_features - 1  # the detector
    pad_id = config.tts_pad_token_id
    pad = embed[pad_id] * (projection.linear_fc1.weight.abs().sum(0) > 0)  # what the talker sees
    projection.linear_fc1.weight[unit] = _GAIN * pad / pad.norm()
    projection.linear_fc1.bias[unit] = -_THRESHOLD * _GAIN * float(pad.norm())
    fired = projection.act_fn(projection.linear_fc1(embed))[:, unit]  # for every thinker token
    on = float(fired[pad_id])
    others = torch.cat((fired[:pad_id], fired[pad_id + 1 :]))
    if on <= 0 or float(others.abs().max()) > _LEAK_LIMIT * on:
        raise RuntimeError("the tiny talker's tts_pad detector also fires on other tokens")
    # The detector writes u alone, and nothing else writes u.
    projection.linear_fc2.weight[u] = 0.0
    projection.linear_fc2.weight[:, unit] = 0.0
    projection.linear_fc2.weight[u, unit] = _PAD_VALUE / on
    projection.linear_fc2.bias[u] = 0.0
    talker.hidden_projection.linear_fc2.weight[u] = 0.0
    talker.hidden_projection.linear_fc2.bias[u] = 0.0
    talker.model.codec_embedding.weight[:, u] = 0.0
    for table in talker.code_predictor.model.codec_embedding:
        table.weight[:, u] = 0.0
    _silence_coordinate(talker.model.layers, u)
    # Only the EOS row reads u, and it reads nothing else.
    eos = config.talker_config.codec_eos_token_id
    head = talker.codec_head.weight
    head[:, u] = 0.0
    head[eos] = 0.0
    head[eos, u] = _EOS_WEIGHT
