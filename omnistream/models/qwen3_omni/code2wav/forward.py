"""The batched streaming forward of `Qwen3OmniMoeCode2Wav`: one window of every row, from carried state.

Every part of the decoder is causal, so a row continues where its last window stopped from a little
state per layer (omnistream/models/qwen3_omni/code2wav/stream.py says which). This module is the
forward itself, written against the model's own weights and sub-modules (norms, projections, MLPs,
activations, conv weights); where a row's old state comes from and where its new state goes is the
caller's `StepRows` (rows.py): stacked from immutable per-request states (`StreamingCode2Wav`, the
reference path) or gathered from and written to per-slot buffers (`StaticCode2WavStep`, the
engine's fixed-shape, graph-capturable step). Both run exactly these ops in this order.

No op loops over rows and nothing reads a device value on the host: rows' lengths come in the
step's plan (a device tensor), so the same forward is one CUDA graph per shape. Shapes depend only
on the codes' [B, Q, T] and the lengths the rows object gives per transposed conv.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as qom

from omnistream.models.qwen3_omni.code2wav.rows import StateShapes, StepRows


class StreamForward:
    """The streaming forward over one `Qwen3OmniMoeCode2Wav` (its weights, its hyper-parameters)."""

    def __init__(self, model: qom.Qwen3OmniMoeCode2Wav) -> None:
        self.model = model
        self.config = model.config
        self.convs: list[qom.Qwen3OmniMoeCausalConvNet] = []
        self.trans: list[qom.Qwen3OmniMoeCausalTransConvNet] = []
        for module in model.modules():
            if isinstance(module, qom.Qwen3OmniMoeCausalConvNet):
                if module.stride != 1 or module.conv.padding != (0,):
                    raise ValueError("streaming Code2Wav expects stride-1 causal convs")
                self.convs.append(module)
            elif isinstance(module, qom.Qwen3OmniMoeCausalTransConvNet):
                conv = module.conv
                overlap = conv.kernel_size[0] - conv.stride[0]
                if module.left_pad != overlap or module.right_pad != overlap or conv.padding != (0,):
                    raise ValueError("streaming Code2Wav expects transposed convs trimmed by kernel - stride")
                if conv.dilation != (1,) or conv.groups != 1 or conv.output_padding != (0,):
                    raise ValueError("streaming Code2Wav expects plain transposed convs")
                self.trans.append(module)
        self.layers = list(model.pre_transformer.layers[: self.config.num_hidden_layers])
        if any(kind != "sliding_attention" for kind in self.config.layer_types[: len(self.layers)]):
            raise ValueError("streaming Code2Wav expects sliding-window attention in every layer")
        self.window = self.config.sliding_window
        self.strides = [t.conv.stride[0] for t in self.trans]
        # Index offsets the state gathers add to each row's length, made once (no per-step factories).
        device = self.param.device
        self._offsets: dict[int, torch.Tensor] = {}
        widths = (
            {self.window - 1} | {c.kernel_size - 1 for c in self.convs} | {t.left_pad for t in self.trans}
        )
        for width in widths:
            self._offsets[width] = torch.arange(width, device=device)
        self._range = torch.arange(1 << 16, device=device)  # sliced for positions, masks and shifts
        self._old_ranges: list[torch.Tensor] = []  # outgrown ranges, kept alive (see `positions`)

    @property
    def param(self) -> torch.Tensor:
        """A weight of the model: its device and dtype are the step's."""
        weight: torch.Tensor = self.model.code_embedding.weight
        return weight

    def state_shapes(self) -> StateShapes:
        """The shapes of one row's state pieces, in the order the forward meets them."""
        attn = [layer.self_attn for layer in self.layers]
        cache = [(a.config.num_key_value_heads, self.window - 1, a.head_dim) for a in attn]
        return StateShapes(
            keys=tuple(cache),
            values=tuple(cache),
            tails=tuple((c.conv.in_channels, c.kernel_size - 1) for c in self.convs),
            pending=tuple((t.conv.out_channels, t.left_pad) for t in self.trans),
        )

    def positions(self, length: int) -> torch.Tensor:
        """[length] 0..length-1 on the device, sliced from one range grown as needed. An outgrown
        range stays alive: a captured CUDA graph may still read it (it holds no reference itself)."""
        if self._range.shape[0] < length:
            self._old_ranges.append(self._range)
            self._range = torch.arange(2 * length, device=self._range.device)
        return self._range[:length]

    def run(self, codes: torch.Tensor, rows: StepRows) -> torch.Tensor:
        """[B, Q, T] codes (each row's valid frames first, its length in `rows`) -> [B, samples]
        audio, each row's first `samples_b` valid; the rows' new state pieces go to `rows`."""
        m = self.model
        hidden = m.code_embedding(codes + m.code_offset).mean(1)
        hidden = self._pre_transformer(hidden, rows)
        x = hidden.permute(0, 2, 1)
        upsample: Any = m.upsample  # pairs of (transposed conv, ConvNeXt block)
        for trans, convnext in upsample:
            x = self._trans_conv(trans, x, rows)
            x = self._convnext(convnext, x, rows)
        for block in m.decoder:
            x = self._decoder_part(block, x, rows)
        x = x.clamp(min=-1, max=1)
        return x[:, 0]

    # --- pre-transformer ----------------------------------------------------------------------------
    def _pre_transformer(self, hidden: torch.Tensor, rows: StepRows) -> torch.Tensor:
        pt = self.model.pre_transformer
        length = hidden.shape[1]
        past = self.window - 1
        frames, counts = rows.frames()[:, None], rows.lens(0)[:, None]
        # Positions of the queries [B, T] and of the keys [B, past + T] (the cache, then the queries):
        # key k of row b is at stream position frames_b - past + k; negative ones are empty slots.
        kpos = frames - past + self.positions(past + length)
        qpos = kpos[:, past:]
        qvalid = qpos < frames + counts
        cos, sin = pt.rotary_emb(hidden, qpos)
        seen = (kpos[:, None, :] <= qpos[:, :, None]) & (kpos[:, None, :] >= 0)
        seen &= kpos[:, None, :] > qpos[:, :, None] - self.window
        seen |= ~qvalid[:, :, None]  # padding queries see anything: no empty softmax rows (NaN)
        mask = seen[:, None]
        # Each row's new cache: the last `past` of its valid keys, entries [n_b, n_b + past).
        keep = (counts + self._offsets[past])[:, None, :, None]
        for i, layer in enumerate(self.layers):
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
        rows: StepRows,
    ) -> torch.Tensor:
        batch, length = h.shape[:2]
        shape = (batch, length, -1, attn.head_dim)
        q = attn.q_norm(attn.q_proj(h).view(shape)).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(h).view(shape)).transpose(1, 2)
        v = attn.v_proj(h).view(shape).transpose(1, 2)
        q, k = qom.apply_rotary_pos_emb(q, k, cos, sin)
        keys = torch.cat([rows.old_keys(index), k], dim=2)
        values = torch.cat([rows.old_values(index), v], dim=2)
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
    def _conv(self, module: qom.Qwen3OmniMoeCausalConvNet, x: torch.Tensor, rows: StepRows) -> torch.Tensor:
        """Causal conv: the row's input tail stands in for the left padding (zeros at the start)."""
        index = rows.conv
        rows.conv += 1
        if self.convs[index] is not module:
            raise RuntimeError("streaming Code2Wav met its convs out of order")
        tail = module.kernel_size - 1
        full = torch.cat([rows.old_tails(index), x], dim=-1)
        # Row b's new tail: its last `tail` inputs, full[b, :, n_b : n_b + tail].
        at = rows.tail_index(rows.trans, tail, full.shape[1], self._offsets[tail])
        rows.tails.append(full.gather(2, at))
        conv: torch.Tensor = module.conv(full)
        return conv

    def _trans_conv(
        self, module: qom.Qwen3OmniMoeCausalTransConvNet, x: torch.Tensor, rows: StepRows
    ) -> torch.Tensor:
        """Transposed conv: emit outputs up to `frames * stride`, carry the overlap the next frame
        adds to, and drop the left trim once per stream (each row's emitted length: `rows.lens`)."""
        index = rows.trans
        rows.trans += 1
        if self.trans[index] is not module:
            raise RuntimeError("streaming Code2Wav met its transposed convs out of order")
        conv = module.conv
        stride = conv.stride[0]
        overlap = conv.kernel_size[0] - stride
        counts = rows.lens(index)[:, None]
        valid = self.positions(x.shape[-1])[None, :] < counts
        x = x * valid[:, None, :].to(x.dtype)  # padding frames must add nothing to a row's overlap
        y = F.conv_transpose1d(x, conv.weight, None, stride=stride)
        y[:, :, :overlap] += rows.old_pending(index)
        # Row b's new overlap: y[b, :, n_b * stride : n_b * stride + overlap].
        at = (counts * stride + self._offsets[overlap])[:, None, :]
        rows.pending.append(y.gather(2, at.expand(-1, y.shape[1], -1)))
        length = rows.out_lengths[index]
        if rows.shifts[index]:
            # First chunk of some row: shift each row left by the trim it drops now.
            shift = rows.drops(index)[:, None] + self.positions(length)[None, :]
            out = y.gather(2, shift[:, None, :].expand(-1, y.shape[1], -1))
        else:
            out = y[:, :, :length]
        return out + conv.bias[:, None] if conv.bias is not None else out

    def _convnext(
        self, block: qom.Qwen3OmniMoeConvNeXtBlock, x: torch.Tensor, rows: StepRows
    ) -> torch.Tensor:
        h = self._conv(block.dwconv, x, rows).permute(0, 2, 1)
        h = block.pwconv2(block.act(block.pwconv1(block.norm(h))))
        out: torch.Tensor = x + (block.gamma * h).permute(0, 2, 1)
        return out

    def _residual(
        self, unit: qom.Qwen3OmniMoeCode2WavDecoderResidualUnit, x: torch.Tensor, rows: StepRows
    ) -> torch.Tensor:
        h = self._conv(unit.conv1, unit.act1(x), rows)
        return x + self._conv(unit.conv2, unit.act2(h), rows)

    def _decoder_part(self, part: torch.nn.Module, x: torch.Tensor, rows: StepRows) -> torch.Tensor:
        """One decoder part (a block recursively), in the order the module's own forward runs them."""
        if isinstance(part, qom.Qwen3OmniMoeCausalConvNet):
            return self._conv(part, x, rows)
        if isinstance(part, qom.Qwen3OmniMoeSnakeBeta):
            snake: torch.Tensor = part(x)  # pointwise: padding stays beyond each row's length
            return snake
        if isinstance(part, qom.Qwen3OmniMoeCausalTransConvNet):
            return self._trans_conv(part, x, rows)
        if isinstance(part, qom.Qwen3OmniMoeCode2WavDecoderResidualUnit):
            return self._residual(part, x, rows)
        if isinstance(part, qom.Qwen3OmniMoeCode2WavDecoderBlock):
            for sub in part.block:
                x = self._decoder_part(sub, x, rows)
            return x
        raise TypeError(f"streaming Code2Wav does not know {type(part).__name__}")
