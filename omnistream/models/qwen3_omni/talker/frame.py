"""The talker's frame as two fixed-shape, graph-capturable steps: the code predictor's 15 codebooks
and the talker's next decode step, each with its sampling.

Eager, a frame is ~2,300 aten ops on the tiny model (~6,800 with the real 5-layer code predictor),
each a kernel launch the host pays for on a GPU. Here the frame is two calls whose shapes depend
only on a batch bucket (and, for the decode, a KV-width bucket), so each can be captured once per
bucket into a CUDA graph and replayed:

- `predict` (codebooks 1..15 of every row): codebook 0's embedding next to the talker's last hidden
  state (read from a per-slot buffer), the 15 static-cache steps of `CodePredictorRunner.forward`,
  each sampled and embedded on the device, and the frame's codec sum written back per slot;
- `decode` (codebook 0 of the next frame): the rows' codec sums plus their next text rows (one
  projection of every row's text id, `where` for tts_eos / tts_pad), the talker model over a KV
  cache read at a fixed width (`FixedKVStep`: the slot rows of `SlotKVCache`, written in place at
  each row's position, masked past it), the codec head and the sampler; the hidden state it ends
  with goes to the per-slot buffer for the next `predict`.

What stays on the host per frame, outside the regions: one plan copy per step (slots, positions,
text ids, codebook 0), the sampling knobs (one copy), each sampled row's noise (`draw_noise`: one
draw from the request's own generator per step: a per-request generator cannot be in a graph),
and one copy of the chosen ids back. `tests/unit/models/qwen3_omni/talker/test_frame.py` counts it.

Numerics: the same modules, called on the same values in the same order as the eager engine path
(`omnistream/models/qwen3_omni/talker/engine.py`), so with exact buckets (`graph_buckets=False`:
every batch size and KV width is its own bucket, the CPU default) greedy and seeded codes equal the
eager path's. With graph buckets (powers of two) a padded batch or a wider masked KV changes the row
count of the matmuls and the softmax width, which may round an ulp differently: greedy float32 codes
still agree on the tiny and the real-shaped builds (tested), but that is not guaranteed bit for bit.
Padding rows read and write a scratch slot of their own, never a request's.

With `cuda_graphs` (CUDA only, refused elsewhere) each step is captured on first use per (step,
batch bucket, KV width, sampling variant) from static inputs and replayed after (`_replayed`,
`_record`); without it the same step functions run eagerly, so everything but the capture itself
runs on the CPU (the replay path with CUDA faked: tests/unit/models/qwen3_omni/talker/test_frame.py).
Sampled rows on CUDA: their noise is drawn once per step ([15, V] for the code predictor) where
the eager path draws [V] per codebook; on the CPU the two are the same numbers, on CUDA the same
distribution from the same seed but not the same numbers, so seeded sampled codes differ between
static frames and the eager path there (greedy codes do not).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from omnistream.engine.batch_sampler import BatchSampler, RowSampling, StepKnobs, draw_noise
from omnistream.engine.capture import capturable
from omnistream.engine.kvcache import SlotKVCache
from omnistream.engine.step_graphs import StepGraphs
from omnistream.models.qwen3_omni.talker.code_predictor import CAPTURE_WARMUP_RUNS, CodePredictorRunner
from omnistream.models.qwen3_omni.talker.eos import EosMask
from omnistream.models.qwen3_omni.talker.prompt import TTS_EOS, TTS_PAD, TalkerPromptBuilder
from omnistream.request.sampling_params import SamplingParams

GREEDY = RowSampling(SamplingParams())
MIN_KV_BUCKET = 64  # the narrowest KV width a graph bucket reads


def kv_bucket(length: int, capacity: int, graph_buckets: bool) -> int:
    """The KV width a decode step reads: `length` itself, or (graph buckets) the next power of two
    from MIN_KV_BUCKET, at most `capacity`."""
    if length > capacity:
        raise ValueError(f"sequence would exceed the KV capacity of {capacity}")
    if not graph_buckets:
        return length
    width = MIN_KV_BUCKET
    while width < length:
        width *= 2
    return min(width, capacity)


class FixedKVStep:
    """The transformers Cache protocol for one decode step (one new position per row) over a fixed
    KV width: writes each row's key at (slot, position) in place, returns the rows' first `width`
    keys; positions past a row's own are masked by the caller. Shapes depend on (rows, width) only."""

    def __init__(self, cache: SlotKVCache, slots: torch.Tensor, positions: torch.Tensor, width: int) -> None:
        self.cache = cache
        self.slots = slots  # [B] long, device
        self.positions = positions  # [B, 1] long, device
        self.width = width

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        kwargs: Any = None,
        **_: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.cache.keys[layer_idx], self.cache.values[layer_idx]
        rows = self.slots.view(-1, 1)
        keys[rows, :, self.positions] = key_states.transpose(1, 2)
        values[rows, :, self.positions] = value_states.transpose(1, 2)
        return keys[self.slots, :, : self.width], values[self.slots, :, : self.width]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.width - 1


class StaticTalkerFrame:
    """Runs a talker frame as `predict` + `decode`, two capturable steps (see the module doc)."""

    def __init__(
        self,
        talker: Any,  # transformers' talker module (its submodules untyped)
        code_predictor: CodePredictorRunner,
        prompts: TalkerPromptBuilder,
        cache: SlotKVCache,
        sampler: BatchSampler,
        cp_sampler: BatchSampler,
        eos_mask: EosMask | None = None,
        graph_buckets: bool = False,
        cuda_graphs: bool = False,
    ) -> None:
        if cuda_graphs and cache.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; this talker runs on {cache.device}")
        self.cuda_graphs = cuda_graphs
        self.talker = talker
        self.cp = code_predictor
        self.prompts = prompts
        self.cache = cache
        self.sampler = sampler
        self.cp_sampler = cp_sampler
        self.eos_mask = eos_mask
        self.graph_buckets = graph_buckets
        self.device = cache.device
        self.scratch = cache.allocate()  # padding rows of a bucket read and write only here
        slots = len(cache.lengths)
        if sampler.presence is not None and sampler.presence.shape[0] < slots:
            raise ValueError("the talker sampler needs a presence mask for every cache slot")
        width = talker.codec_head.in_features
        dtype = talker.codec_head.weight.dtype
        # Per slot: the talker's last hidden state and the frame's codec sum, for the next step.
        self.hidden = torch.zeros((slots, 1, width), dtype=dtype, device=self.device)
        self.codec_sum = torch.zeros((slots, 1, width), dtype=dtype, device=self.device)
        self.key_index = torch.arange(cache.capacity, device=self.device)
        self.steps = code_predictor.num_steps
        self.buckets = code_predictor.buckets  # the code predictor's batch buckets, padded alike
        # With CUDA graphs: per (step, bucket[, KV width], sampling variant) a captured graph and
        # its output, captured on first use; per (step, bucket) the static inputs they read.
        self._graphs = StepGraphs(
            "talker frame",
            self.device,
            CAPTURE_WARMUP_RUNS,
            record=lambda step: self._record(step),
            device_context=lambda: self._current_device(),
        )
        self.graphs = self._graphs.graphs
        self.static: dict[tuple[str, int], dict[str, torch.Tensor]] = {}

    # --- host side ---------------------------------------------------------------------------------
    def bucket_for(self, batch: int) -> int:
        for bucket in self.buckets:
            if batch <= bucket:
                return bucket
        raise ValueError(f"batch {batch} exceeds the talker's largest bucket {self.buckets[-1]}")

    def store_hidden(self, slot: int, hidden: torch.Tensor) -> None:
        """A prefill's last hidden state [1, 1, H]: what the slot's first `predict` reads."""
        self.hidden[slot] = hidden[0]

    def _inputs(
        self,
        kind: str,
        bucket: int,
        columns: Sequence[Sequence[float]],
        pad: Sequence[float],
        sampler: BatchSampler,
        rows: Sequence[RowSampling],
        draws: int,
    ) -> tuple[torch.Tensor, StepKnobs, torch.Tensor | None]:
        """The step's inputs on the device: its plan (each row's values, padded to the bucket, in
        one host -> device copy; float64: every id and position is exact, a rope delta rounds once,
        as the eager path rounds it), the rows' sampling knobs and their noise (None when no row
        samples). With CUDA graphs they are copied into the bucket's static inputs."""
        values = [list(r) for r in zip(*columns, strict=True)]
        values += [list(pad)] * (bucket - len(values))
        host = torch.tensor(values, dtype=torch.float64)
        if self.device.type == "cuda":
            host = host.pin_memory()
        knobs = sampler.prepare(list(rows) + [GREEDY] * (bucket - len(rows)))
        sampled = any(not r.params.greedy for r in rows)
        if not self.cuda_graphs:
            noise = None
            if sampled:
                noise = torch.empty((bucket, draws, sampler.vocab), dtype=torch.float32, device=self.device)
                draw_noise(rows, noise)
            return host.to(self.device, non_blocking=True), knobs, noise
        static = self.static.get((kind, bucket))
        if static is None:
            static = self.static[(kind, bucket)] = {
                "plan": torch.zeros(host.shape, dtype=torch.float64, device=self.device),
                "knobs": torch.zeros((bucket, 5), dtype=torch.float64, device=self.device),
                "noise": torch.ones((bucket, draws, sampler.vocab), dtype=torch.float32, device=self.device),
            }
        static["plan"].copy_(host, non_blocking=True)
        if knobs.knobs is not None:
            static["knobs"].copy_(knobs.knobs)
            knobs = dataclasses.replace(knobs, knobs=static["knobs"])
        if sampled:
            draw_noise(rows, static["noise"])
        return static["plan"], knobs, static["noise"] if sampled else None

    def predict(
        self, slots: Sequence[int], code0: Sequence[int], rows: Sequence[RowSampling]
    ) -> list[list[int]]:
        """Codebooks 0..15 of each row's frame ([B][16] on the host); writes the rows' codec sums."""
        batch = len(slots)
        bucket = self.bucket_for(batch)
        plan, knobs, noise = self._inputs(
            "predict", bucket, (slots, code0), (self.scratch, 0), self.cp_sampler, rows, self.steps
        )
        key = ("predict", bucket, _variant(knobs, noise))
        codes = self._replayed(key, lambda: self.predict_step(plan, knobs, noise))
        return codes[:batch].tolist()

    def decode(
        self,
        slots: Sequence[int],
        picks: Sequence[int],
        deltas: Sequence[float],
        rows: Sequence[RowSampling],
    ) -> list[int]:
        """Codebook 0 of each row's next frame (host ints); advances the rows' KV lengths."""
        batch = len(slots)
        bucket = self.bucket_for(batch)
        starts = [self.cache.lengths[s] for s in slots]
        width = kv_bucket(max(starts) + 1, self.cache.capacity, self.graph_buckets)
        plan, knobs, noise = self._inputs(
            "decode",
            bucket,
            (slots, starts, picks, deltas),
            (self.scratch, 0, TTS_PAD, 0.0),
            self.sampler,
            rows,
            1,
        )
        key = ("decode", bucket, width, _variant(knobs, noise))
        code0 = self._replayed(key, lambda: self.decode_step(plan, width, knobs, noise))
        for slot, start in zip(slots, starts, strict=True):
            self.cache.lengths[slot] = start + 1
        return code0[:batch].tolist()

    # --- the capturable steps ----------------------------------------------------------------------
    def predict_step(self, plan: torch.Tensor, knobs: StepKnobs, noise: torch.Tensor | None) -> torch.Tensor:
        """[bucket, 2] (slot, codebook 0) -> the frame's codes [bucket, 16], on the device."""
        with capturable("code predictor frame"):
            slots = plan[:, 0].long()
            code0 = plan[:, 1:2].long()
            code0_embed = self.talker.get_input_embeddings()(code0)  # [B, 1, H]
            embeds = torch.cat((self.hidden.index_select(0, slots), code0_embed), dim=1)
            codes = [code0[:, 0]]
            hiddens = [code0_embed]
            embedding = self.cp.model.get_input_embeddings()
            for group in range(self.steps):
                logits = self.cp.forward(group, embeds)
                ids = self.cp_sampler.sample(logits, knobs, noise=None if noise is None else noise[:, group])
                codes.append(ids)
                embeds = embedding[group](ids.view(-1, 1))
                hiddens.append(embeds)
            self.codec_sum.index_copy_(0, slots, torch.cat(hiddens, dim=1).sum(1, keepdim=True))
            return torch.stack(codes, dim=1)

    def decode_step(
        self, plan: torch.Tensor, width: int, knobs: StepKnobs, noise: torch.Tensor | None
    ) -> torch.Tensor:
        """[bucket, 4] (slot, position, text id, rope delta) -> codebook 0 [bucket], on the device."""
        with capturable("talker decode step"):
            slots = plan[:, 0].long()
            starts = plan[:, 1:2].long()
            embeds = self.codec_sum.index_select(0, slots) + self._text_rows(plan[:, 2].long())
            positions = (starts.float() + plan[:, 3:4].float()).unsqueeze(0).expand(3, -1, -1)
            mask = (self.key_index[:width].view(1, 1, -1) <= starts.unsqueeze(-1)).unsqueeze(1)
            out = self.talker.model(
                inputs_embeds=embeds,
                position_ids=positions,
                attention_mask=mask,
                cache=FixedKVStep(self.cache, slots, starts, width),
                use_cache=True,
            )
            hidden = out.last_hidden_state[:, -1:]
            logits = self.talker.codec_head(hidden[:, -1])
            if self.eos_mask is not None:
                logits = self.eos_mask.apply(logits, slots)
            code0 = self.sampler.sample(logits, knobs, slots, noise=None if noise is None else noise[:, 0])
            self.hidden.index_copy_(0, slots, hidden)
            return code0

    def _text_rows(self, picks: torch.Tensor) -> torch.Tensor:
        """[B, 1, H] trailing text rows: every row's id projected (tts_eos / tts_pad rows, marked by
        negative ids, take the builder's own rows instead)."""
        p = self.prompts
        texts = p.talker.text_projection(p.thinker_embed(picks.clamp(min=0).unsqueeze(0)))[0]
        rows = torch.where((picks == TTS_EOS).view(-1, 1), p.tts_eos[0], texts)
        rows = torch.where((picks == TTS_PAD).view(-1, 1), p.tts_pad[0], rows)
        return rows.unsqueeze(1)

    # --- CUDA graphs -------------------------------------------------------------------------------
    def _replayed(self, key: tuple[Any, ...], step: Callable[[], torch.Tensor]) -> torch.Tensor:
        """`step()` eagerly, or (CUDA graphs) the replay of its graph for `key`, captured on first
        use (omnistream/engine/step_graphs.py). Capture and warm-up run the step on the real inputs:
        it is idempotent (the same K/V, hidden states and presence bits written again), so a replay
        after them gives the step's result, and the first replay is checked against an eager run of
        the same step on the same inputs: a graph that fails to capture or replays anything else
        runs eagerly from then on (logged once), so graphs on by default can cost speed but never
        change a frame."""
        if not self.cuda_graphs:
            return step()
        # The step is idempotent but for the penalty's presence masks: it reads them, then marks its
        # own choice, so a second run on the same inputs sees that choice (and may choose otherwise
        # where the penalty decides). Every run of the check starts from the masks as they were.
        masks = [m for m in (self.sampler.presence, self.cp_sampler.presence) if m is not None]
        return self._graphs.run(key, step, mutated=masks)

    def _record(self, step: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]:
        """Warm the step up on a side stream, then capture it into one graph (all in one pool)."""
        return self._graphs.capture(step)

    def _current_device(self) -> contextlib.AbstractContextManager[Any]:
        return self._graphs.current_device()


def _variant(knobs: StepKnobs, noise: torch.Tensor | None) -> tuple[Any, ...]:
    """What, besides the shapes, changes the ops a step's sampling dispatches."""
    return (knobs.knobs is not None, knobs.penalized, noise is not None, knobs.max_top_k, knobs.top_p)
