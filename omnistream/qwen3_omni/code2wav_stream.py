"""Exact streaming Code2Wav: decode codec frames chunk by chunk, batched across requests.

Every part of `Qwen3OmniMoeCode2Wav` is causal, so nothing needs recomputing: a request carries
the little state each layer needs to continue where its last chunk stopped, and the samples a
chunk emits are exactly the ones `code2wav(all codes)` has at those positions.

State per request (`Code2WavStreamState`):
- pre-transformer: per layer the last `sliding_window - 1` rotated keys and values (a query sees
  itself and the `window - 1` frames before it); RoPE positions continue across chunks;
- each causal conv: its last `receptive - 1` input samples (the zeros it pads with on the left,
  then real history);
- each transposed conv: the `kernel - stride` output samples that the next input frame will still
  add to (its pending overlap), and how much of its left trim is still to drop.

A transposed conv's output up to `frames * stride` is final once those frames are in, and its
right trim drops exactly the pending overlap, so a chunk emits everything no future frame can
change and the end of a stream has nothing left to flush: the full model's 555 "missing" samples
are the right trims, never emitted by either path.

Written against the modules' own weights and sub-modules (norms, projections, MLPs, activations,
conv weights); only the stitching across chunks is ours, and `tests/unit/qwen3_omni/
test_code2wav_stream.py` holds it to the module's own forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as qom

_NEG_POS = -(2**40)  # key position of an empty cache slot: never inside any query's window


@dataclass(frozen=True)
class Code2WavStreamState:
    """One request's decoder state between chunks; immutable, so a failed step changes nothing."""

    frames: int
    keys: tuple[torch.Tensor, ...]  # per layer [kv_heads, cached, head_dim], after RoPE
    values: tuple[torch.Tensor, ...]
    tails: tuple[torch.Tensor, ...]  # per causal conv, forward order: [in_channels, receptive - 1]
    pending: tuple[torch.Tensor, ...]  # per transposed conv: [out_channels, kernel - stride]
    trim: tuple[int, ...]  # per transposed conv: left-trim samples not dropped yet


class _Rows:
    """The rows' old states in, their new state pieces out, in the order the forward meets them."""

    def __init__(self, states: Sequence[Code2WavStreamState]) -> None:
        self.states = states
        self.conv = 0
        self.trans = 0
        n = len(states)
        self.keys: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self.values: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self.tails: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self.pending: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self.trim: list[list[int]] = [[] for _ in range(n)]
        self._kpos: dict[tuple[int, ...], torch.Tensor] = {}

    def key_positions(self, past: list[int], length: int, width: int, device: torch.device) -> torch.Tensor:
        """[B, width] stream position of each attention key (`_NEG_POS` for empty places), built on
        the host and copied once per distinct cache-length pattern of the step (sliding and full
        layers), not once per layer and row."""
        key = tuple(past)
        if key not in self._kpos:
            table = [
                [s.frames - c + j if j < c + length else _NEG_POS for j in range(width)]
                for s, c in zip(self.states, past, strict=True)
            ]
            self._kpos[key] = torch.tensor(table, dtype=torch.long).to(device, non_blocking=True)
        return self._kpos[key]

    def result(self, lens: Sequence[int]) -> list[Code2WavStreamState]:
        return [
            Code2WavStreamState(
                frames=s.frames + n,
                keys=tuple(self.keys[b]),
                values=tuple(self.values[b]),
                tails=tuple(self.tails[b]),
                pending=tuple(self.pending[b]),
                trim=tuple(self.trim[b]),
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

    @property
    def _param(self) -> torch.Tensor:
        return self.model.code_embedding.weight

    def new_state(self) -> Code2WavStreamState:
        p = self._param
        attn = [layer.self_attn for layer in self._layers]
        empty = tuple(p.new_zeros((a.config.num_key_value_heads, 0, a.head_dim)) for a in attn)
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
        they are padded there and cross to the device in one (pinned, on CUDA) copy."""
        m = self.model
        lens = [int(c.shape[1]) for c in codes]
        if not lens or min(lens) < 1:
            raise ValueError("every row of a streaming Code2Wav step needs at least one frame")
        host = torch.zeros(
            (len(codes), self.config.num_quantizers, max(lens)), dtype=torch.long, device=codes[0].device
        )
        for b, c in enumerate(codes):
            host[b, :, : lens[b]] = c
        device = self._param.device
        if host.device.type == "cpu" and device.type == "cuda":
            host = host.pin_memory()
        batch = host.to(device, non_blocking=True)
        rows = _Rows(states)
        hidden = m.code_embedding(batch + m.code_offset).mean(1)
        hidden = self._pre_transformer(hidden, lens, rows)
        x = hidden.permute(0, 2, 1)
        frame_lens = lens
        for trans, convnext in m.upsample:
            x, lens = self._trans_conv(trans, x, lens, rows)
            x = self._convnext(convnext, x, lens, rows)
        for block in m.decoder:
            x, lens = self._decoder_part(block, x, lens, rows)
        x = x.clamp(min=-1, max=1)
        return x[:, 0], lens, rows.result(frame_lens)

    # --- pre-transformer ----------------------------------------------------------------------------
    def _pre_transformer(self, hidden: torch.Tensor, lens: list[int], rows: _Rows) -> torch.Tensor:
        pt = self.model.pre_transformer
        length = hidden.shape[1]
        device = hidden.device
        starts = torch.tensor([s.frames for s in rows.states], device=device)
        steps = torch.arange(length, device=device)
        qpos = starts[:, None] + steps  # [B, T]
        qvalid = steps[None, :] < torch.tensor(lens, device=device)[:, None]
        cos, sin = pt.rotary_emb(hidden, qpos)
        for i, layer in enumerate(self._layers):
            sliding = self.config.layer_types[i] == "sliding_attention"
            residual = hidden
            h = layer.input_layernorm(hidden)
            attn_out = self._attention(layer.self_attn, h, i, cos, sin, qpos, qvalid, lens, rows, sliding)
            hidden = residual + layer.self_attn_layer_scale(attn_out)
            residual = hidden
            hidden = residual + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(hidden)))
        return pt.norm(hidden)

    def _attention(
        self,
        attn: qom.Qwen3OmniMoeCode2WavAttention,
        h: torch.Tensor,
        index: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        qpos: torch.Tensor,
        qvalid: torch.Tensor,
        lens: list[int],
        rows: _Rows,
        sliding: bool,
    ) -> torch.Tensor:
        batch, length = h.shape[:2]
        shape = (batch, length, -1, attn.head_dim)
        q = attn.q_norm(attn.q_proj(h).view(shape)).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(h).view(shape)).transpose(1, 2)
        v = attn.v_proj(h).view(shape).transpose(1, 2)
        q, k = qom.apply_rotary_pos_emb(q, k, cos, sin)
        past = [s.keys[index].shape[1] for s in rows.states]
        width = max(past) + length
        keys = k.new_zeros((batch, k.shape[1], width, attn.head_dim))
        values = torch.zeros_like(keys)
        for b, state in enumerate(rows.states):
            c = past[b]
            keys[b, :, :c] = state.keys[index]
            values[b, :, :c] = state.values[index]
            keys[b, :, c : c + length] = k[b]
            values[b, :, c : c + length] = v[b]
        kpos = rows.key_positions(past, length, width, h.device)
        seen = (kpos[:, None, :] <= qpos[:, :, None]) & (kpos[:, None, :] > _NEG_POS)
        if sliding:
            seen &= kpos[:, None, :] > qpos[:, :, None] - attn.sliding_window
        seen |= ~qvalid[:, :, None]  # padding queries see anything: no empty softmax rows (NaN)
        groups = attn.num_key_value_groups
        out = F.scaled_dot_product_attention(
            q,
            keys.repeat_interleave(groups, dim=1),
            values.repeat_interleave(groups, dim=1),
            attn_mask=seen[:, None],
            scale=attn.scaling,
        )
        keep = attn.sliding_window - 1 if sliding else None
        for b in range(batch):
            c, n = past[b], lens[b]
            kept_k = keys[b, :, : c + n]
            kept_v = values[b, :, : c + n]
            if keep is not None:
                kept_k, kept_v = kept_k[:, max(0, c + n - keep) :], kept_v[:, max(0, c + n - keep) :]
            rows.keys[b].append(kept_k.clone())
            rows.values[b].append(kept_v.clone())
        return attn.o_proj(out.transpose(1, 2).reshape(batch, length, -1))

    # --- convolutions -------------------------------------------------------------------------------
    def _conv(
        self, module: qom.Qwen3OmniMoeCausalConvNet, x: torch.Tensor, lens: list[int], rows: _Rows
    ) -> torch.Tensor:
        """Causal conv: the row's input tail stands in for the left padding (zeros at the start)."""
        index = rows.conv
        rows.conv += 1
        if self._convs[index] is not module:
            raise RuntimeError("streaming Code2Wav met its convs out of order")
        tail = module.kernel_size - 1
        full = torch.cat([torch.stack([s.tails[index] for s in rows.states]), x], dim=-1)
        for b, n in enumerate(lens):
            rows.tails[b].append(full[b, :, n : n + tail].clone())
        return module.conv(full)

    def _trans_conv(
        self, module: qom.Qwen3OmniMoeCausalTransConvNet, x: torch.Tensor, lens: list[int], rows: _Rows
    ) -> tuple[torch.Tensor, list[int]]:
        """Transposed conv: emit outputs up to `frames * stride`, carry the overlap the next frame
        adds to, and drop the left trim once per stream."""
        index = rows.trans
        rows.trans += 1
        if self._trans[index] is not module:
            raise RuntimeError("streaming Code2Wav met its transposed convs out of order")
        conv = module.conv
        stride = conv.stride[0]
        overlap = conv.kernel_size[0] - stride
        limit = torch.tensor(lens, device=x.device)[:, None]
        valid = torch.arange(x.shape[-1], device=x.device)[None, :] < limit
        x = x * valid[:, None, :].to(x.dtype)  # padding frames must add nothing to a row's overlap
        y = F.conv_transpose1d(x, conv.weight, None, stride=stride)
        bias = conv.bias[:, None] if conv.bias is not None else 0
        pieces = []
        for b, (state, n) in enumerate(zip(rows.states, lens, strict=True)):
            row = y[b, :, : n * stride + overlap].clone()
            row[:, :overlap] += state.pending[index]
            rows.pending[b].append(row[:, n * stride :].clone())
            out = row[:, : n * stride] + bias
            drop = min(state.trim[index], out.shape[-1])
            rows.trim[b].append(state.trim[index] - drop)
            pieces.append(out[:, drop:])
        return _pad(pieces), [p.shape[-1] for p in pieces]

    def _convnext(
        self, block: qom.Qwen3OmniMoeConvNeXtBlock, x: torch.Tensor, lens: list[int], rows: _Rows
    ) -> torch.Tensor:
        h = self._conv(block.dwconv, x, lens, rows).permute(0, 2, 1)
        h = block.pwconv2(block.act(block.pwconv1(block.norm(h))))
        return x + (block.gamma * h).permute(0, 2, 1)

    def _residual(
        self, unit: qom.Qwen3OmniMoeCode2WavDecoderResidualUnit, x: torch.Tensor, lens: list[int], rows: _Rows
    ) -> torch.Tensor:
        h = self._conv(unit.conv1, unit.act1(x), lens, rows)
        return x + self._conv(unit.conv2, unit.act2(h), lens, rows)

    def _decoder_part(
        self, part: torch.nn.Module, x: torch.Tensor, lens: list[int], rows: _Rows
    ) -> tuple[torch.Tensor, list[int]]:
        if isinstance(part, qom.Qwen3OmniMoeCausalConvNet):
            return self._conv(part, x, lens, rows), lens
        if isinstance(part, qom.Qwen3OmniMoeSnakeBeta):
            return part(x), lens  # pointwise: padding stays beyond each row's length
        if isinstance(part, qom.Qwen3OmniMoeCausalTransConvNet):
            return self._trans_conv(part, x, lens, rows)
        if isinstance(part, qom.Qwen3OmniMoeCode2WavDecoderResidualUnit):
            return self._residual(part, x, lens, rows), lens
        if isinstance(part, qom.Qwen3OmniMoeCode2WavDecoderBlock):
            for sub in part.block:
                x, lens = self._decoder_part(sub, x, lens, rows)
            return x, lens
        raise TypeError(f"streaming Code2Wav does not know {type(part).__name__}")


def _pad(pieces: list[torch.Tensor]) -> torch.Tensor:
    """Right-pad [C, n_b] rows to one [B, C, max n] batch (causal layers never look right)."""
    longest = max(p.shape[-1] for p in pieces)
    out = pieces[0].new_zeros((len(pieces), pieces[0].shape[0], longest))
    for b, p in enumerate(pieces):
        out[b, :, : p.shape[-1]] = p
    return out
