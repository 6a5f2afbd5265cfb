"""Talker engine: codec frames from thinker tokens, batched across requests.

One step per frame: a batched talker forward yields codebook 0 of the next frame for every request
whose next text row is there, then the 15-step code predictor (KV-cached, batched) fills codebooks
1..15. A request whose next thinker token has not arrived waits; the others go on.

A request's prompt rows are prefilled in pieces: all prefills of a step together take at most
`prefill_chunk` rows, and the same step runs the others' frames, so a long prompt holds them for
one piece at a time. A piece advances the KV length only once its forward has run; a failing piece
fails its request alone (prefill forwards are one request each).

When not every request fits one step, the most urgent go first: candidates are taken by deadline
(omnistream/engine/playout.py: when the request's listener runs dry, from the frames this stage emitted
since its first one, 80 ms each; before the first frame, arrival + the first-audio target), for the
prefill budget, the free KV slots and the frame rows alike. `max_step_batch` caps the requests that
take a frame step (default: every slotted one, `max_batch`); a request left out for a more urgent
one is counted in `stats.deferred`.

With static frames (`TalkerEngineSettings.static_frames`, `--static-frames`) a frame runs as two fixed-shape,
graph-capturable steps instead (omnistream/models/qwen3_omni/talker/frame.py: the code predictor's 15
codebooks, then the talker's decode, each with its sampling), captured as CUDA graphs with
`--cuda-graphs`; the codes are the same, the host dispatches a few ops per frame instead of thousands.

Part of the qwen3_omni family: built by `omnistream.models.qwen3_omni.family`, which callers go through.
Its parts, objects it builds and holds: the checks of a request's thinker input and how it joins the
request's state (`intake`, `intake.py`'s `TalkerIntake`), deadline scheduling and the prefill budget
(`schedule`, `schedule.py`'s `DeadlineSchedule`), one frame's steps, eager and static (`frames`,
`frame_steps.py`'s `FrameSteps`); the per-request state is `state.py`'s. Admission, the lock and
request table the inputs go through, and each prompt's prefill stay here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from omnistream.engine.batch_sampler import BatchSampler
from omnistream.engine.engine import Engine, present
from omnistream.engine.kvcache import SlotKVCache
from omnistream.engine.output_stream import OutputStream
from omnistream.engine.playout import Playout, check_step_budget
from omnistream.engine.prefix_cache import PrefixCache
from omnistream.engine.settings import TalkerEngineSettings
from omnistream.engine.step_seeds import request_seed
from omnistream.models.family import describe_loaded
from omnistream.models.qwen3_omni.checkpoint import load_stage
from omnistream.models.qwen3_omni.constants import DEFAULT_SPEAKER
from omnistream.models.qwen3_omni.memory import default_prefix_cache_bytes
from omnistream.models.qwen3_omni.talker.code_predictor import CodePredictorRunner, batch_buckets
from omnistream.models.qwen3_omni.talker.eos import EosMask
from omnistream.models.qwen3_omni.talker.frame import StaticTalkerFrame
from omnistream.models.qwen3_omni.talker.frame_steps import FrameSteps
from omnistream.models.qwen3_omni.talker.intake import TalkerIntake
from omnistream.models.qwen3_omni.talker.prefix import TalkerPrefixes
from omnistream.models.qwen3_omni.talker.prompt import ASSISTANT_PROMPT_TOKENS, TalkerPromptBuilder
from omnistream.models.qwen3_omni.talker.rope import talker_rope
from omnistream.models.qwen3_omni.talker.schedule import DeadlineSchedule, TalkerStep
from omnistream.models.qwen3_omni.talker.state import TalkerOutput, _TalkerState
from omnistream.request.errors import InvalidRequest
from omnistream.request.media import MediaLayout
from omnistream.request.stage_chain import TalkerFeed, TalkerParams  # the edge's open params and payload

log = logging.getLogger(__name__)


def _check_settings(settings: TalkerEngineSettings) -> None:
    """Budgets that cannot work, refused before a weight is read."""
    if settings.prefill_chunk < 1:
        raise ValueError(f"prefill_chunk must be at least 1, got {settings.prefill_chunk}")
    check_step_budget("max_step_batch", settings.max_step_batch)
    if settings.max_step_batch is not None and settings.max_step_batch > settings.max_batch:
        raise ValueError(
            f"max_step_batch ({settings.max_step_batch}) cannot exceed max_batch ({settings.max_batch})"
        )


class TalkerEngine(Engine[_TalkerState, TalkerStep]):
    """The talker stage: the engine thread, admission and prefill here; its intake, schedule and
    frames as parts."""

    name = "talker"
    # Of the loaded checkpoint, set by `_take_model`: what the engine API reads.
    config: Any
    default_speaker: str

    def __init__(
        self,
        model_dir: str,
        settings: TalkerEngineSettings,
        *,
        output_capacity: int = 512,
        graph_buckets: bool | None = None,
    ) -> None:
        """`settings` as `omnistream serve talker` takes them (`settings.max_model_len`: the
        talker's own, which the family scales from the thinker's). `graph_buckets`: the code
        predictor's and the static frame's batch buckets (powers of two, padded); None: with CUDA
        graphs. They run on the CPU too, in tests."""
        _check_settings(settings)
        super().__init__(max_requests=settings.request_limit, output_capacity=output_capacity)
        self.settings = settings
        self.first_audio_target = settings.first_audio_target
        self.max_batch = settings.max_batch
        self.max_model_len = settings.max_model_len
        self.device = settings.device
        self.dtype = settings.torch_dtype()
        holder = load_stage("talker", model_dir, settings)
        self._take_model(holder)
        # A request's thinker input, checked as it comes and added to its state.
        self.intake = TalkerIntake(
            thinker_vocab=self.thinker_vocab,
            hidden_width=self.hidden_width,
            multimodal_ids=self.prompts.multimodal_ids,
            im_start_id=self.config.im_start_token_id,
            assistant_id=self.config.assistant_token_id,
            user_id=self.config.user_token_id,
            max_model_len=self.max_model_len,
            device=self.device,
            dtype=self.dtype,
        )
        # Static frames (omnistream/models/qwen3_omni/talker/frame.py): each frame as two fixed-shape,
        # graph-capturable steps; one more cache slot, the padding rows' scratch.
        slots = self.max_batch + 1 if settings.static_frames else self.max_batch
        self._make_caches(slots, settings.prefix_cache_bytes)
        self._make_frame_parts(settings, slots, settings.graphs if graph_buckets is None else graph_buckets)
        # Which requests step (prompt rows `prefill_chunk` a step; frame rows `max_step_batch`, the
        # most urgent first) and one frame's steps.
        step_batch = settings.max_step_batch or self.max_batch
        self.schedule = DeadlineSchedule(self.cache, self.eos_mask, settings.prefill_chunk, step_batch)
        self.frames = FrameSteps(
            requests=self,
            talker=self.talker,
            cp_embeddings=self.cp.model.get_input_embeddings(),
            code_predictor=self.code_predictor,
            frame=self.frame,
            prompts=self.prompts,
            cache=self.cache,
            sampler=self.sampler,
            cp_sampler=self.cp_sampler,
            eos_mask=self.eos_mask,
            device=self.device,
            codec_eos=self.codec_eos,
            num_groups=self.num_groups,
            frame_seconds=self.frame_seconds,
        )

    def _take_model(self, holder: Any) -> None:
        """The loaded talker's parts and the facts of its config this engine reads."""
        self.config = holder.config
        self.talker = holder.talker
        self.cp = self.talker.code_predictor
        tc = self.config.talker_config
        self.speakers = {k.lower(): v for k, v in tc.speaker_id.items()}
        # Audio seconds one codec frame holds (80 ms for Qwen3-Omni): the playout clock's unit.
        self.frame_seconds = 1.0 / describe_loaded(self.config).frames_per_second
        # What a request that names no voice gets: the family default, if this checkpoint has it.
        self.default_speaker = DEFAULT_SPEAKER if DEFAULT_SPEAKER in self.speakers else min(self.speakers)
        self.num_groups = tc.num_code_groups
        self.codec_eos = tc.codec_eos_token_id
        self.vocab = tc.text_config.vocab_size
        self.suppress = torch.zeros(self.vocab, dtype=torch.bool, device=self.device)
        self.suppress[self.vocab - 1024 :] = True
        self.suppress[self.codec_eos] = False
        self.prompts = TalkerPromptBuilder(self.config, self.talker, holder.thinker.model.embed_tokens)
        self.hidden_width = self.talker.hidden_projection.linear_fc1.in_features  # the thinker's
        self.thinker_vocab = self.config.thinker_config.text_config.vocab_size

    def _make_caches(self, slots: int, prefix_cache_bytes: int | None) -> None:
        """The KV slots and the user rows' prefix cache (prefix.py; budget None: half the slots'
        bytes, 0: off)."""
        text = self.config.talker_config.text_config
        self.cache = SlotKVCache.for_text_config(text, slots, self.max_model_len, self.dtype, self.device)
        kv_bytes = sum(t.numel() * t.element_size() for t in self.cache.keys + self.cache.values)
        budget = default_prefix_cache_bytes(kv_bytes) if prefix_cache_bytes is None else prefix_cache_bytes
        self.prefix_cache: PrefixCache = PrefixCache(budget, namespace=b"talker")
        self.prefixes = TalkerPrefixes(self.prefix_cache, self.cache, self.prompts.multimodal_ids)

    def _make_frame_parts(self, settings: TalkerEngineSettings, slots: int, graph_buckets: bool) -> None:
        """The code predictor's runner, the samplers and (static frames) the fixed-shape frame."""
        static, graphs = settings.static_frames, settings.graphs
        # Codebooks 1..15: fixed-shape steps over a static cache (CUDA graphs with --cuda-graphs).
        self.code_predictor = CodePredictorRunner(
            self.cp,
            self.max_batch,
            self.dtype,
            self.device,
            cuda_graphs=graphs and not static,  # static frames capture it themselves
            buckets=batch_buckets(self.max_batch) if graph_buckets else None,
        )
        # Batched choices: codebook 0 (suppressed ids, presence masks per KV slot for the penalty
        # over the request's codebook-0 history) and the code predictor's groups.
        self.sampler = BatchSampler(self.vocab, self.device, slots=slots, suppress=self.suppress)
        self.eos_mask = EosMask(self.vocab, self.codec_eos, slots, self.device)  # ignore_eos requests
        self.cp_sampler = BatchSampler(self.cp.config.vocab_size, self.device)
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
                cuda_graphs=graphs,
            )

    # --- the schedule's budgets, read by it each step (settable between requests) ------------------
    @property
    def prefill_chunk(self) -> int:
        """Prompt rows prefilled per step, all requests together."""
        return self.schedule.prefill_chunk

    @prefill_chunk.setter
    def prefill_chunk(self, rows: int) -> None:
        self.schedule.prefill_chunk = rows

    @property
    def max_step_batch(self) -> int:
        """Requests that take a frame step per step, most urgent first."""
        return self.schedule.max_step_batch

    @max_step_batch.setter
    def max_step_batch(self, rows: int) -> None:
        self.schedule.max_step_batch = rows

    @property
    def prefill_row_seconds(self) -> float | None:
        """Measured seconds of prefill per prompt row (None: none measured yet)."""
        return self.schedule.prefill_row_seconds

    @prefill_row_seconds.setter
    def prefill_row_seconds(self, seconds: float | None) -> None:
        self.schedule.prefill_row_seconds = seconds

    # --- public API ---------------------------------------------------------------------------------
    def add_request(self, request_id: str, params: TalkerParams) -> OutputStream[TalkerOutput]:
        speaker_id = self.speakers.get((params.speaker or self.default_speaker).lower())  # "": the default
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
            seed=request_seed(params.sampling.seed),
        )
        state.playout = Playout(state.arrived, self.first_audio_target)
        self.admit(state)
        return state.output

    def feed_piece(self, request_id: str, piece: TalkerFeed) -> None:
        """`feed` with one payload of the thinker -> talker edge (omnistream/request/stage_chain.py): what
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
        multimodal_hidden: Mapping[int, torch.Tensor] | None = None,
        media_layout: MediaLayout | None = None,
    ) -> None:
        """Give the talker more thinker output: the prompt once, then generated tokens as they come
        (checked and added by the `intake` part, intake.py)."""
        self.intake.check_tokens(token_ids)
        deep = self.intake.device_rows(multimodal_hidden)  # outside the lock: a device copy
        with self._cond:
            state = self._requests.get(request_id)
            if state is None:
                raise InvalidRequest(f"talker has no running request {request_id!r}", field="request_id")
            if self.intake.take(state, token_ids, last, prompt_ids, deep, media_layout):
                # Nothing to speak: no frames, the end at once (a slot, if the prompt had one, goes
                # as an abort's).
                state.output.put(TalkerOutput(None, 0, finished=True, finish_reason="stop"))
                self.finish(state)
            self._cond.notify_all()

    # --- engine thread ------------------------------------------------------------------------------
    def _release(self, state: _TalkerState) -> None:
        if state.slot is not None:
            self.cache.release(state.slot)
            state.slot = None

    def _schedule(self, candidates: Sequence[_TalkerState]) -> TalkerStep | None:
        step = self.schedule.pick(candidates)
        if step is not None:
            self._deferred(step.deferred)
            self.stats.last_buffered = step.buffered
        return step

    def _work_states(self, work: TalkerStep) -> list[_TalkerState]:
        return work.predict + work.decode  # not the prefills: each runs alone and answers for itself

    def _run(self, work: TalkerStep) -> None:
        prefill, predict, decode = work.prefill, work.predict, work.decode
        frames = self.frames
        for state, take in prefill:
            if state.finished:  # aborted meanwhile
                continue
            self.stats.last_prefill_rows += take
            try:
                started = time.perf_counter()
                if state.prompt_rows is None:
                    self._begin_prompt(state)
                before = state.prefilled
                hidden = self._prefill_piece(state, take)
                self.schedule.measure_prefill(state.prefilled - before, time.perf_counter() - started)
                if hidden is not None:
                    frames.take_code0([state], hidden, first=True)
            except Exception as exc:  # one request's forward: the failure is that request's alone
                self._states_failed([state], exc)
        predict = [s for s in predict if not s.finished]
        if predict:
            if self.frame is not None:
                frames.predict_static(predict)
            else:
                frames.predict_residuals(predict)
            # One step per frame: whoever has its next text row goes straight on to the talker forward.
            with self._cond:
                decode += [
                    s
                    for s in predict
                    if not s.finished and s.output.has_room() and self.schedule.text_row_ready(s)
                ]
        decode = [s for s in decode if not s.finished]
        if decode:
            self.stats.last_batch_size = len(decode)
            if self.frame is not None:
                frames.decode_static(decode)
                return
            hidden = frames.talker_forward(decode, frames.next_inputs(decode), commit=False)
            frames.take_code0(decode, hidden, commit=True)

    def _begin_prompt(self, state: _TalkerState) -> None:
        """The prompt's rows (and positions, with vision), built at its first piece; the KV of its
        cached user rows loaded into its fresh slot (prefix.py), so the prefill starts after them."""
        head = state.stream[:ASSISTANT_PROMPT_TOKENS]
        prompt_ids = present(state.prompt_ids)  # the schedule prefills only prompts that came
        users = state.user_positions
        rope = talker_rope(self.talker, self.config, [prompt_ids[p] for p in users], state.media_layout)
        if rope is not None:
            state.prompt_positions = rope[0].to(self.device).unsqueeze(1)  # [3, 1, rows]
            state.rope_delta = rope[1]
        try:
            self.prefixes.plan_and_load(state, users, None if rope is None else rope[0])
        except Exception:  # the cache is an optimisation: a failed lookup prefills the whole prompt
            log.exception("talker: the prefix lookup of %s failed", state.request_id)
            state.prefilled = state.cached_rows = 0
        # Only the rows after the cached ones are built (a long conversation's are mostly cached).
        state.prompt_rows_from = state.prefilled
        state.prompt_rows = self.prompts.prompt(
            prompt_ids, head, state.speaker_id, state.multimodal_hidden, users=users, start=state.prefilled
        )

    def _prefill_piece(self, state: _TalkerState, take: int) -> torch.Tensor | None:
        """The next `take` prompt rows into the KV cache (`_begin_prompt` built them). After the last
        piece: its last position's hidden [1, 1, H] (code 0 of frame 0 comes from it); before it,
        None. `prefilled` advances only once the piece's forward has run."""
        assert state.prompt_rows is not None, "_begin_prompt first"
        built = state.prompt_rows_from  # prompt_rows holds the prompt's rows from this one on
        total = built + state.prompt_rows.shape[1]
        start = state.prefilled
        end = min(total, start + take)
        positions = None
        if state.prompt_positions is not None:
            positions = state.prompt_positions[:, :, start:end]
        rows = state.prompt_rows[:, start - built : end - built]
        hidden = self.frames.talker_forward([state], rows, positions)
        state.prefilled = end
        if end < total:
            return None
        state.prefill_done = True
        state.prompt_rows = state.prompt_positions = None  # spent
        self.prefixes.store(state)
        return hidden
