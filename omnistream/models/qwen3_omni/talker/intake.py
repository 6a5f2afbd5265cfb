"""A talker request's thinker input: what it must hold before the request may join a batch, and how
it joins the request's state.

The talker's batched forwards run every slotted request together, so a malformed input found there
would fail a whole step (and cost its innocent rows a retry each). The input's checks are made here
instead, as it comes, and refuse that request alone with a field its client can act on: ids outside
the thinker's vocabulary, a prompt with no assistant turn to speak or too long for `max_frames`, deep
rows that do not match the prompt's multimodal positions one for one, inputs out of order.

`TalkerIntake` is a part `TalkerEngine` holds. Its inputs are the model's facts, named in the
constructor, and the request's state, so tests build it with plain numbers and states. The engine
keeps the lock and the request table: `device_rows` runs before the lock (a device copy must not
hold up the engine thread), `take` under it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from omnistream.models.qwen3_omni.talker.deep_rows import DeepRows
from omnistream.models.qwen3_omni.talker.prompt import (
    ASSISTANT_PROMPT_ROWS,
    ASSISTANT_PROMPT_TOKENS,
    assistant_start,
    user_positions,
)
from omnistream.models.qwen3_omni.talker.state import _TalkerState
from omnistream.request.errors import InvalidRequest
from omnistream.request.media import MediaLayout


class TalkerIntake:
    """The checks a request's thinker input passes, and the state it fills in."""

    def __init__(
        self,
        *,
        thinker_vocab: int,
        hidden_width: int,
        multimodal_ids: set[int],
        im_start_id: int,
        assistant_id: int,
        user_id: int,
        max_model_len: int,
        device: str | torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.thinker_vocab = thinker_vocab
        self.hidden_width = hidden_width  # the thinker's: what the talker's hidden projection takes
        self.multimodal_ids = multimodal_ids  # audio, image and video tokens: where deep rows go
        self.im_start_id = im_start_id
        self.assistant_id = assistant_id
        self.user_id = user_id
        self.max_model_len = max_model_len
        self.device = device
        self.dtype = dtype

    def check_tokens(self, token_ids: Sequence[int]) -> None:
        """Generated ids become text rows through the thinker's embedding: an id past it is refused
        here, not found as an index error in a batched step."""
        self._check_ids(token_ids, "token ids", "token_ids")

    def device_rows(self, multimodal_hidden: Mapping[int, torch.Tensor] | None) -> DeepRows | None:
        """The deep rows on the engine's device in its dtype, in one copy. The engine, not its callers,
        does it: rows decoded from the wire are float32 on the CPU, the projection may be bfloat16 on
        CUDA. Before the engine's lock: a device copy must not hold up the engine thread."""
        if multimodal_hidden is None:
            return None
        try:
            return DeepRows.of(multimodal_hidden).to(self.device, self.dtype)
        except ValueError as exc:
            raise InvalidRequest(str(exc), field="prompt_hidden") from exc

    def take(
        self,
        state: _TalkerState,
        token_ids: list[int],
        last: bool,
        prompt_ids: list[int] | None,
        deep: DeepRows | None,
        media_layout: MediaLayout | None,
    ) -> bool:
        """Under the engine's lock: one input of the request (the prompt with the first, then
        generated tokens) checked and added to its state. True when the input ended with nothing to
        speak (an answer that is only a tool call: ThinkerChunk.spoken), which the engine ends at once
        with no frames."""
        if state.input_done:
            raise InvalidRequest(f"request {state.request_id!r} already received its last input")
        if prompt_ids is not None:
            self.take_prompt(state, prompt_ids, deep, media_layout)
        elif deep is not None or media_layout is not None:
            raise InvalidRequest("multimodal rows come with the prompt only", field="prompt_hidden")
        elif state.prompt_ids is None:
            raise InvalidRequest("the first talker input must carry the prompt ids", field="prompt_ids")
        state.stream.extend(token_ids)
        state.spoken_tokens += len(token_ids)
        if not last:
            return False
        state.input_done = True
        if not state.spoken_tokens:
            return True
        if len(state.stream) < ASSISTANT_PROMPT_TOKENS:
            raise InvalidRequest("the talker needs at least one generated token to speak")
        return False

    def take_prompt(
        self,
        state: _TalkerState,
        prompt_ids: list[int],
        deep: DeepRows | None,
        media_layout: MediaLayout | None,
    ) -> None:
        """The prompt, once: its user positions and row count are known from its ids now, so the
        schedule can budget its prefill before its rows are built."""
        if state.prompt_ids is not None:
            raise InvalidRequest("the prompt was already given", field="prompt_ids")
        self._check_ids(prompt_ids, "prompt ids", "prompt_ids")
        try:
            start = assistant_start(prompt_ids, self.im_start_id, self.assistant_id)
        except ValueError as exc:
            raise InvalidRequest(str(exc), field="prompt_ids") from exc
        # At most the user turns plus the assistant rows: a bound from the ids alone.
        prompt_rows = len(prompt_ids) + ASSISTANT_PROMPT_ROWS
        if prompt_rows + state.params.max_frames > self.max_model_len:
            raise InvalidRequest(
                f"prompt ({len(prompt_ids)} tokens) + max_frames ({state.params.max_frames}) exceeds "
                f"the talker length {self.max_model_len}",
                field="max_frames",
            )
        users = user_positions(prompt_ids, self.im_start_id, self.user_id)
        self.check_multimodal(prompt_ids, users, deep)
        state.prompt_ids = list(prompt_ids)
        state.user_positions = users
        state.prompt_row_count = len(users) + ASSISTANT_PROMPT_ROWS
        state.stream = list(prompt_ids[start:])
        state.multimodal_hidden = deep
        state.media_layout = media_layout

    def check_multimodal(self, prompt_ids: list[int], users: list[int], hidden: DeepRows | None) -> None:
        """Rows and positions must match the prompt exactly before the request may join a batch:
        one row of the thinker's width per multimodal token of a user turn (`users`: the positions
        of the user turns), and nothing else."""
        mm_ids = self.multimodal_ids
        needed = {p for p in users if prompt_ids[p] in mm_ids}
        given = hidden.positions if hidden is not None else []
        for position in given:
            if not 0 <= position < len(prompt_ids) or prompt_ids[position] not in mm_ids:
                raise InvalidRequest(
                    f"multimodal position {position} holds no audio, image or video token of the prompt",
                    field="multimodal_positions",
                )
        if hidden is not None and len(hidden) and hidden.width != self.hidden_width:
            raise InvalidRequest(
                f"prompt_hidden rows must have width {self.hidden_width}, got {(hidden.width,)}",
                field="prompt_hidden",
            )
        missing = sorted(needed - set(given))
        if missing:
            raise InvalidRequest(
                f"prompt positions {missing[:8]} hold audio/image/video tokens but no prompt_hidden row "
                "was given for them",
                field="prompt_hidden",
            )

    def _check_ids(self, ids: Sequence[int], what: str, field: str) -> None:
        if any(not 0 <= t < self.thinker_vocab for t in ids):
            raise InvalidRequest(f"{what} must be in [0, {self.thinker_vocab})", field=field)
