"""Talker engine: codec frames from thinker tokens, batched across requests.

One step per frame: a batched talker forward yields codebook 0 of the next frame for every request
whose next text row is there, then the 15-step code predictor (KV-cached, batched) fills codebooks
1..15. A request whose next thinker token has not arrived waits; the others go on.

A request's prompt rows are prefilled in pieces: all prefills of a step together take at most
`prefill_chunk` rows, and the same step runs the others' frames, so a long prompt holds them for
one piece at a time. A piece advances the KV length only once its forward has run; a failing piece
fails its request alone (prefill forwards are one request each).

When not every request fits one step, the most urgent go first: candidates are taken by deadline
(omnistream/playout.py: when the request's listener runs dry, from the frames this stage emitted
since its first one, 80 ms each; before the first frame, arrival + the first-audio target), for the
prefill budget, the free KV slots and the frame rows alike. `max_step_batch` caps the requests that
take a frame step (default: every slotted one, `max_batch`); a request left out for a more urgent
one is counted in `stats.deferred`.

With static frames (`LoadOptions.static_frames`, `--static-frames`) a frame runs as two fixed-shape,
graph-capturable steps instead (omnistream/qwen3_omni/talker_frame.py: the code predictor's 15
codebooks, then the talker's decode, each with its sampling), captured as CUDA graphs with
`--cuda-graphs`; the codes are the same, the host dispatches a few ops per frame instead of thousands.

Part of the qwen3_omni family: built by `omnistream.qwen3_omni.family`, which callers go through.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from omnistream.batch_sampler import BatchSampler, RowSampling
from omnistream.engine import Engine, OutputStream, RequestState
from omnistream.errors import InvalidRequest
from omnistream.family import describe_loaded
from omnistream.kvcache import SlotKVCache
from omnistream.load_options import DEFAULT_PREFILL_CHUNK, LoadOptions
from omnistream.media import MediaLayout
from omnistream.playout import (
    DEFAULT_FIRST_AUDIO_TARGET_S,
    Playout,
    buffered_seconds,
    by_deadline,
    check_step_budget,
)
from omnistream.qwen3_omni.checkpoint import load_stage
from omnistream.qwen3_omni.code_predictor import CodePredictorRunner, batch_buckets
from omnistream.qwen3_omni.constants import DEFAULT_SPEAKER
from omnistream.qwen3_omni.talker_eos import EosMask
from omnistream.qwen3_omni.talker_frame import StaticTalkerFrame
from omnistream.qwen3_omni.talker_prompt import (
    ASSISTANT_PROMPT_TOKENS,
    TTS_EOS,
    TTS_PAD,
    TalkerPromptBuilder,
    assistant_start,
    user_positions,
)
from omnistream.qwen3_omni.talker_rope import talker_rope
from omnistream.sampling import SamplingParams
from omnistream.stage_chain import TalkerFeed, TalkerParams  # the edge's open params and payload

# A listener with less audio than this left is near running dry: new prompts then prefill at most
# URGENT_PREFILL_ROWS rows a step (a stream's first 2-frame chunk plays 137 ms; a step prefilling
# several 100-row prompts took about that long here).
NEAR_DRY_S = 0.4
URGENT_PREFILL_ROWS = 32

# The reference's code predictor samples with these whenever the talker samples.
CODE_PREDICTOR_TOP_K = 50
CODE_PREDICTOR_TOP_P = 0.8
CODE_PREDICTOR_SAMPLING = SamplingParams(
    temperature=1.0, top_k=CODE_PREDICTOR_TOP_K, top_p=CODE_PREDICTOR_TOP_P
)


@dataclass
class TalkerOutput:
    codes: list[int] | None  # 16 codes of one frame, or None on a bare end marker
    frame: int
    finished: bool = False
    finish_reason: str | None = None


@dataclass
class _TalkerState(RequestState):
    params: TalkerParams = field(default_factory=TalkerParams)
    speaker_id: int = 0
    generator: torch.Generator | None = None
    cp_generator: torch.Generator | None = None
    prompt_ids: list[int] | None = None
    multimodal_hidden: dict[int, torch.Tensor] | None = None
    media_layout: MediaLayout | None = None  # images/videos: the prompt takes 3-D positions
    rope_delta: float = 0.0
    stream: list[int] = field(default_factory=list)  # the assistant stream: prompt tail + generated
    input_done: bool = False
    frames: int = 0
    pending_code0: int | None = None
    past_hidden: torch.Tensor | None = None
    next_codec_sum: torch.Tensor | None = None  # codec part of the next talker input
    prefill_done: bool = False  # the whole prompt is in the KV cache (its first code 0 was taken)
    prompt_rows: torch.Tensor | None = None  # [1, rows, H] while the prompt is being prefilled
    prompt_positions: torch.Tensor | None = None  # [3, 1, rows] M-RoPE positions, for prompts with vision
    prefilled: int = 0  # prompt rows already in the KV cache
    playout: Playout = field(default_factory=lambda: Playout(0.0))  # set on admission


class TalkerEngine(Engine):
    name = "talker"

    def __init__(
        self,
        model_dir: str,
        options: LoadOptions = LoadOptions(),
        max_batch: int = 16,
        max_model_len: int = 8192,
        max_requests: int | None = None,
        output_capacity: int = 512,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        max_step_batch: int | None = None,
        first_audio_target: float = DEFAULT_FIRST_AUDIO_TARGET_S,
        static_frames: bool | None = None,
        graph_buckets: bool | None = None,
    ) -> None:
        super().__init__(max_requests=max_requests or max_batch * 4, output_capacity=output_capacity)
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be at least 1, got {prefill_chunk}")
        check_step_budget("max_step_batch", max_step_batch)
        if max_step_batch is not None and max_step_batch > max_batch:
            raise ValueError(f"max_step_batch ({max_step_batch}) cannot exceed max_batch ({max_batch})")
        # Prompt rows prefilled per step, all requests together (at least one piece a step).
        self.prefill_chunk = prefill_chunk
        # Requests that take a frame step per step, most urgent first (the rest wait a step).
        self.max_step_batch = max_step_batch or max_batch
        self.first_audio_target = first_audio_target
        holder = load_stage("talker", model_dir, options)
        self.config = holder.config
        self.talker = holder.talker
        self.cp = self.talker.code_predictor
        self.device = options.device
        self.dtype = options.torch_dtype()
        tc = self.config.talker_config
        self.speakers = {k.lower(): v for k, v in tc.speaker_id.items()}
        # Audio seconds one codec frame holds (80 ms for Qwen3-Omni): the playout clock's unit.
        self.frame_seconds = 1.0 / describe_loaded(self.config).frames_per_second
        # What a request that names no voice gets: the family default, if this checkpoint has it.
        self.default_speaker = DEFAULT_SPEAKER if DEFAULT_SPEAKER in self.speakers else min(self.speakers)
        self.num_groups = tc.num_code_groups
        self.codec_eos = tc.codec_eos_token_id
        vocab = tc.text_config.vocab_size
        self.suppress = torch.zeros(vocab, dtype=torch.bool, device=options.device)
        self.suppress[vocab - 1024 :] = True
        self.suppress[self.codec_eos] = False
        self.prompts = TalkerPromptBuilder(self.config, self.talker, holder.thinker.model.embed_tokens)
        self.hidden_width = self.talker.hidden_projection.linear_fc1.in_features  # the thinker's
        self.thinker_vocab = self.config.thinker_config.text_config.vocab_size
        text = tc.text_config
        self.max_batch = max_batch
        self.max_model_len = max_model_len
        # Static frames (omnistream/qwen3_omni/talker_frame.py): each frame as two fixed-shape,
        # graph-capturable steps; one more cache slot, the padding rows' scratch.
        static = options.static_frames if static_frames is None else static_frames
        slots = max_batch + 1 if static else max_batch
        self.cache = SlotKVCache.for_text_config(
            text, slots, max_model_len, options.torch_dtype(), options.device
        )
        # Codebooks 1..15: fixed-shape steps over a static cache (CUDA graphs with --cuda-graphs).
        # Graph buckets (powers of two, padded; None: with CUDA graphs) run on the CPU too, in tests.
        graph_buckets = options.graphs if graph_buckets is None else graph_buckets
        self.code_predictor = CodePredictorRunner(
            self.cp,
            max_batch,
            options.torch_dtype(),
            options.device,
            cuda_graphs=options.graphs and not static,  # static frames capture it themselves
            buckets=batch_buckets(max_batch) if graph_buckets else None,
        )
        # Batched choices: codebook 0 (suppressed ids, presence masks per KV slot for the penalty
        # over the request's codebook-0 history) and the code predictor's groups.
        self.sampler = BatchSampler(vocab, options.device, slots=slots, suppress=self.suppress)
        self.eos_mask = EosMask(vocab, self.codec_eos, slots, options.device)  # ignore_eos requests
        self.cp_sampler = BatchSampler(self.cp.config.vocab_size, options.device)
        self.frame: StaticTalkerFrame | None = None
        if static:
            self.frame = StaticTalkerFrame(
                self.talker,
                self.code_predictor,
                self.prompts,
                self.cache,
                self.sampler,
                self.cp_sampler,
                eos_mask=self.eos_mask,
                graph_buckets=graph_buckets,
                cuda_graphs=options.graphs,
            )

    # --- public API ---------------------------------------------------------------------------------
    def add_request(self, request_id: str, params: TalkerParams) -> OutputStream:
        speaker_id = self.speakers.get(params.speaker.lower())
        if speaker_id is None:
            raise InvalidRequest(
                f"unknown speaker {params.speaker!r}; choose from {sorted(self.speakers)}", field="speaker"
            )
        if not 1 <= params.max_frames <= self.max_model_len:
            raise InvalidRequest(f"max_frames must be in [1, {self.max_model_len}]", field="max_frames")
        params.sampling.validate("talker_")
        sampled = not params.sampling.greedy
        state = _TalkerState(
            request_id=request_id,
            output=self.new_output(),
            params=params,
            speaker_id=speaker_id,
            generator=params.sampling.generator(self.device),
            cp_generator=params.sampling.generator(self.device) if sampled else None,
        )
        state.playout = Playout(state.arrived, self.first_audio_target)
        if state.cp_generator is not None and params.sampling.seed is not None:
            state.cp_generator.manual_seed(params.sampling.seed + 1)
        self._admit(state)
        return state.output

    def feed_piece(self, request_id: str, piece: TalkerFeed) -> None:
        """`feed` with one payload of the thinker -> talker edge (omnistream/stage_chain.py): what
        the in-process pipeline and the talker servicer both hand over."""
        self.feed(
            request_id,
            piece.token_ids,
            piece.last,
            prompt_ids=piece.prompt_ids,
            multimodal_hidden=piece.multimodal_hidden,
            media_layout=piece.media_layout,
        )

    def feed(
        self,
        request_id: str,
        token_ids: list[int],
        last: bool,
        prompt_ids: list[int] | None = None,
        multimodal_hidden: dict[int, torch.Tensor] | None = None,
        media_layout: MediaLayout | None = None,
    ) -> None:
        """Give the talker more thinker output: the prompt once, then generated tokens as they come."""
        if any(not 0 <= t < self.thinker_vocab for t in token_ids):
            raise InvalidRequest(f"token ids must be in [0, {self.thinker_vocab})", field="token_ids")
        if multimodal_hidden is not None:
            # The engine, not its callers, puts what a request brings on its device and in its dtype,
            # once: rows decoded from the wire are float32 on the CPU, the projection may be bfloat16
            # on CUDA. Outside the lock: a device copy must not hold up the engine thread.
            multimodal_hidden = {p: row.to(self.device, self.dtype) for p, row in multimodal_hidden.items()}
        with self._cond:
            state = self._requests.get(request_id)
            if state is None:
                raise InvalidRequest(f"talker has no running request {request_id!r}", field="request_id")
            if state.input_done:
                raise InvalidRequest(f"request {request_id!r} already received its last input")
            if prompt_ids is not None:
                if state.prompt_ids is not None:
                    raise InvalidRequest("the prompt was already given", field="prompt_ids")
                if any(not 0 <= t < self.thinker_vocab for t in prompt_ids):
                    raise InvalidRequest(
                        f"prompt ids must be in [0, {self.thinker_vocab})", field="prompt_ids"
                    )
                cfg = self.config
                try:
                    start = assistant_start(prompt_ids, cfg.im_start_token_id, cfg.assistant_token_id)
                except ValueError as exc:
                    raise InvalidRequest(str(exc), field="prompt_ids") from exc
                prompt_rows = len(prompt_ids) + 9  # the user turns plus the assistant rows, at most
                if prompt_rows + state.params.max_frames > self.max_model_len:
                    raise InvalidRequest(
                        f"prompt ({len(prompt_ids)} tokens) + max_frames ({state.params.max_frames}) exceeds "
                        f"the talker length {self.max_model_len}",
                        field="max_frames",
                    )
                self._check_multimodal(prompt_ids, multimodal_hidden)
                state.prompt_ids = list(prompt_ids)
                state.stream = list(prompt_ids[start:])
                state.multimodal_hidden = multimodal_hidden
                state.media_layout = media_layout
            elif multimodal_hidden is not None or media_layout is not None:
                raise InvalidRequest("multimodal rows come with the prompt only", field="prompt_hidden")
            elif state.prompt_ids is None:
                raise InvalidRequest("the first talker input must carry the prompt ids", field="prompt_ids")
            state.stream.extend(token_ids)
            if last:
                state.input_done = True
                if len(state.stream) < ASSISTANT_PROMPT_TOKENS:
                    raise InvalidRequest("the talker needs at least one generated token to speak")
            self._cond.notify_all()

    def _check_multimodal(self, prompt_ids: list[int], hidden: dict[int, torch.Tensor] | None) -> None:
        """Rows and positions must match the prompt exactly before the request may join a batch:
        one row of the thinker's width per multimodal token of a user turn, and nothing else."""
        cfg = self.config
        mm_ids = self.prompts.multimodal_ids
        needed = {
            p
            for p in user_positions(prompt_ids, cfg.im_start_token_id, cfg.user_token_id)
            if prompt_ids[p] in mm_ids
        }
        given = hidden or {}
        for position, row in given.items():
            if not 0 <= position < len(prompt_ids) or prompt_ids[position] not in mm_ids:
                raise InvalidRequest(
                    f"multimodal position {position} holds no audio, image or video token of the prompt",
                    field="multimodal_positions",
                )
            if row.shape != (self.hidden_width,):
                raise InvalidRequest(
                    f"prompt_hidden rows must have width {self.hidden_width}, got {tuple(row.shape)}",
                    field="prompt_hidden",
                )
        missing = sorted(needed - set(given))
        if missing:
            raise InvalidRequest(
                f"prompt positions {missing[:8]} hold audio/image/video tokens but no prompt_hidden row "
                "was given for them",
                field="prompt_hidden",
            )

    # --- engine thread ------------------------------------------------------------------------------
    def _release(self, state: _TalkerState) -> None:
        if state.slot is not None:
            self.cache.release(state.slot)
            state.slot = None

    def _text_row_ready(self, state: _TalkerState) -> bool:
        # Frame k+1 consumes assistant-stream token 4 + k, or the end marker once the stream ended.
        return len(state.stream) > ASSISTANT_PROMPT_TOKENS + state.frames - 1 or state.input_done

    def _schedule(self, candidates):
        now = time.monotonic()
        prefill: list[tuple[_TalkerState, int]] = []  # (request, rows it may prefill this step)
        predict, decode = [], []
        rows = self.prefill_chunk  # prefill budget of this step
        if self._listener_near_dry(candidates, now):
            # New requests' prompts are work for listeners still far from running dry: while one
            # that is already playing has little left, they get a small piece a step, so the step
            # that brings its next frame stays short.
            rows = min(rows, URGENT_PREFILL_ROWS)
        free = self.cache.free_slots
        room = self.max_step_batch  # requests that may take a frame step
        deferred = 0
        for state in by_deadline(candidates):
            if state.finished or not state.output.has_room():
                continue
            if not state.prefill_done:
                if rows <= 0:
                    continue
                if state.slot is None:
                    ready = state.prompt_ids is not None and len(state.stream) >= ASSISTANT_PROMPT_TOKENS
                    if not ready or free <= 0:
                        continue
                    free -= 1
                if state.prompt_rows is None:  # its row count is known once its rows are built
                    take = rows
                else:
                    take = min(rows, state.prompt_rows.shape[1] - state.prefilled)
                rows -= take
                prefill.append((state, take))
            elif state.pending_code0 is not None or self._text_row_ready(state):
                if room <= 0:  # the step is full of more urgent requests: this one waits a step
                    deferred += 1
                    continue
                room -= 1
                (predict if state.pending_code0 is not None else decode).append(state)
        for state, _ in prefill:
            if state.slot is None:
                state.slot = self.cache.allocate()
                self.eos_mask.set(state.slot, state.params.ignore_eos)
        if not (prefill or predict or decode):
            return None
        self._deferred(deferred)
        self.stats.last_buffered = buffered_seconds([s for s, _ in prefill] + predict + decode, now)
        return prefill, predict, decode

    def _listener_near_dry(self, candidates, now: float) -> bool:
        """Is a request that has started playing within `NEAR_DRY_S` of running dry?"""
        return any(
            s.prefill_done and s.playout.first_output is not None and s.playout.buffered(now) < NEAR_DRY_S
            for s in candidates
            if not s.finished
        )

    def _work_states(self, work):
        _, predict, decode = work  # not the prefills: each runs alone and answers for itself
        return predict + decode

    def _talker_forward(
        self,
        states: list[_TalkerState],
        embeds: torch.Tensor,
        positions: torch.Tensor | None = None,
        commit: bool = True,
    ) -> torch.Tensor:
        """Talker model on [B, q, H] rows; returns the last position's normed hidden [B, 1, H].
        `commit=False`: the caller advances the lengths once codebook 0 is chosen (a batched step
        retried alone after a failed choice must find the lengths as they were)."""
        self.cache.plan([s.slot for s in states], embeds.shape[1])
        if positions is None:
            positions = self.cache.positions()
            deltas = [s.rope_delta for s in states]
            if any(deltas):  # prompts with vision decode at sequence position + their delta
                offset = torch.tensor(deltas, dtype=torch.float32, device=positions.device).view(-1, 1)
                positions = positions.float() + offset
            positions = positions.unsqueeze(0).expand(3, -1, -1)
        out = self.talker.model(
            inputs_embeds=embeds,
            position_ids=positions,
            attention_mask=self.cache.attention_mask(),
            cache=self.cache,
            use_cache=True,
        )
        if commit:
            self.cache.commit()
        return out.last_hidden_state[:, -1:]

    def _take_code0(
        self, states: list[_TalkerState], hidden: torch.Tensor, first: bool = False, commit: bool = False
    ) -> None:
        """Codebook 0 of every row of the last talker forward, chosen in one batch (one copy of the
        ids to the host). The penalty covers the request's codebook-0 history, kept as its slot's
        presence mask, which its first frame starts afresh."""
        logits = self.eos_mask.apply(self.talker.codec_head(hidden[:, -1]), self.cache.rows)
        if first:
            for state in states:
                if state.params.sampling.repetition_penalty != 1.0:
                    self.sampler.reset(state.slot)
        rows = [RowSampling(s.params.sampling, s.generator) for s in states]
        codes = self.sampler.sample(logits, rows, self.cache.rows).tolist()
        if commit:  # the forward's lengths advance only once its codes are chosen
            self.cache.commit()
        for row, (state, code0) in enumerate(zip(states, codes, strict=True)):
            if not state.finished:
                with self._row(state):
                    self._accept_code0(state, code0, hidden[row : row + 1])

    def _accept_code0(self, state: _TalkerState, code0: int, hidden: torch.Tensor | None) -> None:
        if code0 == self.codec_eos:
            state.output.put(TalkerOutput(None, state.frames, finished=True, finish_reason="stop"))
            self._finish(state)
            return
        state.pending_code0 = code0
        if self.frame is not None:  # static frames: the slot's buffer, where the next step reads it
            if hidden is not None:
                self.frame.store_hidden(state.slot, hidden)
        else:
            state.past_hidden = hidden

    def _run(self, work) -> None:
        prefill, predict, decode = work
        for state, take in prefill:
            if state.finished:  # aborted meanwhile
                continue
            try:
                hidden = self._prefill_piece(state, take)
                if hidden is not None:
                    self._take_code0([state], hidden, first=True)
            except Exception as exc:  # one request's forward: the failure is that request's alone
                self._states_failed([state], exc)
        predict = [s for s in predict if not s.finished]
        if predict:
            if self.frame is not None:
                self._predict_static(predict)
            else:
                self._predict_residuals(predict)
            # One step per frame: whoever has its next text row goes straight on to the talker forward.
            with self._cond:
                decode += [
                    s for s in predict if not s.finished and s.output.has_room() and self._text_row_ready(s)
                ]
        decode = [s for s in decode if not s.finished]
        if decode:
            self.stats.last_batch_size = len(decode)
            if self.frame is not None:
                self._decode_static(decode)
                return
            hidden = self._talker_forward(decode, self._next_inputs(decode), commit=False)
            self._take_code0(decode, hidden, commit=True)

    def _prefill_piece(self, state: _TalkerState, take: int) -> torch.Tensor | None:
        """The next `take` prompt rows into the KV cache (the rows are built on the first piece).
        After the last piece: its last position's hidden [1, 1, H] (code 0 of frame 0 comes from
        it); before it, None. `prefilled` advances only once the piece's forward has run."""
        if state.prompt_rows is None:
            head = state.stream[:ASSISTANT_PROMPT_TOKENS]
            rows = self.prompts.prompt(state.prompt_ids, head, state.speaker_id, state.multimodal_hidden)
            cfg = self.config
            users = user_positions(state.prompt_ids, cfg.im_start_token_id, cfg.user_token_id)
            rope = talker_rope(self.talker, cfg, [state.prompt_ids[p] for p in users], state.media_layout)
            if rope is not None:
                state.prompt_positions = rope[0].to(self.device).unsqueeze(1)  # [3, 1, rows]
                state.rope_delta = rope[1]
            state.prompt_rows = rows
        total = state.prompt_rows.shape[1]
        start = state.prefilled
        end = min(total, start + take)
        positions = None
        if state.prompt_positions is not None:
            positions = state.prompt_positions[:, :, start:end]
        hidden = self._talker_forward([state], state.prompt_rows[:, start:end], positions)
        state.prefilled = end
        if end < total:
            return None
        state.prefill_done = True
        state.prompt_rows = state.prompt_positions = None  # spent
        return hidden

    def _next_picks(self, states: list[_TalkerState]) -> list[int]:
        """Each row's next trailing text id: its assistant-stream token, or tts_eos / tts_pad."""
        picks = []
        for state in states:
            index = ASSISTANT_PROMPT_TOKENS + state.frames - 1  # assistant-stream index of the row
            if index < len(state.stream):
                picks.append(state.stream[index])
            else:
                picks.append(TTS_EOS if index == len(state.stream) else TTS_PAD)
        return picks

    def _cp_rows(self, states: list[_TalkerState]) -> list[RowSampling]:
        # The reference's code predictor samples with fixed knobs whenever the talker samples.
        return [
            RowSampling(
                SamplingParams() if s.params.sampling.greedy else CODE_PREDICTOR_SAMPLING, s.cp_generator
            )
            for s in states
        ]

    def _predict_static(self, states: list[_TalkerState]) -> None:
        """`_predict_residuals` as one capturable step (static frames)."""
        assert self.frame is not None
        slots = [s.slot for s in states]
        frames = self.frame.predict(slots, [s.pending_code0 for s in states], self._cp_rows(states))
        for state, frame in zip(states, frames, strict=True):
            with self._row(state):
                self._emit_frame(state, frame, None)

    def _decode_static(self, states: list[_TalkerState]) -> None:
        """The talker forward and codebook 0 as one capturable step (static frames)."""
        assert self.frame is not None
        rows = [RowSampling(s.params.sampling, s.generator) for s in states]
        codes = self.frame.decode(
            [s.slot for s in states], self._next_picks(states), [s.rope_delta for s in states], rows
        )
        for state, code0 in zip(states, codes, strict=True):
            if not state.finished:
                with self._row(state):
                    self._accept_code0(state, code0, None)

    def _next_inputs(self, states: list[_TalkerState]) -> torch.Tensor:
        """[B, 1, H]: each row's codec sum of its last frame + its next trailing text row (or
        tts_eos / tts_pad), the text rows of the whole step in one embed + projection."""
        codec = torch.cat([s.next_codec_sum for s in states], dim=0)
        return codec + self.prompts.trailing_rows(self._next_picks(states))

    def _predict_residuals(self, states: list[_TalkerState]) -> None:
        """Codebooks 1..15 for each state's pending codebook 0, batched; emits the frames."""
        device = self.device
        code0 = torch.tensor([[s.pending_code0] for s in states], dtype=torch.long, device=device)
        code0_embed = self.talker.get_input_embeddings()(code0)  # [B, 1, H]
        past = torch.cat([s.past_hidden for s in states], dim=0)
        embeds = torch.cat((past, code0_embed), dim=1)
        codes = [code0[:, 0]]
        hiddens = [code0_embed]
        embedding = self.cp.model.get_input_embeddings()
        # The ids stay on the device until the frame is done (one copy to the host per frame).
        knobs = self.cp_sampler.prepare(self._cp_rows(states))
        for group in range(self.num_groups - 1):
            logits = self.code_predictor.run(group, embeds)
            ids = self.cp_sampler.sample(logits, knobs)
            codes.append(ids)
            embeds = embedding[group](ids.view(-1, 1))
            hiddens.append(embeds)
        codec_sum = torch.cat(hiddens, dim=1).sum(1, keepdim=True)
        frames = torch.stack(codes, dim=1).tolist()  # [B, 16]
        for row, state in enumerate(states):
            with self._row(state):
                self._emit_frame(state, frames[row], codec_sum[row : row + 1])

    def _emit_frame(self, state: _TalkerState, frame: list[int], codec_sum: torch.Tensor | None) -> None:
        state.pending_code0 = None
        state.past_hidden = None
        state.next_codec_sum = codec_sum
        state.frames += 1
        state.playout.emitted(self.frame_seconds, time.monotonic())
        self.stats.last_units += 1  # the stage's measured speed counts frames (omnistream/speed.py)
        done = state.frames >= state.params.max_frames
        state.output.put(
            TalkerOutput(frame, state.frames - 1, finished=done, finish_reason="length" if done else None)
        )
        if done:
            self._finish(state)
