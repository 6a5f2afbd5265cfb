"""Thinker engine: prefill + batched decode of the Qwen3-Omni text model.

Part of the qwen3_omni family: built by `omnistream.models.qwen3_omni.family`, which callers go through.
Its parts: the per-request state (`state.py`), a prompt's prefill pieces (`prefill`, an object of
`prefill.py`'s `PromptPrefill`, that runs them through this engine's `forward`), given answers
streamed without generation (`given_answers.py`'s `speak_next`); scheduling, the batched forward
and the batched choice stay here.

Per step it emits the new token id and its text delta. The talker needs nothing else for text
prompts: it holds the thinker's embedding table and turns ids into its own text rows, so what the
thinker sends per step never grows with the prompt. A prompt with media also sends, once with its
first output, the deep hidden rows of its audio/image/video positions (the talker cannot make those).

Every prompt is prefilled in pieces: all prefills of a step together take at most `prefill_chunk`
positions, and each step also decodes the running requests, so a long prompt holds them for one
piece at a time instead of its whole length. A piece's forward advances the KV lengths only once it
has run, so a failed piece leaves nothing behind (it fails its request alone: prefill forwards are
one request each).

A request with media goes through three phases on the engine thread: encode (its media in slices,
batched with other requests' slices, one slice budget per step so running requests keep decoding),
prefill (the prompt with the encoder rows in, at the model's 3-D M-RoPE positions), then decode at
sequence position + its rope delta, batched with everyone else.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from omnistream.engine.batch_sampler import BatchSampler, RowSampling
from omnistream.engine.chat_encoding import Tools
from omnistream.engine.detokenizer import IncrementalDetokenizer
from omnistream.engine.engine import Engine, present
from omnistream.engine.grammar import DEFAULT_COMPILE_TIMEOUT_S, BatchMask, Grammars, MaskFill
from omnistream.engine.kvcache import SlotKVCache
from omnistream.engine.load_options import (
    DEFAULT_MAX_BATCH,
    DEFAULT_PREFILL_CHUNK,
    LoadOptions,
    is_accelerator,
)
from omnistream.engine.output_stream import OutputStream
from omnistream.engine.prefix_cache import PrefixCache
from omnistream.engine.token_memo import TokenMemo
from omnistream.models.qwen3_omni.checkpoint import load_stage, load_tokenizer
from omnistream.models.qwen3_omni.memory import default_prefix_cache_bytes
from omnistream.models.qwen3_omni.thinker.audio_features import CachedAudioFeatures
from omnistream.models.qwen3_omni.thinker.given_answers import speak_next
from omnistream.models.qwen3_omni.thinker.media_item import item_digests
from omnistream.models.qwen3_omni.thinker.media_prompt import MediaPrompt, MediaPromptBuilder, load_processor
from omnistream.models.qwen3_omni.thinker.prefill import PromptPrefill
from omnistream.models.qwen3_omni.thinker.prefix import ThinkerPrefixes
from omnistream.models.qwen3_omni.thinker.state import _Step, _ThinkerState
from omnistream.models.qwen3_omni.thinker.text import ThinkerOutput, ThinkerText
from omnistream.models.qwen3_omni.thinker.thinker_media import (
    PromptEmbedding,
    Slice,
    check_media_prompt,
    encode_slices,
    plan_slices,
)
from omnistream.request.errors import InternalError, InvalidRequest
from omnistream.request.stage_chain import ThinkerParams  # the open params are part of the stage chain
from omnistream.request.structured import StructuredOutput

log = logging.getLogger(__name__)


class ThinkerEngine(Engine[_ThinkerState, _Step]):
    """The thinker stage: the engine thread, admission, scheduling and the batched forward and choice;
    a prompt's prefill pieces are its `prefill` part's."""

    name = "thinker"
    # Its text runs far ahead of the talker: after a request's first token and its first text, its
    # tokens may leave a few steps together (a message a step and request at concurrency 10 cost
    # the text pace), while the first text a client waits for leaves at once.
    hand_off_every_step = False

    def __init__(
        self,
        model_dir: str,
        options: LoadOptions = LoadOptions(),
        max_batch: int = DEFAULT_MAX_BATCH,
        max_model_len: int = 4096,
        max_requests: int | None = None,
        output_capacity: int = 512,
        encode_budget: int | None = None,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        prefix_cache_bytes: int | None = None,
        grammar_timeout: float = DEFAULT_COMPILE_TIMEOUT_S,
    ) -> None:
        """`prefix_cache_bytes`: the prefix cache's budget (prefix.py); None: half the KV slots'
        bytes (memory.py's default), 0: off. `grammar_timeout`: how long a request's output grammar
        may take to compile before the request is refused (grammar.py)."""
        super().__init__(max_requests=max_requests or max_batch * 4, output_capacity=output_capacity)
        holder = load_stage("thinker", model_dir, options)
        self.config = holder.config
        self.thinker = holder.thinker
        self.lm = self.thinker.model.language_model
        self.tokenizer = load_tokenizer(model_dir)
        self.device = options.device
        self.dtype = options.torch_dtype()
        text = self.config.thinker_config.text_config
        # The text rules (encoding, request checks, given answers) the vLLM thinker shares.
        self.text = ThinkerText(self.config, self.tokenizer, max_model_len)
        self.vocab_size = self.text.vocab_size
        self.eos_ids = self.text.eos_ids
        self.max_model_len = max_model_len
        self.max_batch = max_batch
        self.chat = self.text.chat
        tc = self.config.thinker_config
        self.multimodal_ids = self.text.multimodal_ids
        self.processor = load_processor(model_dir, self.tokenizer)
        # Spoken turns re-sent by later turns keep their features (audio_features.py).
        self.processor.feature_extractor = CachedAudioFeatures(self.processor.feature_extractor)
        self.media_prompts = MediaPromptBuilder(self.processor, self.chat, self.thinker, max_model_len)
        # Encoder input units (mel frames / vision patches) per step, shared by all requests: a slice
        # is at most this much, so decode steps wait for at most one slice. Audio slices are whole
        # attention windows (`n_window_infer` frames).
        audio = tc.audio_config
        self.audio_window = audio.n_window_infer
        self.encode_budget = max(encode_budget or 4 * audio.n_window_infer, self.audio_window)
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be at least 1, got {prefill_chunk}")
        # Prompt positions prefilled per step, all requests together (at least one piece a step).
        self.prefill_chunk = prefill_chunk
        self.cache = SlotKVCache.for_text_config(
            text, max_batch, max_model_len, options.torch_dtype(), options.device
        )
        kv_bytes = sum(t.numel() * t.element_size() for t in self.cache.keys + self.cache.values)
        budget = default_prefix_cache_bytes(kv_bytes) if prefix_cache_bytes is None else prefix_cache_bytes
        # Its blocks hold deep rows of the accept layer: a change of layer clears it (`accept_layer`).
        self.prefix_cache: PrefixCache = PrefixCache(budget, namespace=b"thinker")
        self.prefixes = ThinkerPrefixes(self.prefix_cache, self.cache, self.multimodal_ids, self.config)
        # One batched choice per step; its presence masks (repetition penalty) live per KV slot.
        self.sampler = BatchSampler(self.vocab_size, options.device, slots=max_batch)
        # Grammar-constrained decoding (tool calls, response_format): compiled grammars kept per
        # spec, one bitmask a step over the batch (grammar.py). The end of turn ends a grammar.
        self.grammars = Grammars(
            self.tokenizer, self.vocab_size, self.eos_ids, timeout=grammar_timeout, stats=self.stats
        )
        self.grammar_mask = BatchMask(self.vocab_size, max_batch, additive=not is_accelerator(self.device))
        self.prefill = PromptPrefill(
            model=self,
            thinker_model=self.thinker.model,
            language_model=self.lm,
            config=self.config,
            device=self.device,
            accept_layer=self.config.talker_config.accept_hidden_layer,
            multimodal_ids=self.multimodal_ids,
        )

    @property
    def accept_layer(self) -> int:
        """The layer whose hidden rows at a media prompt's multimodal positions go to the talker
        (the prefill's; settable, as a test of another layer does)."""
        return self.prefill.accept_layer

    @accept_layer.setter
    def accept_layer(self, layer: int) -> None:
        self.prefill.accept_layer = layer
        self.prefix_cache.clear()

    # --- public API ---------------------------------------------------------------------------------
    def encode_chat(
        self, messages: list[dict[str, Any]], tools: Tools = None, memo: TokenMemo | None = None
    ) -> list[int]:
        """See `ThinkerText.encode_chat` (slow for long prompts: call it off the event loop)."""
        return self.text.encode_chat(messages, tools, memo)

    def encode_assistant_text(self, text: str) -> list[int]:
        """See `ThinkerText.encode_assistant_text` (call it off the event loop)."""
        return self.text.encode_assistant_text(text)

    def prepare_media(
        self,
        messages: list[dict[str, Any]],
        use_audio_in_video: bool = False,
        tools: Tools = None,
        memo: TokenMemo | None = None,
    ) -> MediaPrompt:
        """A chat with media run through the model's processor: ids with expanded placeholders,
        encoder inputs, 3-D positions. CPU-heavy (feature extraction): call it off the event loop.
        `memo`: the conversation's last prompt text and ids (`MediaPromptBuilder.build`)."""
        prompt = self.media_prompts.build(messages, use_audio_in_video, tools, memo)
        if self.prefix_cache.enabled:  # the items' digests, here rather than on the engine thread
            prompt.digests = item_digests(prompt)
        return prompt

    async def compile_grammar(self, structured: StructuredOutput) -> Any:
        """The request's output grammar compiled (or found compiled) off the event loop, within the
        compile bound; pass it to `add_request` as `grammar`. InvalidRequest naming the client's
        param when it does not compile, or not in time."""
        return await self.grammars.compile_async(structured)

    def add_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: ThinkerParams,
        media: MediaPrompt | None = None,
        spoken: list[int] | None = None,
        grammar: Any = None,
    ) -> OutputStream[ThinkerOutput]:
        """`spoken`: `encode_assistant_text(params.assistant_text)` when the caller already ran it
        off the event loop (else it runs here). `grammar`: `compile_grammar(params.structured_output)`
        when the caller already awaited it (else it is compiled here, blocking up to the bound)."""
        self.text.check_ids(prompt_ids, has_media=media is not None)
        if media is not None:
            if list(prompt_ids) != media.prompt_ids:
                raise InvalidRequest("the prompt ids are not those of the media prompt", field="prompt_ids")
            check_media_prompt(media, prompt_ids, self.config)
            media = media.to(self.device, self.dtype)  # once, here: see MediaPrompt.to
        spoken = self.text.check_budget(prompt_ids, params, spoken)
        matcher = None
        if params.structured_output is not None and spoken is None:  # a given answer generates nothing
            compiled = grammar if grammar is not None else self.grammars.compile(params.structured_output)
            matcher = self.grammars.matcher(compiled)
        state = _ThinkerState(
            request_id=request_id,
            output=self.new_output(),
            prompt_ids=list(prompt_ids),
            params=params,
            generator=params.sampling.generator(self.device),
            detok=IncrementalDetokenizer(self.tokenizer),
            media=media,
            spoken=spoken,
            matcher=matcher,
            background=params.background,
        )
        if media is not None:
            merge = self.config.thinker_config.vision_config.spatial_merge_size
            state.slices = plan_slices(media, self.audio_window, self.encode_budget, merge)
            state.rope_delta = media.rope_delta
        self.admit(state)
        return state.output

    # --- engine thread ------------------------------------------------------------------------------
    def stop(self) -> None:
        super().stop()
        self.grammars.close()
        self.grammar_mask.close()

    def _release(self, state: _ThinkerState) -> None:
        state.matcher = None  # finished, failed or aborted: its grammar state goes with it
        if state.prompt_store_due:  # ended before its second token: the prompt's blocks go now
            self._store_prompt(state)
        if state.slot is not None:
            self.cache.release(state.slot)
            state.slot = None

    def _schedule(self, candidates: list[_ThinkerState]) -> _Step | None:
        encode: list[tuple[_ThinkerState, Slice]] = []
        budget = self.encode_budget
        prefill: list[tuple[_ThinkerState, int]] = []
        positions = self.prefill_chunk  # prefill budget of this step
        free = self.cache.free_slots
        decode: list[_ThinkerState] = []
        spoken: list[_ThinkerState] = []
        plan: list[_ThinkerState] = []
        for state in candidates:
            if state.finished or not state.output.has_room():
                continue
            if not state.prefix_planned:  # its cached prefix is looked up before any work
                if state.media is not None:
                    plan.append(state)  # a step of its own: its media's digests read all of it
                    continue
                self._plan_prefix(state)  # tokens only: a few hashes, here under the lock
            if state.spoken is not None:
                spoken.append(state)
                continue
            if state.slices:
                # Oldest first; each step takes slices up to the budget (at least one).
                while state.slices and (not encode or state.slices[0].cost <= budget):
                    piece = state.slices.pop(0)
                    budget -= piece.cost
                    encode.append((state, piece))
                continue
            if state.slot is None or state.next_token is None:
                # Not (fully) prefilled yet. Oldest first, each takes what is left of the budget.
                if positions > 0 and (state.slot is not None or free > 0):
                    # A reused prefix (loaded when the piece runs) takes nothing of the budget.
                    start = state.reuse[1] if state.reuse is not None else state.prefilled
                    take = min(len(state.prompt_ids) - start, positions)
                    positions -= take
                    free -= state.slot is None
                    prefill.append((state, take))
            else:
                decode.append(state)
        for state, _ in prefill:
            if state.slot is None:
                state.slot = self.cache.allocate()
        if not encode and not prefill and not decode and not spoken and not plan:
            return None
        return _Step(encode, prefill, decode, spoken, plan=plan)

    def _plan_prefix(self, state: _ThinkerState) -> None:
        try:
            self.prefixes.plan(state)
        except Exception:  # a lookup that fails costs the reuse, never the request
            log.exception("thinker: the prefix lookup of %s failed", state.request_id)
            state.prefix_planned, state.reuse = True, None

    def _work_states(self, work: _Step) -> list[_ThinkerState]:
        # Not the prefills: each runs alone and answers for itself (see `_run`); one whose piece did
        # not run because the encode raised first takes that piece again next step.
        seen = {id(s): s for s, _ in work.encode}
        seen.update((id(s), s) for s in work.decode)  # given answers run alone in `_row`: never suspects
        return list(seen.values())

    def _step_failed(self, work: _Step, error: Exception) -> None:
        # Slices taken for a step that raised before their rows were kept go back for a retry.
        if not work.encoded:
            for state, piece in reversed(work.encode):
                state.slices.insert(0, piece)
        super()._step_failed(work, error)

    def forward(
        self,
        states: Sequence[_ThinkerState],
        ids: torch.Tensor | None,
        embedding: PromptEmbedding | None = None,
        positions: torch.Tensor | None = None,
        commit: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the text model on `ids` [B, q] (or a prompt embedding) at each row's own position;
        return last-position logits and the last hidden states. `commit=False`: the caller advances
        the lengths once the step's tokens are chosen (a batched step retried alone after a failed
        choice must find the lengths as they were)."""
        q = ids.shape[1] if ids is not None else present(embedding).embeds.shape[1]
        self.cache.plan([s.held_slot for s in states], q)
        if positions is None:
            positions = self.cache.positions()
            deltas = [s.rope_delta for s in states]
            if any(deltas):  # M-RoPE requests decode at sequence position + their delta
                offset = torch.tensor(deltas, dtype=torch.float32, device=positions.device).view(-1, 1)
                positions = positions.float() + offset
            positions = positions.unsqueeze(0).expand(3, -1, -1)
        extra: dict[str, Any] = {}
        if embedding is not None:
            inputs = embedding.embeds
            if embedding.deepstack is not None:
                extra = {
                    "visual_pos_masks": embedding.visual_mask,
                    "deepstack_visual_embeds": embedding.deepstack,
                }
        else:
            inputs = self.lm.embed_tokens(ids)
        out = self.lm(
            inputs_embeds=inputs,
            position_ids=positions,
            attention_mask=self.cache.attention_mask(),
            cache=self.cache,
            use_cache=True,
            **extra,
        )
        logits = self.thinker.lm_head(out.last_hidden_state[:, -1])
        if commit:  # last: a step that raised left the lengths as they were (retry-safe)
            self.cache.commit()
        return logits, out.last_hidden_state

    def _run(self, work: _Step) -> None:
        device = self.device
        for state in work.plan:
            self._plan_prefix(state)
        for state in work.spoken:
            with self.row(state):
                if speak_next(state):
                    self.finish(state)
        if work.encode:
            results = encode_slices(self.thinker.model, [piece for _, piece in work.encode])
            for (state, piece), (rows, deep) in zip(work.encode, results, strict=True):
                state.encoded.add(piece, rows, deep)
            work.encoded = True
        for state, take in work.prefill:
            if state.finished:  # aborted meanwhile
                continue
            self.stats.last_prefill_rows += take
            try:
                if state.reuse is not None:
                    self.prefixes.load(state)
                done = self.prefill.piece(state, take)
                token = None if done is None else self.choose([state], done[0], first=True)[0]
            except Exception as exc:  # one request's forward: the failure is that request's alone
                self._states_failed([state], exc)
                continue
            if done is not None:
                with self.row(state):
                    self._accept(state, present(token), first=True, hidden=done[1])
        decode = [s for s in work.decode if not s.finished]
        if decode:
            self.stats.last_batch_size = len(decode)
            self.stats.last_units = len(decode)  # one token each (omnistream/service/speed.py)
            ids = torch.tensor([[s.next_token] for s in decode], dtype=torch.long, device=device)
            filling = self._start_mask(decode)  # the grammar's work beside the forward
            try:
                logits, _ = self.forward(decode, ids, commit=False)
            finally:
                if filling is not None:  # the next fill must not start under this one
                    filling.future.exception()
            tokens = self.choose(decode, logits, first=False, filling=filling)
            self.cache.commit()
            for state, token in zip(decode, tokens, strict=True):
                with self.row(state):
                    self._accept(state, token, first=False)
            for state in decode:  # their second token is on its way: their prompts' blocks now
                if state.prompt_store_due:
                    self._store_prompt(state)

    def _store_prompt(self, state: _ThinkerState) -> None:
        state.prompt_store_due = False
        self.prefixes.store(state, state.prompt_deep, answer=False)

    def _start_mask(self, states: Sequence[_ThinkerState]) -> MaskFill | None:
        """The grammar rows of a step's batch, filling in the mask's thread while the forward runs
        (None: no row has a grammar)."""
        constrained = [(row, s) for row, s in enumerate(states) if s.matcher is not None and not s.finished]
        if not constrained:
            return None
        return self.grammar_mask.start(
            [present(s.matcher) for _, s in constrained], [r for r, _ in constrained]
        )

    def choose(
        self,
        states: Sequence[_ThinkerState],
        logits: torch.Tensor,
        first: bool,
        filling: MaskFill | None = None,
    ) -> list[int]:
        """The next token of every row of the last forward ([B, V] logits), batched: one copy of the
        ids to the host per step. Like `generate`, the repetition penalty covers the prompt too: a
        request's presence mask starts from its prompt on its first token.

        Rows with a grammar choose only among the tokens it allows next: one bitmask for the batch,
        filled for those rows (`filling`: in the mask's thread while the forward ran; else here) and
        applied to their logits alone. A grammar that fails here fails its request only (its row's
        token is then dropped by `_accept`)."""
        if first:
            for state in states:
                if state.params.sampling.repetition_penalty != 1.0:
                    self.sampler.reset(state.held_slot, state.prompt_ids)
        constrained = [(row, s) for row, s in enumerate(states) if s.matcher is not None and not s.finished]
        if filling is not None:  # started before the forward: the rows that had a grammar then
            constrained = [(row, states[row]) for row in filling.rows]
        if constrained:
            masked = [row for row, _ in constrained]
            try:
                if filling is not None:
                    filling.wait()
                    self.grammar_mask.apply_filled(logits, filling)
                else:
                    self.grammar_mask.fill_rows([present(s.matcher) for _, s in constrained], masked)
                    self.grammar_mask.apply(logits, masked)
            except Exception:  # some row's grammar failed: row by row, each failure its request's alone
                masked = []
                for row, state in constrained:
                    with self.row(state):
                        self.grammar_mask.fill(present(state.matcher), row)
                        masked.append(row)
                self.grammar_mask.apply(logits, masked)
        rows = [RowSampling(s.params.sampling, s.generator) for s in states]
        return self.sampler.sample(logits, rows, self.cache.rows).tolist()

    def _accept(
        self, state: _ThinkerState, token: int, first: bool, hidden: torch.Tensor | None = None
    ) -> None:
        if state.finished:  # aborted while the step ran
            return
        state.generated.append(token)
        is_eos = token in self.eos_ids and not state.params.ignore_eos
        if state.matcher is not None:
            if not state.matcher.accept_token(token):
                raise InternalError(f"the output grammar refused token {token}, which its mask allowed")
            # Complete (its stop token taken): the answer ends here, even with ignore_eos.
            is_eos = is_eos or state.matcher.is_terminated()
        done_length = len(state.generated) >= state.params.max_tokens
        finished = is_eos or done_length
        detok = present(state.detok)
        delta = detok.add(token)
        if finished:
            delta += detok.flush()
        if (delta and not state.text_out) or finished:
            state.text_out = True
            self.hand_off()
        state.next_token = token
        positions = layout = None
        if hidden is not None:  # the deep rows of the multimodal positions, in order
            assert state.media is not None
            positions = [i for i, t in enumerate(state.prompt_ids) if t in self.multimodal_ids]
            layout = state.media.layout
            state.media, state.embedding, state.deep_rows = None, None, []  # spent
        state.output.put(
            ThinkerOutput(
                token_ids=[token],
                text_delta=delta,
                index=len(state.generated) - 1,
                finished=finished,
                finish_reason=("stop" if is_eos else "length") if finished else None,
                prompt_ids=list(state.prompt_ids) if first else None,
                cached_tokens=state.cached_tokens if first else 0,
                prompt_hidden=hidden,
                multimodal_positions=positions,
                media_layout=layout,
            )
        )
        # The prompt's blocks are stored once its second token is on its way too (a copy of its KV
        # that the client need not wait for: when the first token is no text yet, as a byte of an
        # unfinished character, the second is the first the client sees), at the latest when the
        # request ends, still on this thread before the slot can go: what the next turn finds is
        # all there. An answer that ends here stores the prompt's blocks with its own.
        if first and self.prefixes.enabled:
            state.prompt_deep = hidden
            state.prompt_store_due = not finished
        if finished:
            state.prompt_store_due = False
            self.prefixes.store(state, hidden if first else None, answer=True)
            self.finish(state)
