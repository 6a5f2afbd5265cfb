"""The thinker's prefill part alone (`PromptPrefill`), with a fake forward: no weights.

A text prompt is prefilled piece by piece through the forward it was given, `prefilled` advances only
once a piece's forward has run (a failing one leaves the request as it was, for its retry), and the
last piece returns the forward's logits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
import torch

from omnistream.engine.output_stream import OutputStream
from omnistream.models.qwen3_omni.thinker.prefill import PromptPrefill
from omnistream.models.qwen3_omni.thinker.state import _ThinkerState
from omnistream.models.qwen3_omni.thinker.thinker_media import PromptEmbedding


class Forward:
    """Records each piece's ids; logits say how many positions the piece had; may fail once."""

    def __init__(self) -> None:
        self.pieces: list[list[int]] = []
        self.fail_next = False

    def forward(
        self,
        states: Sequence[_ThinkerState],
        ids: torch.Tensor | None,
        embedding: PromptEmbedding | None = None,
        positions: torch.Tensor | None = None,
        commit: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert ids is not None and embedding is None and positions is None and commit
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the forward failed")
        self.pieces.append(ids[0].tolist())
        return torch.full((1, 3), float(ids.shape[1])), torch.zeros(1, ids.shape[1], 2)


def _prefill(forward: Forward) -> PromptPrefill:
    return PromptPrefill(
        model=forward,
        thinker_model=None,  # media prompts only
        language_model=None,
        config=None,
        device="cpu",
        accept_layer=0,
        multimodal_ids=set(),
    )


def _state(prompt: list[int]) -> _ThinkerState:
    loop = asyncio.new_event_loop()
    try:
        return _ThinkerState(request_id="r", output=OutputStream(loop, 4), prompt_ids=prompt)
    finally:
        loop.close()


def test_a_text_prompt_prefills_in_pieces_and_the_last_returns_its_logits() -> None:
    forward = Forward()
    prefill = _prefill(forward)
    state = _state([10, 11, 12, 13, 14])
    assert prefill.piece(state, 2) is None and state.prefilled == 2
    assert prefill.piece(state, 2) is None and state.prefilled == 4
    done = prefill.piece(state, 2)  # one position is left: the piece takes only that
    assert done is not None
    logits, deep = done
    assert logits.tolist() == [[1.0, 1.0, 1.0]] and deep is None
    assert forward.pieces == [[10, 11], [12, 13], [14]] and state.prefilled == 5


def test_a_failing_piece_leaves_nothing_behind() -> None:
    forward = Forward()
    prefill = _prefill(forward)
    state = _state([10, 11, 12])
    forward.fail_next = True
    with pytest.raises(RuntimeError):
        prefill.piece(state, 2)
    assert state.prefilled == 0 and forward.pieces == []
    assert prefill.piece(state, 2) is None  # the retry takes the same piece
    assert forward.pieces == [[10, 11]] and state.prefilled == 2
