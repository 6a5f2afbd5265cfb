"""Given answers (speech): the thinker streams a text it was given instead of generating one.

`ThinkerOpen.assistant_text` makes the thinker skip generation: the text's tokens go out through the
same outputs a generated answer would have used, so the talker and code2wav neither know nor care.
`ThinkerEngine` calls `speak_next` for such a request each step; the rules (encoding, limits, the
pieces) are `thinker/text.py`'s, which the vLLM thinker streams with too.
"""

from __future__ import annotations

from omnistream.models.qwen3_omni.thinker.state import _ThinkerState
from omnistream.models.qwen3_omni.thinker.text import spoken_piece


def speak_next(state: _ThinkerState) -> bool:
    """Queue the next piece of a given answer, as the outputs a generated one would have been: the
    same chunk path to the talker, no model work (the output's bound paces the pieces). True once the
    last piece is queued (the caller then finishes the request)."""
    if state.finished:  # aborted while the step ran
        return False
    assert state.spoken is not None and state.detok is not None
    output = spoken_piece(state.prompt_ids, state.spoken, state.generated, state.detok)
    state.output.put(output)
    return output.finished
