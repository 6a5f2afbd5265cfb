"""The thinker's text side, shared by its two engines (transformers, thinker/engine.py, and vLLM,
thinker/vllm_engine.py): what goes in (chat encoding, the checks of a text request) and
what comes out (ThinkerOutput, a given answer's pieces), with no model involved.

Both backends must refuse the same requests with the same errors and stream a given answer
(speech) the same way, so the talker and the gateway cannot tell them apart; one copy of these
rules keeps them from drifting. No torch at import time: the vLLM environment loads this before
vLLM, and its tests read it without a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omnistream.engine.chat_encoding import ChatEncoder, Tools
from omnistream.engine.detokenizer import IncrementalDetokenizer
from omnistream.engine.token_memo import TokenMemo
from omnistream.request.errors import InvalidRequest
from omnistream.request.stage_chain import ThinkerParams

if TYPE_CHECKING:
    import torch

    from omnistream.request.media import MediaLayout

# Tokens of a given answer (speech) per output: about what a decode step makes at a time when the
# consumer lags, small enough that the talker starts on the first piece at once.
SPOKEN_PIECE_TOKENS = 8


@dataclass
class ThinkerOutput:
    token_ids: list[int]
    text_delta: str
    index: int  # index of the first token in `token_ids` among the generated tokens
    finished: bool = False
    finish_reason: str | None = None
    prompt_ids: list[int] | None = None  # only on the first output
    # First output of a prompt with media: deep rows [len(positions), H] of its multimodal positions.
    prompt_hidden: torch.Tensor | None = None
    multimodal_positions: list[int] | None = None
    media_layout: MediaLayout | None = None  # first output of a prompt with media
    cached_tokens: int = 0  # first output: prompt tokens whose KV came from the prefix cache


class ThinkerText:
    """The text rules of one thinker: its tokenizer and chat framing, end-of-turn ids, limits."""

    def __init__(self, config: Any, tokenizer: Any, max_model_len: int) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        tc = config.thinker_config
        self.vocab_size = tc.text_config.vocab_size
        self.im_end_token_id = config.im_end_token_id
        self.eos_ids = {config.im_end_token_id}
        if tokenizer.eos_token_id is not None:
            self.eos_ids.add(tokenizer.eos_token_id)
        self.multimodal_ids = {tc.audio_token_id, tc.image_token_id, tc.video_token_id}
        self.chat = ChatEncoder(tokenizer, max_model_len)

    def encode_chat(
        self, messages: list[dict[str, Any]], tools: Tools = None, memo: TokenMemo | None = None
    ) -> list[int]:
        """The prompt ids the reference would see for a chat (ChatML, generation prompt added), except
        that special-token strings typed by a user stay text (see `ChatEncoder`). Slow for long
        prompts: servicers call it off the event loop. `memo`: the conversation's last prompt."""
        return self.chat.encode(messages, tools, memo)

    def encode_assistant_text(self, text: str) -> list[int]:
        """The ids the thinker streams for a given answer (speech): the text tokenized as plain text
        (special-token strings in it stay text), then the end-of-turn token, as a generated answer
        ends. Slow for long texts: servicers call it off the event loop."""
        if not text:
            raise InvalidRequest("the text to speak is empty", field="input")
        if len(text.encode("utf-8", "surrogatepass")) > self.chat.max_token_bytes * self.max_model_len:
            limit = self.max_model_len
            raise InvalidRequest(f"the text to speak cannot fit in {limit} tokens", field="input")
        return [*self.chat.encode_text(text), self.im_end_token_id]

    def check_ids(self, prompt_ids: list[int], has_media: bool = False) -> None:
        """An empty prompt, ids outside the vocabulary, or (without media) media placeholders, whose
        rows would come from encoders that did not run."""
        if not prompt_ids:
            raise InvalidRequest("the prompt is empty", field="prompt")
        if min(prompt_ids) < 0 or max(prompt_ids) >= self.vocab_size:  # in C: a long history's ids
            raise InvalidRequest(f"prompt token ids must be in [0, {self.vocab_size})", field="prompt_ids")
        if not has_media and not self.multimodal_ids.isdisjoint(prompt_ids):
            raise InvalidRequest(
                "the prompt holds audio/image/video placeholder tokens but no media", field="prompt_ids"
            )

    def check_answer(self, params: ThinkerParams, spoken: list[int] | None) -> list[int]:
        """A resumed request's answer so far (ThinkerOpen.answer_ids), checked: generated tokens,
        short of max_tokens."""
        answer = list(params.answer_ids)
        if not answer:
            return answer
        if spoken is not None or params.encode_only:
            raise InvalidRequest("answer_ids continues a generated answer", field="answer_ids")
        if len(answer) >= params.max_tokens:
            raise InvalidRequest("answer_ids must be shorter than max_tokens", field="answer_ids")
        if min(answer) < 0 or max(answer) >= self.vocab_size:
            raise InvalidRequest(f"answer_ids must be in [0, {self.vocab_size})", field="answer_ids")
        return answer

    @staticmethod
    def take_answer(answer: list[int], detok: IncrementalDetokenizer, matcher: Any) -> None:
        """A resumed request's answer so far through its detokenizer (text after it continues where
        the first replica's left off, mid-character included) and its grammar, where they stand."""
        for token in answer:
            detok.add(token)
            if matcher is not None and not matcher.accept_token(token):
                raise InvalidRequest("the answer so far breaks its output grammar", field="answer_ids")

    def check_budget(
        self, prompt_ids: list[int], params: ThinkerParams, spoken: list[int] | None
    ) -> list[int] | None:
        """max_tokens and the model length; for a given answer its ids (`spoken`, or encoded here
        when the caller had not), which then take the place of max_tokens. Validates the sampling."""
        if not params.max_tokens >= 1:
            raise InvalidRequest("max_tokens must be at least 1", field="max_tokens")
        if params.assistant_text is not None:
            # A given answer takes what it is, up to max_tokens; the rest of the budget is not held.
            spoken = spoken if spoken is not None else self.encode_assistant_text(params.assistant_text)
            self._check_spoken(prompt_ids, spoken, params)
        elif len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise InvalidRequest(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
                f"model length {self.max_model_len}",
                field="max_tokens",
            )
        params.sampling.validate()
        return spoken if params.assistant_text is not None else None

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

    def detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.tokenizer)


def spoken_piece(
    prompt_ids: list[int], spoken: list[int], generated: list[int], detok: IncrementalDetokenizer
) -> ThinkerOutput:
    """The next piece of a given answer after the `generated` ids already sent (extended here), as
    the output a generated one would have been: the first carries the prompt ids, the last ends
    with finish "stop". Pieces are small so the talker can start on the first while the rest
    queues."""
    first = not generated
    start = len(generated)
    piece = spoken[start : start + SPOKEN_PIECE_TOKENS]
    generated.extend(piece)
    finished = len(generated) == len(spoken)
    delta = "".join(detok.add(t) for t in piece)
    if finished:
        delta += detok.flush()
    return ThinkerOutput(
        token_ids=piece,
        text_delta=delta,
        index=start,
        finished=finished,
        finish_reason="stop" if finished else None,
        prompt_ids=list(prompt_ids) if first else None,
    )
