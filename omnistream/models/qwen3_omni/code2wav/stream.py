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
the rows, so a window's op count is the same at batch 1 and batch 16 (tools/op-counts).

Written against the modules' own weights and sub-modules (norms, projections, MLPs, activations,
conv weights); only the stitching across chunks is ours, and `tests/unit/models/qwen3_omni/
test_code2wav_stream.py` holds it to the module's own forward.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as qom


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


class _Rows:
    """The step's rows: their old states in, their new state pieces out as batched tensors, in the
    order the forward meets them; per-row lengths on the host (shapes) and on the device (indices)."""

    def __init__(self, states: Sequence[Code2WavStreamState], plan: torch.Tensor, stages: int) -> None:
        self.states = states
        self.conv = 0
        self.trans = 0
        self.plan = plan  # device [B, 2 + 2 * stages]: frames, lens before/after each trans conv, drops
        self.stages = stages
        self.keys: list[torch.Tensor] = []  # per layer [B, kv_heads, window - 1, head_dim]
        self.values: list[torch.Tensor] = []
        self.tails: list[torch.Tensor] = []
        self.pending: list[torch.Tensor] = []
        self.trim: list[list[int]] = []  # per transposed conv, per row
        self.host_drops: list[list[int]] = []  # per transposed conv, per row: left trim dropped now
        self._tail_index: dict[tuple[int, int, int], torch.Tensor] = {}

    def tail_index(self, stage: int, width: int, channels: int, offsets: torch.Tensor) -> torch.Tensor:
        """[B, channels, width] gather index of each row's last `width` inputs at `stage`
        (n_b + 0..width-1), made once per step for all the convs that share it."""
        key = (stage, width, channels)
        index = self._tail_index.get(key)
        if index is None:
            at = (self.lens(stage)[:, None] + offsets)[:, None, :]
            index = self._tail_index[key] = at.expand(-1, channels, -1)
        return index

    def lens(self, stage: int) -> torch.Tensor:
        """Device [B] valid length of each row after `stage` transposed convs (0: frames in)."""
        return self.plan[:, 1 + stage]

    def drops(self, stage: int) -> torch.Tensor:
        """Device [B] left-trim samples transposed conv `stage` drops from each row."""
        return self.plan[:, 2 + self.stages + stage]

    def result(self, lens: Sequence[int]) -> list[Code2WavStreamState]:
        keys = [t.unbind(0) for t in self.keys]
        values = [t.unbind(0) for t in self.values]
        tails = [t.unbind(0) for t in self.tails]
        pending = [t.unbind(0) for t in self.pending]
        return [
            Code2WavStreamState(
                frames=s.frames + n,
                keys=tuple(k[b] for k in keys),
                values=tuple(v[b] for v in values),
                tails=tuple(t[b] for t in tails),
                pending=tuple(p[b] for p in pending),
                trim=tuple(t[b] for t in self.trim),
            )
            for b, (s, n) in enumerate(zip(self.states, lens, strict=True))
        ]


class StreamingCode2Wav:
    """Batched exact streaming over one `Qwen3OmniMoeCode2Wav` (its weights, its hyper-parameters)."""

    def __init__(self, model: qom.Qwen3OmniMoeCode2Wav) -> None:
        self.model = model
        self.config = model.config
        self._convs: list[qom.Qwen3OmniMoeCausalConvNet] = []
        self._trans: list[qom.Qwen3OmniMoeCausalTransConvNet] = []
        for module in model.modules():
            if isinstance(module, qom.Qwen3OmniMoeCausalConvNet):
                if module.stride != 1 or module.conv.padding != (0,):
                    raise ValueError("streaming Code2Wav expects stride-1 causal convs")
                self._convs.append(module)
            elif isinstance(module, qom.Qwen3OmniMoeCausalTransConvNet):
                conv = module.conv
                overlap = conv.kernel_size[0] - conv.stride[0]
                if module.left_pad != overlap or module.right_pad != overlap or conv.padding != (0,):
                    raise ValueError("streaming Code2Wav expects transposed convs trimmed by kernel - stride")
                if conv.dilation != (1,) or conv.groups != 1 or conv.output_padding != (0,):
                    raise ValueError("streaming Code2Wav expects plain transposed convs")
                self._trans.append(module)
        self._layers = list(model.pre_transformer.layers[: self.config.num_hidden_layers])
        if any(kind != "sliding_attention" for kind in self.config.layer_types[: len(self._layers)]):
            raise ValueError("streaming Code2Wav expects sliding-window attention in every layer")
        self.window = self.config.sliding_window
        self._strides = [t.conv.stride[0] for t in self._trans]
        # Index offsets the state gathers add to each row's length, made once (no per-step factories).
        device = self._param.device
        self._offsets: dict[int, torch.Tensor] = {}
        widths = (
            {self.window - 1} | {c.kernel_size - 1 for c in self._convs} | {t.left_pad for t in self._trans}
        )
        for width in widths:
            self._offsets[width] = torch.arange(width, device=device)
        self._range = torch.arange(1 << 16, device=device)  # sliced for masks and shifts

    @property
    def _param(self) -> torch.Tensor:
        return self.model.code_embedding.weight

    def new_state(self) -> Code2WavStreamState:
        p = self._param
        attn = [layer.self_attn for layer in self._layers]
        empty = tuple(p.new_zeros((a.config.num_key_value_heads, self.window - 1, a.head_dim)) for a in attn)
        return Code2WavStreamState(
            frames=0,
            keys=empty,
            values=empty,
            tails=tuple(p.new_zeros((c.conv.in_channels, c.kernel_size - 1)) for c in self._convs),
            pending=tuple(p.new_zeros((t.conv.out_channels, t.left_pad)) for t in self._trans),
            trim=tuple(t.left_pad for t in self._trans),
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
        m = self.model
        lens = [int(c.shape[1]) for c in codes]
        if not lens or min(lens) < 1:
            raise ValueError("every row of a streaming Code2Wav step needs at least one frame")
        device = self._param.device
        batch = self._padded_codes(codes, lens, device)
        stage_lens, drops, trims = self._lengths(states, lens)
        host = torch.tensor(
            [[s.frames, *(ls[b] for ls in stage_lens), *(d[b] for d in drops)] for b, s in enumerate(states)],
            dtype=torch.long,
        )
        if device.type == "cuda":
            host = host.pin_memory()
        rows = _Rows(states, host.to(device, non_blocking=True), len(self._trans))
        rows.trim = trims
        rows.host_drops = drops
        hidden = m.code_embedding(batch + m.code_offset).mean(1)
        hidden = self._pre_transformer(hidden, lens, rows)
        x = hidden.permute(0, 2, 1)
        stage = iter(stage_lens[1:])
        upsample: Any = m.upsample  # pairs of (transposed conv, ConvNeXt block)
        for trans, convnext in upsample:
            x = self._trans_conv(trans, x, next(stage), rows)
            x = self._convnext(convnext, x, rows)
        for block in m.decoder:
            x = self._decoder_part(block, x, stage, rows)
        x = x.clamp(min=-1, max=1)
        return x[:, 0], stage_lens[-1], rows.result(lens)

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

    def _lengths(
        self, states: Sequence[Code2WavStreamState], lens: list[int]
    ) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
        """On the host, per transposed conv: each row's valid length before the first and after
        each one, the left trim each drops, and the trim left after it."""
        stage_lens = [list(lens)]
        drops: list[list[int]] = []
        trims: list[list[int]] = []
        for index, stride in enumerate(self._strides):
            produced = [n * stride for n in stage_lens[-1]]
            drop = [min(s.trim[index], n) for s, n in zip(states, produced, strict=True)]
            drops.append(drop)
            trims.append([s.trim[index] - d for s, d in zip(states, drop, strict=True)])
            stage_lens.append([n - d for n, d in zip(produced, drop, strict=True)])
        return stage_lens, drops, trims

    # --- pre-transformer ----------------------------------------------------------------------------
    def _pre_transformer(self, hidden: torch.Tensor, lens: list[int], rows: _Rows) -> torch.Tensor:
        pt = self.model.pre_transformer
        length = hidden.shape[1]
        past = self.window - 1
        frames, counts = rows.plan[:, 0:1], rows.lens(0)[:, None]
        # Positions of the queries [B, T] and of the keys [B, past + T] (the cache, then the queries):
        # key k of row b is at stream position frames_b - past + k; negative ones are empty slots.
        kpos = frames - past + torch.arange(past + length, device=hidden.device)
        qpos = kpos[:, past:]
        qvalid = qpos < frames + counts
        cos, sin = pt.rotary_emb(hidden, qpos)
        seen = (kpos[:, None, :] <= qpos[:, :, None]) & (kpos[:, None, :] >= 0)
        seen &= kpos[:, None, :] > qpos[:, :, None] - self.window
        seen |= ~qvalid[:, :, None]  # padding queries see anything: no empty softmax rows (NaN)
        mask = seen[:, None]
        # Each row's new cache: the last `past` of its valid keys, entries [n_b, n_b + past).
        keep = (counts + self._offsets[past])[:, None, :, None]
        for i, layer in enumerate(self._layers):
            residual = hidden
            h = layer.input_layernorm(hidden)
            attn_out = self._attention(layer.self_attn, h, i, cos, sin, mask, keep, rows)
            hidden = residual + layer.self_attn_layer_scale(attn_out)
            residual = hidden
            hidden = residual + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(hidden)))
        normed: torch.Tensor = pt.norm(hidden)
        return normed

    def _attention(
        self,
        attn: qom.Qwen3OmniMoeCode2WavAttention,
        h: torch.Tensor,
        index: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        keep: torch.Tensor,
        rows: _Rows,
    ) -> torch.Tensor:
        batch, length = h.shape[:2]
        shape = (batch, length, -1, attn.head_dim)
        q = attn.q_norm(attn.q_proj(h).view(shape)).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(h).view(shape)).transpose(1, 2)
        v = attn.v_proj(h).view(shape).transpose(1, 2)
        q, k = qom.apply_rotary_pos_emb(q, k, cos, sin)
        keys = torch.cat([torch.stack([s.keys[index] for s in rows.states]), k], dim=2)
        values = torch.cat([torch.stack([s.values[index] for s in rows.states]), v], dim=2)
        groups = attn.num_key_value_groups
        out = F.scaled_dot_product_attention(
            q,
            keys.repeat_interleave(groups, dim=1),
            values.repeat_interleave(groups, dim=1),
            attn_mask=mask,
            scale=attn.scaling,
        )
        index_kv = keep.expand(-1, keys.shape[1], -1, keys.shape[3])
        rows.keys.append(keys.gather(2, index_kv))
        rows.values.append(values.gather(2, index_kv))
        projected: torch.Tensor = attn.o_proj(out.transpose(1, 2).reshape(batch, length, -1))
        return projected

    # --- convolutions -------------------------------------------------------------------------------
    def _conv(self, module: qom.Qwen3OmniMoeCausalConvNet, x: torch.Tensor, rows: _Rows) -> torch.Tensor:
        """Causal conv: the row's input tail stands in for the left padding (zeros at the start)."""
        index = rows.conv
        rows.conv += 1
        if self._convs[index] is not module:
            raise RuntimeError("streaming Code2Wav met its convs out of order")
        tail = module.kernel_size - 1
        full = torch.cat([torch.stack([s.tails[index] for s in rows.states]), x], dim=-1)
        # Row b's new tail: its last `tail` inputs, full[b, :, n_b : n_b + tail].
        at = rows.tail_index(rows.trans, tail, full.shape[1], self._offsets[tail])
        rows.tails.append(full.gather(2, at))
        conv: torch.Tensor = module.conv(full)
        return conv

    def _trans_conv(
        self, module: qom.Qwen3OmniMoeCausalTransConvNet, x: torch.Tensor, out_lens: list[int], rows: _Rows
    ) -> torch.Tensor:
        """Transposed conv: emit outputs up to `frames * stride`, carry the overlap the next frame
        adds to, and drop the left trim once per stream (`out_lens`: each row's emitted length)."""
        index = rows.trans
        rows.trans += 1
        if self._trans[index] is not module:
            raise RuntimeError("streaming Code2Wav met its transposed convs out of order")
        conv = module.conv
        stride = conv.stride[0]
        overlap = conv.kernel_size[0] - stride
        counts = rows.lens(index)[:, None]
        valid = self._positions(x.shape[-1], x.device)[None, :] < counts
        x = x * valid[:, None, :].to(x.dtype)  # padding frames must add nothing to a row's overlap
        y = F.conv_transpose1d(x, conv.weight, None, stride=stride)
        pending = torch.stack([s.pending[index] for s in rows.states])
        y[:, :, :overlap] += pending
        # Row b's new overlap: y[b, :, n_b * stride : n_b * stride + overlap].
        at = (counts * stride + self._offsets[overlap])[:, None, :]
        rows.pending.append(y.gather(2, at.expand(-1, y.shape[1], -1)))
        longest = max(out_lens)
        if any(rows.host_drops[index]):
            # First chunk of some row: shift each row left by the trim it drops now.
            shift = rows.drops(index)[:, None] + self._positions(longest, x.device)[None, :]
            out = y.gather(2, shift[:, None, :].expand(-1, y.shape[1], -1))
        else:
            out = y[:, :, :longest]
        return out + conv.bias[:, None] if conv.bias is not None else out

    def _positions(self, length: int, device: torch.device) -> torch.Tensor:
        """[length] 0..length-1 on the device, sliced from one range grown as needed."""
        if self._range.shape[0] < length:
            self._range = torch.arange(2 * length, device=device)
        return self._range[:length]

    def _convnext(self, block: qom.Qwen3OmniMoeConvNeXtBlock, x: torch.Tensor, rows: _Rows) -> torch.Tensor:
        h = self._conv(block.dwconv, x, rows).permute(0, 2, 1)
        h = block.pwconv2(block.act(block.pwconv1(block.norm(h))))
        out: torch.Tensor = x + (block.gamma * h).permute(0, 2, 1)
        return out

    def _residual(
        self, unit: qom.Qwen3OmniMoeCode2WavDecoderResidualUnit, x: torch.Tensor, rows: _Rows
    ) -> torch.Tensor:
        h = self._conv(unit.conv1, unit.act1(x), rows)
        return x + self._conv(unit.conv2, unit.act2(h), rows)

    def _decoder_part(
        self, part: torch.nn.Module, x: torch.Tensor, stage: Iterator[Any], rows: _Rows
    ) -> torch.Tensor:
        """One decoder part; `stage` yields the rows' lengths after each transposed conv in turn."""
        if isinstance(part, qom.Qwen3OmniMoeCausalConvNet):
            return self._conv(part, x, rows)
        if isinstance(part, qom.Qwen3OmniMoeSnakeBeta):
            snake: torch.Tensor = part(x)  # pointwise: padding stays beyond each row's length
            return snake
        if isinstance(part, qom.Qwen3OmniMoeCausalTransConvNet):
            return self._trans_conv(part, x, next(stage), rows)
        if isinstance(part, qom.Qwen3OmniMoeCode2WavDecoderResidualUnit):
            return self._residual(part, x, rows)
        if isinstance(part, qom.Qwen3OmniMoeCode2WavDecoderBlock):
            for sub in part.block:
                x = self._decoder_part(sub, x, stage, rows)
            return x
        raise TypeError(f"streaming Code2Wav does not know {type(part).__name__}")
