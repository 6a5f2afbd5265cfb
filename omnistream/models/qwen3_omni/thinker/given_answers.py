"""Given answers (speech): the thinker streams a text it was given instead of generating one.

`ThinkerOpen.assistant_text` makes the thinker skip generation: the text's tokens go out through the
same outputs a generated answer would have used, so the talker and code2wav neither know nor care.
A mixin of `ThinkerEngine` (it reads the engine's tokenizer framing, limits and `_finish`).
"""

from __future__ import annotations

from typing import Any

from omnistream.models.qwen3_omni.thinker.state import ThinkerOutput, _ThinkerState
from omnistream.request.errors import InvalidRequest
from omnistream.request.stage_chain import ThinkerParams

# Tokens of a given answer (speech) per output: about what a decode step makes at a time when the
# consumer lags, small enough that the talker starts on the first piece at once.
SPOKEN_PIECE_TOKENS = 8



class GivenAnswers:
    """The given-answer half of `ThinkerEngine`: checked at admission, streamed in pieces."""

    chat: Any  # ChatEncoder
    config: Any
    max_model_len: int

    def encode_assistant_text(self, text: str) -> list[int]:
        """The ids the thinker streams for a given answer (speech): the text tokenized as plain text
        (special-token strings in it stay text), then the end-of-turn token, as a generated answer
        ends. Slow for long texts: servicers call it off the event loop."""
        if not text:
            raise InvalidRequest("the text to speak is empty", field="input")
        if len(text.encode("utf-8", "surrogatepass")) > self.chat.max_token_bytes * self.max_model_len:
            limit = self.max_model_len
            raise InvalidRequest(f"the text to speak cannot fit in {limit} tokens", field="input")
        return [*self.chat.encode_text(text), self.config.im_end_token_id]

    def _check_spoken(self, prompt_ids: list[int], spoken: list[int], params: ThinkerParams) -> None:
        if len(spoken) > params.max_tokens:
            raise InvalidRequest(
                f"the text to speak is {len(spoken)} tokens (with the end of turn), over the limit of "
                f"{params.max_tokens}",
                field="input",
            )
        if len(prompt_ids) + len(spoken) > self.max_model_len:
            raise InvalidRequest(
                f"the prompt ({len(prompt_ids)} tokens) + the text to speak ({len(spoken)} tokens) "
                f"exceed the model length {self.max_model_len}",
                field="input",
            )

    def _speak(self, state: _ThinkerState) -> None:
        """The next piece of a given answer, as the outputs a generated one would have been: the
        same chunk path to the talker, no model work. Pieces are small so the talker can start on
        the first while the rest queues (the output's bound paces them)."""
        if state.finished:  # aborted while the step ran
            return
        assert state.spoken is not None and state.detok is not None
        first = not state.generated
        start = len(state.generated)
        piece = state.spoken[start : start + SPOKEN_PIECE_TOKENS]
        state.generated.extend(piece)
        finished = len(state.generated) == len(state.spoken)
        delta = "".join(state.detok.add(t) for t in piece)
        if finished:
            delta += state.detok.flush()
        state.output.put(
            ThinkerOutput(
                token_ids=piece,
                text_delta=delta,
                index=start,
                finished=finished,
                finish_reason="stop" if finished else None,
                prompt_ids=list(state.prompt_ids) if first else None,
            )
        )
        if finished:
            self._finish(state)
