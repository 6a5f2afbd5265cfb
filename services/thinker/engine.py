"""Thinker engine: prefill + batched decode of the Qwen3-Omni text model.

Part of the qwen3_omni family: built by `omnistream.qwen3_omni.family`, which callers go through.

Per step it emits the new token id and its text delta. The talker needs nothing else for text
prompts: it holds the thinker's embedding table and turns ids into its own text rows, so what the
thinker sends per step never grows with the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from omnistream.chat_encoding import ChatEncoder
from omnistream.detokenizer import IncrementalDetokenizer
from omnistream.engine import Engine, OutputStream, RequestState
from omnistream.errors import InvalidRequest
from omnistream.kvcache import SlotKVCache
from omnistream.load_options import LoadOptions
from omnistream.qwen3_omni.checkpoint import load_stage, load_tokenizer
from omnistream.sampling import choose
from omnistream.stage_chain import ThinkerParams  # the open params are part of the stage chain


@dataclass
class ThinkerOutput:
    token_ids: list[int]
    text_delta: str
    index: int  # index of the first token in `token_ids` among the generated tokens
    finished: bool = False
    finish_reason: str | None = None
    prompt_ids: list[int] | None = None  # only on the first output


@dataclass
class _ThinkerState(RequestState):
    prompt_ids: list[int] = field(default_factory=list)
    params: ThinkerParams = field(default_factory=ThinkerParams)
    generator: torch.Generator | None = None
    generated: list[int] = field(default_factory=list)
    detok: IncrementalDetokenizer | None = None
    next_token: int | None = None  # sampled, not yet fed back


class ThinkerEngine(Engine):
    name = "thinker"

    def __init__(
        self,
        model_dir: str,
        options: LoadOptions = LoadOptions(),
        max_batch: int = 16,
        max_model_len: int = 4096,
        max_requests: int | None = None,
        output_capacity: int = 512,
    ) -> None:
        super().__init__(max_requests=max_requests or max_batch * 4, output_capacity=output_capacity)
        holder = load_stage("thinker", model_dir, options)
        self.config = holder.config
        self.thinker = holder.thinker
        self.lm = self.thinker.model.language_model
        self.tokenizer = load_tokenizer(model_dir)
        self.device = options.device
        text = self.config.thinker_config.text_config
        self.vocab_size = text.vocab_size
        self.eos_ids = {self.config.im_end_token_id}
        if self.tokenizer.eos_token_id is not None:
            self.eos_ids.add(self.tokenizer.eos_token_id)
        self.max_model_len = max_model_len
        self.max_batch = max_batch
        self.chat = ChatEncoder(self.tokenizer, max_model_len)
        tc = self.config.thinker_config
        self.multimodal_ids = {tc.audio_token_id, tc.image_token_id, tc.video_token_id}
        self.cache = SlotKVCache.for_text_config(
            text, max_batch, max_model_len, options.torch_dtype(), options.device
        )

    # --- public API ---------------------------------------------------------------------------------
    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """The prompt ids the reference would see for a chat (ChatML, generation prompt added), except
        that special-token strings typed by a user stay text (see `ChatEncoder`). Slow for long
        prompts: servicers call it off the event loop."""
        return self.chat.encode(messages)

    def add_request(self, request_id: str, prompt_ids: list[int], params: ThinkerParams) -> OutputStream:
        if not prompt_ids:
            raise InvalidRequest("the prompt is empty", field="prompt")
        if any(not 0 <= t < self.vocab_size for t in prompt_ids):
            raise InvalidRequest(f"prompt token ids must be in [0, {self.vocab_size})", field="prompt_ids")
        if not self.multimodal_ids.isdisjoint(prompt_ids):
            # Their rows come from media encoders this thinker does not run (text-only input).
            raise InvalidRequest(
                "the prompt holds audio/image/video placeholder tokens but no media", field="prompt_ids"
            )
        if not params.max_tokens >= 1:
            raise InvalidRequest("max_tokens must be at least 1", field="max_tokens")
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise InvalidRequest(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
                f"model length {self.max_model_len}",
                field="max_tokens",
            )
        params.sampling.validate()
        state = _ThinkerState(
            request_id=request_id,
            output=self.new_output(),
            prompt_ids=list(prompt_ids),
            params=params,
            generator=params.sampling.generator(self.device),
            detok=IncrementalDetokenizer(self.tokenizer),
        )
        self._admit(state)
        return state.output

    # --- engine thread ------------------------------------------------------------------------------
    def _release(self, state: _ThinkerState) -> None:
        if state.slot is not None:
            self.cache.release(state.slot)
            state.slot = None

    def _schedule(self, candidates):
        prefill, decode = [], []
        for state in candidates:
            if state.finished or not state.output.has_room():
                continue
            if state.slot is None:
                if self.cache.free_slots > len(prefill) and len(prefill) < 1:
                    prefill.append(state)
            else:
                decode.append(state)
        for state in prefill:
            state.slot = self.cache.allocate()
        if not prefill and not decode:
            return None
        return prefill, decode

    def _work_states(self, work):
        prefill, decode = work
        return prefill + decode

    def _forward(self, states: list[_ThinkerState], ids: torch.Tensor) -> torch.Tensor:
        """Run the text model on `ids` [B, q] at each row's own position; return last-position logits."""
        self.cache.plan([s.slot for s in states], ids.shape[1])
        positions = self.cache.positions()
        out = self.lm(
            inputs_embeds=self.lm.embed_tokens(ids),
            position_ids=positions.unsqueeze(0).expand(3, -1, -1),
            attention_mask=self.cache.attention_mask(),
            cache=self.cache,
            use_cache=True,
        )
        logits = self.thinker.lm_head(out.last_hidden_state[:, -1])
        self.cache.commit()  # last: a step that raised left the lengths as they were (retry-safe)
        return logits

    def _run(self, work) -> None:
        prefill, decode = work
        device = self.device
        for state in prefill:
            ids = torch.tensor([state.prompt_ids], dtype=torch.long, device=device)
            logits = self._forward([state], ids)
            with self._row(state):
                self._accept(state, logits[0], first=True)
        decode = [s for s in decode if not s.finished]
        if decode:
            self.stats.last_batch_size = len(decode)
            ids = torch.tensor([[s.next_token] for s in decode], dtype=torch.long, device=device)
            logits = self._forward(decode, ids)
            for row, state in enumerate(decode):
                with self._row(state):
                    self._accept(state, logits[row], first=False)

    def _accept(self, state: _ThinkerState, logits: torch.Tensor, first: bool) -> None:
        if state.finished:  # aborted while the step ran
            return
        sampling = state.params.sampling
        # Like `generate`, the penalty covers the prompt too.
        previous = state.prompt_ids + state.generated if sampling.repetition_penalty != 1.0 else None
        token = choose(logits, sampling, state.generator, previous=previous)
        state.generated.append(token)
        is_eos = token in self.eos_ids and not state.params.ignore_eos
        done_length = len(state.generated) >= state.params.max_tokens
        finished = is_eos or done_length
        delta = state.detok.add(token)
        if finished:
            delta += state.detok.flush()
        state.next_token = token
        state.output.put(
            ThinkerOutput(
                token_ids=[token],
                text_delta=delta,
                index=len(state.generated) - 1,
                finished=finished,
                finish_reason=("stop" if is_eos else "length") if finished else None,
                prompt_ids=list(state.prompt_ids) if first else None,
            )
        )
        if finished:
            self._finish(state)
