"""The talker's code predictor as fixed-shape steps over a static KV cache, ready for CUDA graphs.

Per frame the code predictor runs 15 forwards (codebooks 1..15): the first on two rows (the
talker's hidden state and codebook 0's embedding), then one row per generated codebook. That is
2 + 14 = 16 positions, a number fixed by the checkpoint (`num_code_groups`), never by the request.
The transformers path builds a fresh `DynamicCache` each frame and grows it by concatenation; on a
GPU its 15 x (layers) small launches, allocations and Python branches dominate the frame.

Here every shape is fixed ahead of time:

- the K/V of each layer live in one preallocated [max_bucket, kv_heads, 16, head_dim] tensor,
  written in place; a step for batch bucket `b` uses the first `b` rows (a contiguous prefix);
- a batch runs padded to the smallest bucket that holds it; rows are independent, so the padding
  rows never touch the real ones. With CUDA graphs the buckets are 1, 2, 4, 8, ..., max_batch
  (`batch_buckets`: few graphs). Without them every batch size is its own bucket: no padding, so
  the logits are bitwise those of the `DynamicCache` path at every batch size (a padded bucket
  changes the row count of each matmul, and a CPU GEMM may then round a row 1 ulp differently);
- step `g` of a frame always writes positions [start, start + q) and attends to the first
  `start + q` keys (q = 2 at g = 0, else 1), so its cache views, rotary tables and mask are built
  once per (bucket, step) at construction. The step function `forward(group, embeds)` therefore has
  shapes that depend only on (bucket, group), no host sync (no `.item()`, `.tolist()`, `int()` of a
  tensor), no data-dependent branch and no allocation of cache: one CUDA graph per (bucket, step)
  can capture it, and `torch.compile(..., fullgraph=True)` traces it without a graph break
  (tests/unit/models/qwen3_omni/talker/test_code_predictor.py).

The numerics are the transformers model's own: the same decoder layers, norm and heads, called
with exactly the key length, position ids, rotary tables and attention mask the model computes
for the `DynamicCache` path (the mask comes from transformers' `create_causal_mask` at build time,
so eager and sdpa attention both get what they would get there). The only difference is that the
keys are a strided view of the static buffer instead of a freshly concatenated tensor.

With `cuda_graphs=True` (talker `--cuda-graphs`, CUDA devices only) every (bucket, step) is warmed
up on a side stream and captured into one `torch.cuda.CUDAGraph` sharing one memory pool; `run()`
then copies the batch into the bucket's static input and replays. Without it `run()` calls the
same `forward` eagerly, so everything but the capture itself is exercised on the CPU.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.masking_utils import create_causal_mask

from omnistream.engine.capture import capturable

log = logging.getLogger(__name__)

# Eager runs per (bucket, step) on a side stream before a capture: lazily initialised kernels and
# workspaces (cuBLAS handles, autotuning) must exist before the graph records addresses.
CAPTURE_WARMUP_RUNS = 3


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Powers of two below `max_batch`, then `max_batch` itself: at most twice the real batch runs."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {max_batch}")
    buckets = []
    size = 1
    while size < max_batch:
        buckets.append(size)
        size *= 2
    buckets.append(max_batch)
    return tuple(buckets)


class StaticStepCache:
    """The transformers Cache protocol for one (bucket, step): writes this step's keys in place at a
    fixed position and hands back a fixed-length view. Attention layers only call `update`."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], start: int, q_len: int) -> None:
        self.keys = keys  # per layer [bucket, kv_heads, positions, head_dim], views of the shared buffer
        self.values = values
        self.start = start
        self.end = start + q_len

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        kwargs: Any = None,
        **_: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys[:, :, self.start : self.end].copy_(key_states)
        values[:, :, self.start : self.end].copy_(value_states)
        return keys[:, :, : self.end], values[:, :, : self.end]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.start


@dataclass
class _Step:
    """Everything of one (bucket, step) that the forward reads besides its input: built once."""

    cache: StaticStepCache
    position_ids: torch.Tensor  # [1, q]
    rope: tuple[torch.Tensor, torch.Tensor]  # cos, sin [1, q, head_dim]
    mask: Any  # whatever create_causal_mask gives the model here (None for sdpa without padding)


class CodePredictorRunner:
    """Codebooks 1..num_groups-1 of a frame, one fixed-shape step per codebook (see module doc)."""

    def __init__(
        self,
        code_predictor: Any,  # transformers' code predictor module (its config and submodules untyped)
        max_batch: int,
        dtype: torch.dtype,
        device: str | torch.device,
        cuda_graphs: bool = False,
        buckets: tuple[int, ...] | None = None,
    ) -> None:
        cfg = code_predictor.config
        if any(kind != "full_attention" for kind in cfg.layer_types[: cfg.num_hidden_layers]):
            raise ValueError("the static code predictor supports full-attention layers only")
        self.config = cfg
        self.model = code_predictor.model
        self.layers = list(self.model.layers[: cfg.num_hidden_layers])
        self.heads = code_predictor.lm_head
        self.num_steps: int = cfg.num_code_groups - 1  # forwards per frame
        self.positions = self.num_steps + 1  # 2 prompt rows + (num_steps - 1) generated codes
        if buckets is None:
            buckets = batch_buckets(max_batch) if cuda_graphs else tuple(range(1, max_batch + 1))
        if not buckets or min(buckets) < 1 or max(buckets) < max_batch:
            raise ValueError(f"buckets {buckets} must be positive and hold max_batch {max_batch}")
        self.buckets = tuple(sorted(set(buckets)))
        self.device = torch.device(device)
        self.dtype = dtype
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        shape = (self.buckets[-1], cfg.num_key_value_heads, self.positions, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in self.layers]
        self.values = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in self.layers]
        # Static inputs, one per (bucket, rows): step 0 takes 2 rows, the others 1.
        self.inputs = {
            (bucket, q): torch.zeros(bucket, q, cfg.hidden_size, dtype=dtype, device=self.device)
            for bucket in self.buckets
            for q in (1, 2)
        }
        with torch.no_grad():
            self.steps = {
                (bucket, group): self._build_step(bucket, group)
                for bucket in self.buckets
                for group in range(self.num_steps)
            }
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        if cuda_graphs:
            if self.device.type != "cuda":
                raise ValueError(f"CUDA graphs need a CUDA device; this code predictor runs on {self.device}")
            self.capture()

    @staticmethod
    def rows(group: int) -> int:
        """Input rows of a step: the hidden state and codebook 0 at step 0, one code after."""
        return 2 if group == 0 else 1

    def _build_step(self, bucket: int, group: int) -> _Step:
        q = self.rows(group)
        start = 0 if group == 0 else group + 1
        cache = StaticStepCache([k[:bucket] for k in self.keys], [v[:bucket] for v in self.values], start, q)
        position_ids = torch.arange(start, start + q, device=self.device).unsqueeze(0)
        probe = self.inputs[(bucket, q)]
        rope = self.model.rotary_emb(probe, position_ids)
        # The mask the model builds for this step on its own DynamicCache path: same past length.
        past = DynamicCache(config=self.config)
        if start:
            filler = self.keys[0][:bucket, :, :start]
            for layer in range(len(self.layers)):
                past.update(filler, filler, layer)
        mask = create_causal_mask(
            config=self.config,
            inputs_embeds=probe,
            attention_mask=None,
            cache=past,
            position_ids=position_ids,
        )
        return _Step(cache, position_ids, rope, mask)

    def bucket_for(self, batch: int) -> int:
        for bucket in self.buckets:
            if batch <= bucket:
                return bucket
        raise ValueError(f"batch {batch} exceeds the code predictor's largest bucket {self.buckets[-1]}")

    def forward(self, group: int, input_embeds: torch.Tensor) -> torch.Tensor:
        """One step: [bucket, rows(group), hidden] -> logits of codebook group+1, [bucket, vocab].

        Shapes depend only on (bucket, group); writes this step's K/V into the static cache."""
        step = self.steps[(input_embeds.shape[0], group)]
        hidden = input_embeds
        for layer in self.layers:
            hidden = layer(
                hidden,
                attention_mask=step.mask,
                position_ids=step.position_ids,
                cache=step.cache,
                use_cache=True,
                position_embeddings=step.rope,
            )
        hidden = self.model.norm(hidden)
        logits: torch.Tensor = self.heads[group](hidden[:, -1])
        return logits

    def run(self, group: int, embeds: torch.Tensor) -> torch.Tensor:
        """One step for a real batch [B, rows(group), hidden]: copied into its bucket's static input,
        then the captured graph replays (or `forward` runs eagerly). Returns logits [B, vocab]; with
        graphs they are a view of the step's static output, valid until that step runs again."""
        batch = embeds.shape[0]
        bucket = self.bucket_for(batch)
        static = self.inputs[(bucket, embeds.shape[1])]
        static[:batch].copy_(embeds)
        graph = self.graphs.get((bucket, group))
        if graph is None:
            with capturable("code predictor step"):
                logits = self.forward(group, static)
            return logits[:batch]
        with self._current_device():  # the talker's GPU, not whichever is current
            graph.replay()
        return self.outputs[(bucket, group)][:batch]

    def capture(self) -> None:
        """Warm up every (bucket, step) on a side stream, then capture one graph each into one pool.

        All static outputs stay referenced, so no capture reuses another's output memory and the
        graphs may replay in any order (they never run concurrently: one engine thread). Captured
        with the talker's device current: `torch.cuda.graph` records on the current device's stream."""
        with self._current_device():
            self._capture()

    def _current_device(self) -> contextlib.AbstractContextManager[Any]:
        on_cuda = torch.device(self.device).type == "cuda"
        return torch.cuda.device(self.device) if on_cuda else contextlib.nullcontext()

    def _capture(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
        with torch.inference_mode():
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for bucket in self.buckets:
                    for _ in range(CAPTURE_WARMUP_RUNS):
                        for group in range(self.num_steps):
                            self.forward(group, self.inputs[(bucket, self.rows(group))])
            torch.cuda.current_stream(self.device).wait_stream(side)
            torch.cuda.synchronize(self.device)
            for bucket in self.buckets:
                for group in range(self.num_steps):
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                        out = self.forward(group, self.inputs[(bucket, self.rows(group))])
                    self.graphs[(bucket, group)] = graph
                    self.outputs[(bucket, group)] = out
            torch.cuda.synchronize(self.device)
        log.info(
            "code predictor: captured %d CUDA graphs (buckets %s x %d steps)",
            len(self.graphs),
            list(self.buckets),
            self.num_steps,
        )
