"""Code2Wav's streaming step as one fixed-shape, graph-capturable step per batch bucket.

A step decodes every ready row's next window from its carried state (forward.py; the reference
path with per-request states is stream.py). Eager it is ~950 aten ops, each a kernel launch the host
pays for on a GPU (a bfloat16 Code2Wav step on an H200 measured 51 ms + 0.74 ms a frame, launches
mostly). Here a step's shapes depend only on its batch bucket and its frame bucket, and its device
work sits in two `capturable` regions:

- `step` (replayed as a CUDA graph): the rows' states gathered from their slots (one `index_select`
  of the state buffer, slots.py; zeros for a row at its stream's start), the whole forward, the
  rows' new states written to a staging buffer (one `cat`) and the audio;
- `commit` (eager: one op): the real rows' new states copied into their slots (`index_copy_`).

Split in two so the captured step only reads the state buffer: it is idempotent (it writes only
its outputs and the staging buffer), so the capture check (omnistream/engine/step_graphs.py) can
run it eagerly, capture it and replay it on the same inputs; and a step that fails leaves every
slot as it was (the commit comes last), so the engine can retry its rows alone.

Host work per step, outside the regions, is a constant handful of ops whatever the batch and the
model's depth: the plan (each row's position, lengths after each transposed conv, left trims and
slot: one tensor from host ints) and the codes (placed per row in one numpy array, one tensor),
each copied to the device once, and the slice of the real rows' audio. On CUDA with graphs the
copies land in the bucket's static inputs; tests/unit/models/qwen3_omni/code2wav/test_static_step.py
counts them (tools/op-counts prints them).

Buckets: with graph buckets (CUDA graphs on) a batch pads to the talker's batch buckets (powers of
two up to `max_batch`) and its frames to the next power of two, or to the default chunk (25) when
that is nearer, so a default stream's steady window pays no padding; padding rows start a fresh
stream in the scratch slot and padding frames lie past every row's length, so neither reaches a
real row's samples. Without graph buckets (the CPU default) every batch size and window length is
its own bucket, the shapes the reference path runs: the same samples as stream.py, bit for bit.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence

import numpy as np
import torch
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as qom

from omnistream.engine.capture import capturable
from omnistream.engine.step_graphs import StepGraphs
from omnistream.models.qwen3_omni.code2wav.forward import StreamForward
from omnistream.models.qwen3_omni.code2wav.rows import SlotRows, stage_lengths
from omnistream.models.qwen3_omni.code2wav.slots import SlotStream, StateSlots
from omnistream.models.qwen3_omni.talker.code_predictor import CAPTURE_WARMUP_RUNS, batch_buckets
from omnistream.request.chunk_plan import DEFAULT_CHUNK_FRAMES

# A step's key: (batch bucket, frame bucket, each transposed conv's output length, whether each
# shifts rows by a left trim). With graph buckets the last two follow from the frame bucket.
StepKey = tuple[int, int, tuple[int, ...], tuple[bool, ...]]


def frame_bucket(frames: int, graph_buckets: bool) -> int:
    """The window length a step pads its rows' codes to: the longest row's own, or (graph buckets)
    the next power of two, or the default chunk when that is nearer (see the module doc)."""
    if not graph_buckets:
        return frames
    width = 1
    while width < frames:
        width *= 2
    return DEFAULT_CHUNK_FRAMES if frames <= DEFAULT_CHUNK_FRAMES < width else width


class StaticCode2WavStep:
    """Batched exact streaming over one `Qwen3OmniMoeCode2Wav`, state in slots (see the module doc)."""

    def __init__(
        self,
        model: qom.Qwen3OmniMoeCode2Wav,
        slots: int,
        max_batch: int,
        graph_buckets: bool = False,
        cuda_graphs: bool = False,
    ) -> None:
        self.forward = StreamForward(model)
        param = self.forward.param
        self.device = param.device
        if cuda_graphs and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; this Code2Wav runs on {self.device}")
        self.cuda_graphs = cuda_graphs
        self.graph_buckets = graph_buckets
        self.quantizers = model.config.num_quantizers
        self.buckets = batch_buckets(max_batch)
        shapes = self.forward.state_shapes()
        self.slots = StateSlots(shapes, slots, param.dtype, self.device)
        # The rows' new states between `step` and `commit`; one for every bucket (a graph writes
        # its rows, the commit reads them), so no graph holds a state-sized output of its own.
        self.staging = torch.zeros((max_batch, shapes.size), dtype=param.dtype, device=self.device)
        self.graphs = StepGraphs("code2wav step", self.device, CAPTURE_WARMUP_RUNS)
        # With CUDA graphs, per (batch bucket, frame bucket): the static plan and codes they read.
        self.static: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._fresh_trim = tuple(t.left_pad for t in self.forward.trans)

    # --- streams --------------------------------------------------------------------------------------
    def new_stream(self) -> SlotStream:
        """A stream at its start, in a slot of its own (RuntimeError when none is free)."""
        return SlotStream(self.slots.allocate(), 0, self._fresh_trim)

    def release(self, stream: SlotStream) -> None:
        """The stream ended: its slot is free for another."""
        self.slots.release(stream.slot)

    def bucket_for(self, batch: int) -> int:
        """The batch a step of `batch` rows runs at: `batch` itself, or (graph buckets) its bucket."""
        if not self.graph_buckets:
            return batch
        for bucket in self.buckets:
            if batch <= bucket:
                return bucket
        raise ValueError(f"batch {batch} exceeds Code2Wav's largest bucket {self.buckets[-1]}")

    # --- host side ------------------------------------------------------------------------------------
    @torch.no_grad()
    def step_padded(
        self, streams: Sequence[SlotStream], codes: Sequence[np.ndarray]
    ) -> tuple[torch.Tensor, list[int], list[SlotStream]]:
        """Decode each row's next frames ([num_quantizers, n >= 1] host arrays): the audio as one
        right-padded [B, samples] device tensor, each row's length, and the rows' new streams.
        Each row's audio is exactly what the one-shot decode of its whole stream has there."""
        lens = [int(c.shape[1]) for c in codes]
        if not lens or min(lens) < 1:
            raise ValueError("every row of a streaming Code2Wav step needs at least one frame")
        batch = len(lens)
        bucket = self.bucket_for(batch)
        frames = frame_bucket(max(lens), self.graph_buckets)
        stage_lens, drops, trims = stage_lengths(self.forward.strides, [s.trim for s in streams], lens)
        if self.graph_buckets:  # every row could be a first chunk: always shift, full lengths
            out_lengths = tuple(itertools.accumulate(self.forward.strides, operator.mul, initial=frames))[1:]
            shifts = (True,) * len(drops)
        else:  # the reference path's shapes
            out_lengths = tuple(max(ls) for ls in stage_lens[1:])
            shifts = tuple(any(d) for d in drops)
        # Padding rows: a fresh stream of no frames in the scratch slot.
        pad = [0] * (1 + len(stage_lens) + len(drops)) + [self.slots.scratch]
        plan = [
            [s.frames, *(ls[b] for ls in stage_lens), *(d[b] for d in drops), s.slot]
            for b, s in enumerate(streams)
        ] + [pad] * (bucket - batch)
        placed = np.zeros((bucket, self.quantizers, frames), dtype=np.int64)
        for b, (c, n) in enumerate(zip(codes, lens, strict=True)):
            placed[b, :, :n] = c
        key: StepKey = (bucket, frames, out_lengths, shifts)
        plan_in, codes_in = self._inputs(key, torch.tensor(plan, dtype=torch.long), torch.from_numpy(placed))
        if self.cuda_graphs:
            audio, new = self.graphs.run(key, lambda: self.step(plan_in, codes_in, key))
        else:
            audio, new = self.step(plan_in, codes_in, key)
        self.commit(plan_in, new, batch)
        new_streams = [
            SlotStream(s.slot, s.frames + n, tuple(t[b] for t in trims))
            for b, (s, n) in enumerate(zip(streams, lens, strict=True))
        ]
        return audio[:batch], stage_lens[-1], new_streams

    def _inputs(
        self, key: StepKey, plan: torch.Tensor, codes: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's plan and codes on the device, each in one (pinned, on CUDA) copy; with CUDA
        graphs copied into the bucket's static inputs, which its graph reads."""
        if self.device.type == "cuda":
            plan, codes = plan.pin_memory(), codes.pin_memory()
        if not self.cuda_graphs:
            return plan.to(self.device, non_blocking=True), codes.to(self.device, non_blocking=True)
        static = self.static.get(key[:2])
        if static is None:
            static = self.static[key[:2]] = (
                torch.zeros(plan.shape, dtype=plan.dtype, device=self.device),
                torch.zeros(codes.shape, dtype=codes.dtype, device=self.device),
            )
        static[0].copy_(plan, non_blocking=True)
        static[1].copy_(codes, non_blocking=True)
        return static

    def _staging(self, bucket: int) -> torch.Tensor:
        """The staging rows of a bucket; without graphs grown for a batch past `max_batch` (a test
        may raise an engine's batch), with graphs never moved (a graph writes where it was captured)."""
        if self.staging.shape[0] < bucket:
            if self.cuda_graphs:
                raise ValueError(f"batch {bucket} exceeds Code2Wav's largest bucket {self.buckets[-1]}")
            self.staging = self.staging.new_zeros((bucket, self.staging.shape[1]))
        return self.staging[:bucket]

    # --- the capturable regions -------------------------------------------------------------------------
    def step(
        self, plan: torch.Tensor, codes: torch.Tensor, key: StepKey
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[bucket, 2 + 2 * stages + 1] plan and [bucket, Q, frames] codes -> the audio [bucket,
        samples] and every row's new state [bucket, state size] (the staging rows), on the device.
        Reads the state buffer, writes only its outputs: idempotent (see the module doc)."""
        bucket, _, out_lengths, shifts = key
        with capturable("code2wav step"):
            staging = self._staging(bucket)
            fresh = (plan[:, 0] == 0)[:, None]  # a stream's first window: its state is all zeros
            old = self.slots.pool.index_select(0, plan[:, -1]).masked_fill_(fresh, 0)
            rows = SlotRows(self.slots.shapes, old, plan, out_lengths, shifts)
            audio = self.forward.run(codes, rows)
            return audio, rows.new_state(staging)

    def commit(self, plan: torch.Tensor, new: torch.Tensor, batch: int) -> None:
        """The real rows' new states into their slots (padding rows' stay in staging)."""
        with capturable("code2wav state commit"):
            self.slots.pool.index_copy_(0, plan[:batch, -1], new[:batch])
