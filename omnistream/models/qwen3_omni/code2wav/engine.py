"""Code2Wav engine: streaming decode of codec frames into 24 kHz audio, batched across requests.

Windows come from `ChunkPlan`. The default decode is exact streaming: each request carries its
decoder state, a window is decoded once, as soon as its last frame is in, and the concatenated audio
equals `code2wav(all codes)`. Ready windows of several requests, at any positions, are decoded in
one batched step; requests join and leave between steps. The step is fixed-shape per batch bucket
(`StaticCode2WavStep`, code2wav/static_step.py: each request's state in a slot of a device buffer
from its first window to its end), replayed as a CUDA graph per bucket with `--cuda-graphs` (on by
default on CUDA; each graph checked against its eager step when captured, dropped if it differs).

A step takes at most `max_batch` windows (and, with `max_step_frames`, about that many frames),
most urgent first: by deadline (omnistream/engine/playout.py: when the request's listener runs dry, from
the samples this stage emitted since its first audio; before it, arrival + the first-audio
target). A window longer than the most urgent one waits a step too: a batch pads every row to its
longest window, so it would make the most urgent request wait for frames it does not need. A ready
window left for a more urgent one is counted in `stats.deferred`.

`decode="recompute"` keeps the previous path, only as the benchmark's baseline: each window is
re-decoded with up to `left_context` frames before it and one lookahead frame after it and the
middle kept (twice the compute, and only approximate once the history passes the context).

Part of the qwen3_omni family: built by `omnistream.models.qwen3_omni.family`, which callers go through.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from omnistream.engine.engine import Engine, RequestState, present
from omnistream.engine.output_stream import OutputStream
from omnistream.engine.playout import (
    Playout,
    buffered_seconds,
    by_deadline,
    check_step_budget,
)
from omnistream.engine.settings import Code2WavEngineSettings
from omnistream.models.qwen3_omni.checkpoint import load_stage
from omnistream.models.qwen3_omni.code2wav.slots import SlotStream
from omnistream.models.qwen3_omni.code2wav.static_step import StaticCode2WavStep
from omnistream.models.qwen3_omni.codec_chunks import ChunkPlan
from omnistream.models.qwen3_omni.constants import SAMPLE_RATE
from omnistream.request.errors import InvalidRequest


@dataclass
class AudioOutput:
    audio: np.ndarray  # float32 samples
    first_sample: int
    window: int
    finished: bool = False


@dataclass
class _Code2WavState(RequestState):
    plan: ChunkPlan = field(default_factory=ChunkPlan)
    frames: list[torch.Tensor] = field(default_factory=list)  # [16, n] int64 pieces, on the host
    # As numpy (merged from `frames` when scheduled): a step places each row's window in its batch
    # with numpy slices, no aten op per row.
    codes: np.ndarray | None = None  # [16, T] all frames so far
    available: int = 0
    done: bool = False
    start: int = 0  # first frame of the next window
    window: int = 0
    samples: int = 0
    stream: SlotStream | None = None  # exact streaming: where the decoder's state is, and how far
    playout: Playout = field(default_factory=lambda: Playout(0.0))  # set on admission


DECODES = ("stream", "recompute")


# One step's work: each request with how many frames it had and whether its input had ended then.
Code2WavWork = list[tuple[_Code2WavState, int, bool]]


class Code2WavEngine(Engine[_Code2WavState, Code2WavWork]):
    """The Code2Wav stage: windows of codec frames decoded to audio, most urgent first."""

    name = "code2wav"

    def __init__(
        self,
        model_dir: str,
        settings: Code2WavEngineSettings,
        *,
        output_capacity: int = 64,
        max_frames: int = 16384,
        decode: str = "stream",
    ) -> None:
        """`settings` as `omnistream serve code2wav` takes them. `max_frames`: the most frames one
        request may send; `decode`: "stream" or the "recompute" baseline (`set_decode`)."""
        check_step_budget("max_step_frames", settings.max_step_frames)
        super().__init__(max_requests=settings.request_limit, output_capacity=output_capacity)
        self.settings = settings
        # Frames one step decodes, all its windows together (None, as a test sets it: only
        # `max_batch` bounds a step). The most urgent window always goes, however long: a budget
        # never stalls the stage.
        self.max_step_frames: int | None = settings.max_step_frames
        self.first_audio_target = settings.first_audio_target
        holder = load_stage("code2wav", model_dir, settings)
        self.config = holder.config
        self.code2wav = holder.code2wav
        self.device = settings.device
        c = self.config.code2wav_config
        self.num_quantizers = c.num_quantizers
        self.sample_rate = SAMPLE_RATE  # not in the config: the decoder is built for it
        self.codebook_size = c.codebook_size
        self.upsample = int(self.code2wav.total_upsample)
        self.max_batch = settings.max_batch
        self.max_frames = max_frames
        self.set_decode(decode)
        # Every request held may be mid-stream: a state slot each (their states stay on the device).
        graphs = settings.graphs
        self.streamer = StaticCode2WavStep(
            self.code2wav,
            slots=settings.request_limit,
            max_batch=self.max_batch,
            graph_buckets=graphs,
            cuda_graphs=graphs,
        )

    def set_decode(self, decode: str) -> None:
        """Choose the decode before `start` (the bench runs the recompute baseline beside it)."""
        if decode not in DECODES:
            raise ValueError(f"code2wav decode must be one of {DECODES}, not {decode!r}")
        self.decode = decode

    @property
    def lookahead_frames(self) -> int:
        """Frames past a window end this decode needs before it can emit the window."""
        return 1 if self.decode == "recompute" else 0

    def add_request(self, request_id: str, plan: ChunkPlan) -> OutputStream[AudioOutput]:
        plan.validate()
        state = _Code2WavState(request_id=request_id, output=self.new_output(), plan=plan)
        state.playout = Playout(state.arrived, self.first_audio_target)
        self.admit(state)
        return state.output

    def feed(self, request_id: str, codes: torch.Tensor | None, last: bool) -> None:
        """Append frames ([16, n] int64, may be empty) for a request; `last` ends its input."""
        if codes is not None and codes.numel():
            if codes.dim() != 2 or codes.shape[0] != self.num_quantizers:
                raise InvalidRequest(f"codes must have shape [{self.num_quantizers}, n]", field="codes")
            if codes.dtype not in (torch.int64, torch.int32):
                raise InvalidRequest("codes must be integers", field="codes")
            if int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size:
                raise InvalidRequest(f"codes must be in [0, {self.codebook_size})", field="codes")
        with self._cond:
            state = self._requests.get(request_id)
            if state is None:
                raise InvalidRequest(f"code2wav has no running request {request_id!r}", field="request_id")
            if state.done:
                raise InvalidRequest(f"request {request_id!r} already received its last input")
            if codes is not None and codes.numel():
                if state.available + codes.shape[1] > self.max_frames:
                    raise InvalidRequest(f"more than {self.max_frames} frames for one request", field="codes")
                # Kept on the host: a step's codes cross to the device in one (pinned) copy, on the
                # engine thread, not here on the event loop under the engine's lock.
                state.frames.append(codes.to(device="cpu", dtype=torch.long))
                state.available += codes.shape[1]
            state.done = state.done or last
            self._cond.notify_all()

    # --- engine thread ------------------------------------------------------------------------------
    def _schedule(self, candidates: list[_Code2WavState]) -> Code2WavWork | None:
        now = time.monotonic()
        ready: list[_Code2WavState] = []
        frames = self.max_step_frames  # what is left of the step's frame budget (None: no budget)
        deferred = 0
        longest: int | None = None  # the step's padded window length: the most urgent window's
        for state in by_deadline(candidates):
            if state.finished or not state.output.has_room():
                continue
            end_only = state.done and state.available == state.start  # only the end marker is left
            if not (end_only or self._window_ready(state)):
                continue
            size = 0 if end_only else self._window_frames(state)
            full = len(ready) >= self.max_batch or (frames is not None and ready and size > frames)
            # A batched decode pads every row to the longest window: a longer window than the most
            # urgent one's would make that one wait for frames it does not need (a new stream's
            # 2-frame window held up by eight 25-frame ones: ~400 ms here). It waits a step, which
            # its listener can afford: it is further from running dry.
            if full or (longest is not None and size > longest):
                deferred += 1  # the step is full of more urgent windows: this one waits a step
                continue
            if size and longest is None:
                longest = size  # no later window is longer: those wait
            if frames is not None:
                frames = max(0, frames - size)
            ready.append(state)
        if not ready:
            return None
        self._deferred(deferred)
        self.stats.last_buffered = buffered_seconds(ready, now)
        for state in ready:
            if state.frames:
                pieces = [f.numpy() for f in state.frames]
                state.codes = np.concatenate(
                    ([state.codes] if state.codes is not None else []) + pieces, axis=1
                )
                state.frames = []
            state.slot = 0
        return [(s, s.available, s.done) for s in ready]

    def _release(self, state: _Code2WavState) -> None:
        """An ended request's state slot is free for another stream (engine thread)."""
        if state.stream is not None:
            self.streamer.release(state.stream)
            state.stream = None

    def _work_states(self, work: Code2WavWork) -> list[_Code2WavState]:
        return [s for s, _, _ in work]

    def _window_frames(self, state: _Code2WavState) -> int:
        """Frames the decode of the request's next window runs over (what a step's budget counts)."""
        if self.decode == "recompute":
            begin, _, stop, _ = state.plan.span(state.start, state.available, state.done)
            return stop - begin
        return min(state.plan.window_end(state.start), state.available) - state.start

    def _window_ready(self, state: _Code2WavState) -> bool:
        if self.decode == "recompute":
            return state.plan.ready(state.start, state.available, state.done)
        if state.done:
            return state.available > state.start
        return state.available >= state.plan.window_end(state.start)  # no lookahead frame needed

    def _run(self, work: Code2WavWork) -> None:
        if self.decode == "stream":
            self._run_stream(work)
        else:
            self._run_recompute(work)

    def _needing_audio(self, work: Code2WavWork) -> Iterator[tuple[_Code2WavState, int, bool]]:
        """The (state, available, done) that have frames to decode; a request whose input ended on
        a window boundary gets its (empty) final piece here instead."""
        for state, available, done in work:
            if state.finished:
                continue
            if done and available == state.start:
                state.output.put(
                    AudioOutput(np.zeros(0, np.float32), state.samples, state.window, finished=True)
                )
                self.finish(state)
                continue
            yield state, available, done

    def _run_stream(self, work: Code2WavWork) -> None:
        """One batched streaming step: each ready request decodes its next window, once."""
        jobs = [
            (state, min(state.plan.window_end(state.start), available), available, done)
            for state, available, done in self._needing_audio(work)
        ]
        if not jobs:
            return
        self.stats.last_batch_size = len(jobs)
        self.stats.last_units = sum(end - s.start for s, end, _, _ in jobs)  # frames decoded (speed.py)
        for state, _, _, _ in jobs:
            if state.stream is None:  # its first window: a slot of its own until it ends (`_release`)
                state.stream = self.streamer.new_stream()
        streams = [present(s.stream) for s, _, _, _ in jobs]
        # Host codes go to the device in one copy, the step's audio comes back in one copy.
        codes = [present(s.codes)[:, s.start : end] for s, end, _, _ in jobs]
        # Streams are immutable and a failed step commits no slot: if this raises, every request is
        # as it was and can be retried alone.
        padded, lens, new_states = self.streamer.step_padded(streams, codes)
        audio = padded.to(torch.float32).cpu().numpy()
        for (state, end, available, done), wav, n, new in zip(jobs, audio, lens, new_states, strict=True):
            with self.row(state):
                state.stream = new
                piece = wav[:n].copy()  # its own buffer: the batch's may be large
                self._hand_out(state, piece, end, final=done and end >= available)

    def _run_recompute(self, work: Code2WavWork) -> None:
        jobs: list[tuple[_Code2WavState, int, int, int, bool, bool]] = []
        for state, available, done in self._needing_audio(work):
            begin, end, stop, lookahead = state.plan.span(state.start, available, done)
            jobs.append((state, begin, end, stop, lookahead, done))
        if not jobs:
            return
        self.stats.last_batch_size = len(jobs)
        self.stats.last_units = sum(end - state.start for state, _, end, _, _, _ in jobs)  # speed.py
        longest = max(stop - begin for _, begin, _, stop, _, _ in jobs)
        batch = torch.zeros((len(jobs), self.num_quantizers, longest), dtype=torch.long, device=self.device)
        for row, (state, begin, _, stop, _, _) in enumerate(jobs):
            batch[row, :, : stop - begin] = torch.from_numpy(present(state.codes)[:, begin:stop])
        wav = self.code2wav(batch)[:, 0]  # [B, samples]
        for row, (state, begin, end, stop, lookahead, done) in enumerate(jobs):
            with self.row(state):
                self._emit(state, wav[row], begin, end, stop, lookahead, done)

    def _emit(
        self,
        state: _Code2WavState,
        wav: torch.Tensor,
        begin: int,
        end: int,
        stop: int,
        lookahead: int,
        done: bool,
    ) -> None:
        """Keep this window's new samples and queue them (one request's share of a batched decode)."""
        context = state.start - begin
        keep_from = context * self.upsample
        if lookahead:
            keep_to = (context + end - state.start) * self.upsample
        else:  # the true end: everything this window yields
            keep_to = (stop - begin) * self.upsample - self.trailing_loss
        audio = wav[keep_from:keep_to].to(torch.float32).cpu().numpy()
        self._hand_out(state, audio, end, final=done and end >= state.available)

    def _hand_out(self, state: _Code2WavState, audio: np.ndarray, end: int, final: bool) -> None:
        """Queue the window that ends at frame `end` as one audio chunk (both decode paths): the
        request's playout clock starts with its first audio (an empty piece is no audio), and the
        last window finishes the request."""
        if audio.shape[0]:
            state.playout.emitted(audio.shape[0] / self.sample_rate, time.monotonic())
        state.output.put(AudioOutput(audio, state.samples, state.window, finished=final))
        state.samples += audio.shape[0]
        state.window += 1
        state.start = end
        if final:
            self.finish(state)

    @property
    def trailing_loss(self) -> int:
        """Samples a decode of T frames falls short of T * upsample (555 for the real model)."""
        if not hasattr(self, "_trailing_loss"):
            probe = torch.zeros((1, self.num_quantizers, 2), dtype=torch.long, device=self.device)
            self._trailing_loss = 2 * self.upsample - int(self.code2wav(probe).shape[-1])
        return self._trailing_loss
