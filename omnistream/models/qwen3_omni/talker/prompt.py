"""Thinker -> Talker edge of Qwen3-Omni: how thinker output becomes talker input.

This is the layout of `Qwen3OmniMoeForConditionalGeneration.generate`, made incremental:
- the talker prompt = the user turns (text rows through `text_projection`, multimodal rows through
  `hidden_projection`) + 9 assistant rows built from the first 4 tokens of the assistant turn;
- every later assistant token becomes one "trailing" text row, consumed one per codec frame, followed
  by `tts_eos`, then `tts_pad` forever.
The assistant turn starts at the last `<|im_start|>assistant`; it is the prompt's tail plus the
generated tokens ("the assistant stream"), so the talker can start after the thinker's first token.

The thinker's last generated token is never a text row: `tts_eos` takes its place. The reference
builds the talker's text from the thinker's input embeddings (`hidden_states[0]` of each thinker
step), and the token a thinker ends on is sampled but never fed back, so it has none: the
trailing rows are generated tokens 1 .. n-2, then `tts_eos`. For an answer that ends by itself
that token is the end-of-turn token (`<|im_end|>`), which is no speech; for one stopped by
`max_tokens` it is the last text token, which the reference does not speak either, and neither do
we (the convention, kept so that codes stay identical to `generate`'s in both cases). The head's
first content token is the exception: an answer of one token still has it in the prompt rows
(`generate` cannot run that case at all). Since any token may turn out to be the last one, a
token becomes a row only once a later token or the end of the input has arrived
(`trailing_pick`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from omnistream.models.qwen3_omni.talker.deep_rows import DeepRows

ASSISTANT_PROMPT_TOKENS = 4  # im_start, "assistant", "\n", first content token
ASSISTANT_PROMPT_ROWS = 9  # rows of the prompt after its user rows (`TalkerPrompts.prompt`: U + 9)
# Picks of `TalkerPromptBuilder.trailing_rows` that are no thinker token.
TTS_EOS = -1
TTS_PAD = -2


def text_end(stream_len: int, input_done: bool) -> int | None:
    """Assistant-stream index of the trailing row that is `tts_eos` (the thinker's last token's
    place, never before the head's first content token), or None while more input may come."""
    if not input_done:
        return None
    return max(stream_len - 1, ASSISTANT_PROMPT_TOKENS)


def trailing_pick(stream: list[int], input_done: bool, index: int) -> int | None:
    """The trailing row at assistant-stream `index` (>= ASSISTANT_PROMPT_TOKENS): a thinker id,
    `TTS_EOS` or `TTS_PAD`; None while it is not known yet (the token at `index` may still turn out
    to be the thinker's last one, which is no text row: see the module doc)."""
    end = text_end(len(stream), input_done)
    if end is None:
        return stream[index] if index + 1 < len(stream) else None
    if index < end:
        return stream[index]
    return TTS_EOS if index == end else TTS_PAD


def user_positions(prompt_ids: list[int], im_start_id: int, user_id: int) -> list[int]:
    """Positions whose enclosing turn (the last `<|im_start|>` at or before them, else position 0)
    is a user turn. In numpy: a conversation's prompt is thousands of ids, every turn."""
    ids = np.asarray(prompt_ids, dtype=np.int64)
    n = ids.size
    if n == 0:
        return []
    last_start = np.maximum.accumulate(np.where(ids == im_start_id, np.arange(n), 0))
    role_at = np.minimum(last_start + 1, n - 1)
    return np.flatnonzero(ids[role_at] == user_id).tolist()


def assistant_start(prompt_ids: list[int], im_start_id: int, assistant_id: int) -> int:
    for i in range(len(prompt_ids) - 2, -1, -1):
        if prompt_ids[i] == im_start_id and prompt_ids[i + 1] == assistant_id:
            return i
    raise ValueError("the prompt has no '<|im_start|>assistant' turn for the talker to speak")


class TalkerPromptBuilder:
    """Turns thinker ids (and deep hidden rows at multimodal positions) into talker input rows."""

    def __init__(self, config: Any, talker: Any, thinker_embed: torch.nn.Embedding) -> None:
        self.config = config
        self.tc = config.talker_config
        self.talker = talker
        self.thinker_embed = thinker_embed
        self.multimodal_ids = {
            config.thinker_config.audio_token_id,
            config.thinker_config.image_token_id,
            config.thinker_config.video_token_id,
        }
        device = thinker_embed.weight.device
        special = torch.tensor(
            [[config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]], device=device
        )
        rows = talker.text_projection(thinker_embed(special))
        self.tts_bos, self.tts_eos, self.tts_pad = rows.chunk(3, dim=1)  # each [1, 1, H]

    def text_rows(self, token_ids: list[int]) -> torch.Tensor:
        """[1, n, H] talker text rows for thinker tokens."""
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.thinker_embed.weight.device)
        rows: torch.Tensor = self.talker.text_projection(self.thinker_embed(ids))
        return rows

    def trailing_rows(self, picks: list[int]) -> torch.Tensor:
        """[B, 1, H]: one trailing text row per pick (a thinker id, `TTS_EOS` or `TTS_PAD`) with a
        single embed + projection for all thinker ids and one host -> device copy, however many
        rows: per-row calls cost a copy and two kernels each."""
        texts = [t for t in picks if t >= 0]
        index, j = [], 2
        for t in picks:
            if t >= 0:
                index.append(j)
                j += 1
            else:
                index.append(0 if t == TTS_EOS else 1)
        host = torch.tensor(texts + index, dtype=torch.long)
        device = self.thinker_embed.weight.device
        if device.type == "cuda":
            host = host.pin_memory()
        packed = host.to(device, non_blocking=True)
        table = [self.tts_eos[0], self.tts_pad[0]]  # [1, H] each
        if texts:
            table.append(
                self.talker.text_projection(self.thinker_embed(packed[: len(texts)].unsqueeze(0)))[0]
            )
        return torch.cat(table).index_select(0, packed[len(texts) :]).unsqueeze(1)

    def prompt(
        self,
        prompt_ids: list[int],
        assistant_head: list[int],
        speaker_id: int,
        multimodal_hidden: Mapping[int, torch.Tensor] | None = None,
        users: list[int] | None = None,
        start: int = 0,
    ) -> torch.Tensor:
        """Talker prompt rows [1, U - start + ASSISTANT_PROMPT_ROWS, H] (U: the prompt's user-turn
        positions, `users` when the caller has them): the rows from row `start` on (those before it
        came from the prefix cache; each row depends on its own token or deep row alone).

        `assistant_head` is the first 4 tokens of the assistant stream. `multimodal_hidden` maps a
        prompt position holding an audio/image/video token to its deep thinker hidden row.
        """
        cfg = self.config
        if users is None:
            users = user_positions(prompt_ids, cfg.im_start_token_id, cfg.user_token_id)
        built = users[start:]
        parts = []
        if built:
            user_rows = self.text_rows([prompt_ids[p] for p in built])
            mm = [j for j, p in enumerate(built) if prompt_ids[p] in self.multimodal_ids]
            if mm:
                positions = [built[j] for j in mm]
                if multimodal_hidden is None or any(p not in multimodal_hidden for p in positions):
                    raise ValueError("multimodal prompt positions need the thinker's deep hidden rows")
                hidden = DeepRows.of(multimodal_hidden).take(positions).to(user_rows.device, user_rows.dtype)
                user_rows = user_rows.clone()
                user_rows[0, mm] = self.talker.hidden_projection(hidden.unsqueeze(0))[0]
            parts.append(user_rows)
        head = self.text_rows(assistant_head)  # [1, 4, H]
        text = torch.cat((head[:, :3], self.tts_pad.expand(1, 4, -1), self.tts_bos, head[:, 3:4]), dim=1)
        tc = self.tc
        codec_ids = torch.tensor(
            [
                [
                    tc.codec_nothink_id,
                    tc.codec_think_bos_id,
                    tc.codec_think_eos_id,
                    speaker_id,
                    tc.codec_pad_id,
                    tc.codec_bos_id,
                ]
            ],
            dtype=torch.long,
            device=text.device,
        )
        codec = torch.cat(
            (
                torch.zeros((1, 3, text.shape[-1]), dtype=text.dtype, device=text.device),
                self.talker.get_input_embeddings()(codec_ids),
            ),
            dim=1,
        )
        parts.append(text + codec)
        return torch.cat(parts, dim=1)
