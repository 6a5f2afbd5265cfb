"""Given answers (speech): the thinker streams a text it was given instead of generating one.

`ThinkerOpen.assistant_text` makes the thinker skip generation: the text's tokens go out through the
same outputs a generated answer would have used, so the talker and code2wav neither know nor care.
A mixin of `ThinkerEngine`; the rules (encoding, limits, the pieces) are `thinker/text.py`'s, which
the vLLM thinker streams with too.
"""

from __future__ import annotations

from omnistream.models.qwen3_omni.thinker.state import _ThinkerState
from omnistream.models.qwen3_omni.thinker.text import ThinkerText, spoken_piece


class GivenAnswers:
    """The given-answer half of `ThinkerEngine`: checked at admission, streamed in pieces."""

    text: ThinkerText

    def encode_assistant_text(self, text: str) -> list[int]:
        """See `ThinkerText.encode_assistant_text` (call it off the event loop)."""
        return self.text.encode_assistant_text(text)

    def _speak(self, state: _ThinkerState) -> None:
        """The next piece of a given answer, as the outputs a generated one would have been: the
        same chunk path to the talker, no model work (the output's bound paces the pieces)."""
        if state.finished:  # aborted while the step ran
            return
        assert state.spoken is not None and state.detok is not None
        output = spoken_piece(state.prompt_ids, state.spoken, state.generated, state.detok)
        state.output.put(output)
        if output.finished:
            self._finish(state)
