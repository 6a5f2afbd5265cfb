"""Thinker engine: prefill + batched decode of the Qwen3-Omni text model.

Part of the qwen3_omni family: built by `omnistream.models.qwen3_omni.family`, which callers go through.
Its parts: the per-request state (`state.py`), a prompt's prefill pieces (`prefill`, an object of
`prefill.py`'s `PromptPrefill`, that runs them through this engine's `forward`), given answers
streamed without generation (`given_answers.py`'s `speak_next`), and its base `ThinkerDecode`
(`decode.py`: the batched forward, the token choice, what a chosen token emits); admission and
scheduling stay here.

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
from typing import Any

import torch

from omnistream.engine.batch_sampler import BatchSampler
from omnistream.engine.chat_encoding import Tools
from omnistream.engine.detokenizer import IncrementalDetokenizer
from omnistream.engine.engine import present
from omnistream.engine.grammar import DEFAULT_COMPILE_TIMEOUT_S, BatchMask, Grammars
from omnistream.engine.kvcache import SlotKVCache
from omnistream.engine.load_options import is_accelerator
from omnistream.engine.output_stream import OutputStream
from omnistream.engine.prefix_cache import PrefixCache
from omnistream.engine.settings import ThinkerEngineSettings
from omnistream.engine.step_seeds import request_seed
from omnistream.engine.token_memo import TokenMemo
from omnistream.models.qwen3_omni.checkpoint import load_stage, load_tokenizer
from omnistream.models.qwen3_omni.memory import default_prefix_cache_bytes
from omnistream.models.qwen3_omni.thinker.audio_features import CachedAudioFeatures
from omnistream.models.qwen3_omni.thinker.decode import ThinkerDecode
from omnistream.models.qwen3_omni.thinker.encoded_windows import EncodedWindows, ahead_slices, encode_keeping
from omnistream.models.qwen3_omni.thinker.given_answers import speak_next
from omnistream.models.qwen3_omni.thinker.media_item import item_digests
from omnistream.models.qwen3_omni.thinker.media_prompt import (
    MediaPrompt,
    MediaPromptBuilder,
    continued,
    load_processor,
)
from omnistream.models.qwen3_omni.thinker.prefill import PromptPrefill
from omnistream.models.qwen3_omni.thinker.prefix import ThinkerPrefixes
from omnistream.models.qwen3_omni.thinker.state import _Step, _ThinkerState
from omnistream.models.qwen3_omni.thinker.text import ThinkerOutput, ThinkerText
from omnistream.models.qwen3_omni.thinker.thinker_media import (
    Slice,
    check_media_prompt,
    plan_slices,
)
from omnistream.request.errors import InvalidRequest
from omnistream.request.stage_chain import ThinkerParams  # the open params are part of the stage chain
from omnistream.request.structured import StructuredOutput

log = logging.getLogger(__name__)


class ThinkerEngine(ThinkerDecode):
    """The thinker stage: the engine thread, admission and scheduling; the batched forward, choice
    and emission are its base's (decode.py), a prompt's prefill pieces its `prefill` part's."""

    name = "thinker"
    # Its text runs far ahead of the talker: after a request's first token and its first text, its
    # tokens may leave a few steps together (a message a step and request at concurrency 10 cost
    # the text pace), while the first text a client waits for leaves at once.
    hand_off_every_step = False

    def __init__(
        self,
        model_dir: str,
        settings: ThinkerEngineSettings,
        *,
        output_capacity: int = 512,
        encode_budget: int | None = None,
        grammar_timeout: float = DEFAULT_COMPILE_TIMEOUT_S,
    ) -> None:
        """`settings` as `omnistream serve thinker` takes them (its prefix cache budget None: half
        the KV slots' bytes, memory.py's default; 0: off). `encode_budget`: encoder input units per
        step (None: four audio windows). `grammar_timeout`: how long a request's output grammar may
        take to compile before the request is refused (grammar.py)."""
        if settings.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be at least 1, got {settings.prefill_chunk}")
        super().__init__(max_requests=settings.request_limit, output_capacity=output_capacity)
        self.settings = settings
        max_batch, max_model_len = settings.max_batch, settings.max_model_len
        holder = load_stage("thinker", model_dir, settings)
        self.config = holder.config
        self.thinker = holder.thinker
        self.lm = self.thinker.model.language_model
        self.tokenizer = load_tokenizer(model_dir)
        self.device = settings.device
        self.dtype = settings.torch_dtype()
        text = self.config.thinker_config.text_config
        # The text rules (encoding, request checks, given answers) the vLLM thinker shares.
        self.text = ThinkerText(self.config, self.tokenizer, max_model_len)
        self.vocab_size = self.text.vocab_size
        self.eos_ids = self.text.eos_ids
        self.max_model_len = max_model_len
        self.max_batch = max_batch
        self.chat = self.text.chat
        self.multimodal_ids = self.text.multimodal_ids
        self.processor = load_processor(model_dir, self.tokenizer)
        # Spoken turns keep their features for later turns, and their frames while spoken (audio_features.py).
        self.processor.feature_extractor = features = CachedAudioFeatures(self.processor.feature_extractor)
        self.turn_frames = features.turns  # in Prometheus (omnistream/service/metrics.py)
        self.media_prompts = MediaPromptBuilder(self.processor, self.chat, self.thinker, max_model_len)
        # Encoder input units (mel frames / vision patches) per step, shared by all requests: a slice
        # is at most this much, so decode steps wait for at most one slice. Audio slices are whole
        # attention windows (`n_window_infer` frames).
        audio = self.config.thinker_config.audio_config
        self.audio_window = audio.n_window_infer
        self.encode_budget = max(encode_budget or 4 * audio.n_window_infer, self.audio_window)
        # Windows a realtime turn's audio had encoded while it was spoken (encoded_windows.py).
        self.encoded_windows = EncodedWindows()
        # Prompt positions prefilled per step, all requests together (at least one piece a step).
        self.prefill_chunk = settings.prefill_chunk
        self.cache = SlotKVCache.for_text_config(text, max_batch, max_model_len, self.dtype, self.device)
        kv_bytes = sum(t.numel() * t.element_size() for t in self.cache.keys + self.cache.values)
        prefix_cache_bytes = settings.prefix_cache_bytes
        budget = default_prefix_cache_bytes(kv_bytes) if prefix_cache_bytes is None else prefix_cache_bytes
        # Its blocks hold deep rows of the accept layer: a change of layer clears it (`accept_layer`).
        self.prefix_cache: PrefixCache = PrefixCache(budget, namespace=b"thinker")
        self.prefixes = ThinkerPrefixes(self.prefix_cache, self.cache, self.multimodal_ids, self.config)
        # One batched choice per step; its presence masks (repetition penalty) live per KV slot.
        self.sampler = BatchSampler(self.vocab_size, self.device, slots=max_batch)
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
        """The layer whose rows at multimodal positions go to the talker (settable, for tests)."""
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
        ahead: bool = False,
    ) -> MediaPrompt:
        """A chat with media run through the model's processor: ids with expanded placeholders,
        encoder inputs, 3-D positions. CPU-heavy (feature extraction): call it off the event loop.
        `memo` (the conversation's last prompt), `ahead` (a turn still spoken): `MediaPromptBuilder.build`."""
        prompt = self.media_prompts.build(messages, use_audio_in_video, tools, memo, ahead)
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
        answer = self.text.check_answer(params, spoken := self.text.check_budget(prompt_ids, params, spoken))
        matcher = None
        if params.structured_output is not None and spoken is None:  # a given answer generates nothing
            compiled = grammar if grammar is not None else self.grammars.compile(params.structured_output)
            matcher = self.grammars.matcher(compiled)
        state = _ThinkerState(
            request_id=request_id,
            output=self.new_output(),
            prompt_ids=list(prompt_ids) + answer,  # a resumed answer is run as its prompt's end
            params=params,
            generator=params.sampling.generator(self.device),
            seed=request_seed(params.sampling.seed),
            answered=len(answer),
            detok=IncrementalDetokenizer(self.tokenizer),
            media=media if media is None or not answer else continued(media, answer),
            spoken=spoken,
            matcher=matcher,
            background=params.background,
        )
        self.text.take_answer(answer, present(state.detok), matcher)  # where it left text and grammar
        if media is not None:
            merge = self.config.thinker_config.vision_config.spatial_merge_size
            state.slices = plan_slices(media, self.audio_window, self.encode_budget, merge)
            state.rope_delta = media.rope_delta
        if params.encode_only:
            state.slices = ahead_slices(state.slices, self.audio_window)
            state.prefix_planned = True  # nothing of it is prefilled
        self.admit(state)
        return state.output

    def release_cache_scope(self, scope: bytes) -> None:
        super().release_cache_scope(scope)
        self.encoded_windows.release(scope)

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
            if state.params.encode_only:  # its windows are kept: it ends, answering nothing
                spoken.append(state)
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

    def _encode(
        self, pieces: list[tuple[_ThinkerState, Slice]]
    ) -> list[tuple[torch.Tensor, list[torch.Tensor] | None]]:
        """Each piece's rows, whole audio windows encoded ahead taken from `encoded_windows`."""
        asked = [(state.params.cache_scope, state.params.encode_only, piece) for state, piece in pieces]
        return encode_keeping(self.thinker.model, self.encoded_windows, self.audio_window, asked)

    def _encoded_ahead(self, state: _ThinkerState) -> None:
        """Work ahead is done: it ends with an empty answer (finish "stop"), its prompt ids first."""
        output = ThinkerOutput(
            token_ids=[], text_delta="", index=0, finished=True, finish_reason="stop",
            prompt_ids=list(state.prompt_ids),
        )  # fmt: skip
        state.output.put(output)
        self.finish(state)

    def _step_failed(self, work: _Step, error: Exception) -> None:
        # Slices taken for a step that raised before their rows were kept go back for a retry.
        if not work.encoded:
            for state, piece in reversed(work.encode):
                state.slices.insert(0, piece)
        super()._step_failed(work, error)

    def _run(self, work: _Step) -> None:
        device = self.device
        for state in work.plan:
            self._plan_prefix(state)
        for state in work.spoken:
            with self.row(state):
                if state.params.encode_only:
                    self._encoded_ahead(state)
                elif speak_next(state):
                    self.finish(state)
        if work.encode:
            for (state, piece), (rows, deep) in zip(work.encode, self._encode(work.encode), strict=True):
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
