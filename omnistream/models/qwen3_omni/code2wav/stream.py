"""Exact streaming Code2Wav: decode codec frames chunk by chunk, batched across requests.

Every part of `Qwen3OmniMoeCode2Wav` is causal, so nothing needs recomputing: a request carries
the little state each layer needs to continue where its last chunk stopped, and the samples a
chunk emits are exactly the ones `code2wav(all codes)` has at those positions.

State per request (`Code2WavStreamState`):
- pre-transformer: per layer the last `sliding_window - 1` rotated keys and values (a query sees
  itself and the `window - 1` frames before it), always that many slots (empty ones, before the
  stream's start, are masked by position); RoPE positions continue across chunks;
- each causal conv: its last `receptive - 1` input samples (the zeros it pads with on the left,
  then real history);
- each transposed conv: the `kernel - stride` output samples that the next input frame will still
  add to (its pending overlap), and how much of its left trim is still to drop.

A transposed conv's output up to `frames * stride` is final once those frames are in, and its
right trim drops exactly the pending overlap, so a chunk emits everything no future frame can
change and the end of a stream has nothing left to flush: the full model's 555 "missing" samples
are the right trims, never emitted by either path.

Fixed-shape state is what lets a step run without per-row loops: one stack of the rows' states
per piece of state, one gather of every row's new piece (at its own length), one `unbind` back to
the rows, so a window's op count is the same at batch 1 and batch 16.

The forward itself is forward.py's, written against the modules' own weights and sub-modules
(norms, projections, MLPs, activations, conv weights); only the stitching across chunks is ours, and
tests/reference/models/qwen3_omni/code2wav/test_stream.py holds it to the module's own forward.
This module is the reference path, with immutable per-request states; the engine runs the same
forward as a fixed-shape, graph-capturable step over per-slot state (static_step.py), which
tests/unit/models/qwen3_omni/code2wav/test_static_step.py holds to this one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as qom

from omnistream.models.qwen3_omni.code2wav.forward import StreamForward
from omnistream.models.qwen3_omni.code2wav.rows import StackedRows, stage_lengths


@dataclass(frozen=True)
class Code2WavStreamState:
    """One request's decoder state between chunks; immutable, so a failed step changes nothing.

    Every tensor has a fixed shape, whatever the request's position, so a step stacks the rows'
    states into one batch per tensor and splits the new ones back with one `unbind` each: its op
    count does not grow with the batch. The tensors may be views of the step's batched ones."""

    frames: int
    keys: tuple[torch.Tensor, ...]  # per layer [kv_heads, window - 1, head_dim], after RoPE
    values: tuple[torch.Tensor, ...]  # slot j holds stream position frames - (window - 1) + j
    tails: tuple[torch.Tensor, ...]  # per causal conv, forward order: [in_channels, receptive - 1]
    pending: tuple[torch.Tensor, ...]  # per transposed conv: [out_channels, kernel - stride]
    trim: tuple[int, ...]  # per transposed conv: left-trim samples not dropped yet


class StreamingCode2Wav:
    """Batched exact streaming over one `Qwen3OmniMoeCode2Wav` (its weights, its hyper-parameters)."""

    def __init__(self, model: qom.Qwen3OmniMoeCode2Wav) -> None:
        self.model = model
        self.config = model.config
        self.forward = StreamForward(model)

    def new_state(self) -> Code2WavStreamState:
        p = self.forward.param
        shapes = self.forward.state_shapes()
        empty = tuple(p.new_zeros(shape) for shape in shapes.keys)
        return Code2WavStreamState(
            frames=0,
            keys=empty,
            values=empty,
            tails=tuple(p.new_zeros(shape) for shape in shapes.tails),
            pending=tuple(p.new_zeros(shape) for shape in shapes.pending),
            trim=tuple(t.left_pad for t in self.forward.trans),
        )

    @torch.no_grad()
    def step(
        self, states: Sequence[Code2WavStreamState], codes: Sequence[torch.Tensor]
    ) -> tuple[list[torch.Tensor], list[Code2WavStreamState]]:
        """Decode each row's next frames ([num_quantizers, n >= 1] each): (audio per row, new states).

        Rows may sit at different positions and bring different numbers of frames; each row's
        audio is exactly what the one-shot decode of its whole stream has at those samples.
        """
        audio, lens, new_states = self.step_padded(states, codes)
        return [audio[b, : lens[b]] for b in range(len(lens))], new_states

    @torch.no_grad()
    def step_padded(
        self, states: Sequence[Code2WavStreamState], codes: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[int], list[Code2WavStreamState]]:
        """`step` with the audio as one right-padded [B, samples] tensor and each row's length, so
        a caller moves the whole step's audio to the host in one copy. The codes may be on the host:
        they are padded there and cross to the device in one (pinned, on CUDA) copy, with the step's
        plan (each row's position, its lengths after every transposed conv, its left trims).

        No step of the forward loops over rows: the rows' states are stacked into one tensor per
        piece of state, and each new piece is one gather of every row's last samples."""
        lens = [int(c.shape[1]) for c in codes]
        if not lens or min(lens) < 1:
            raise ValueError("every row of a streaming Code2Wav step needs at least one frame")
        device = self.forward.param.device
        batch = self._padded_codes(codes, lens, device)
        stage_lens, drops, trims = stage_lengths(self.forward.strides, [s.trim for s in states], lens)
        host = torch.tensor(
            [[s.frames, *(ls[b] for ls in stage_lens), *(d[b] for d in drops)] for b, s in enumerate(states)],
            dtype=torch.long,
        )
        if device.type == "cuda":
            host = host.pin_memory()
        rows = StackedRows(
            [(s.keys, s.values, s.tails, s.pending) for s in states],
            host.to(device, non_blocking=True),
            out_lengths=[max(ls) for ls in stage_lens[1:]],
            shifts=[any(d) for d in drops],
        )
        audio = self.forward.run(batch, rows)
        keys = [t.unbind(0) for t in rows.keys]
        values = [t.unbind(0) for t in rows.values]
        tails = [t.unbind(0) for t in rows.tails]
        pending = [t.unbind(0) for t in rows.pending]
        new_states = [
            Code2WavStreamState(
                frames=s.frames + n,
                keys=tuple(k[b] for k in keys),
                values=tuple(v[b] for v in values),
                tails=tuple(t[b] for t in tails),
                pending=tuple(p[b] for p in pending),
                trim=tuple(t[b] for t in trims),
            )
            for b, (s, n) in enumerate(zip(states, lens, strict=True))
        ]
        return audio, stage_lens[-1], new_states

    def _padded_codes(
        self, codes: Sequence[torch.Tensor], lens: list[int], device: torch.device
    ) -> torch.Tensor:
        """[B, Q, max n] on the device: the rows' codes right-padded with zeros, placed on the host by
        one indexed copy of all rows (not one copy per row), then moved in one copy."""
        longest = max(lens)
        quantizers = self.config.num_quantizers
        columns = torch.tensor([b * longest + t for b, n in enumerate(lens) for t in range(n)])
        flat = codes[0].new_zeros((quantizers, len(codes) * longest), dtype=torch.long)
        flat[:, columns] = torch.cat(list(codes), dim=1).to(torch.long)
        host = flat.view(quantizers, len(codes), longest).transpose(0, 1)
        if host.device.type == "cpu" and device.type == "cuda":
            host = host.pin_memory()
        return host.to(device, non_blocking=True)
