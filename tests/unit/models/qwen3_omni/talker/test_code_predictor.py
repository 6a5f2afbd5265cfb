"""The static code predictor: the same codes and logits as the DynamicCache path and transformers'
own `generate`, and a step that is graph-ready (fixed shapes, no host sync, no new cache)."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache

from omnistream.engine.load_options import LoadOptions
from omnistream.engine.sampling import SamplingParams, choose
from omnistream.models.qwen3_omni.checkpoint import load_stage
from omnistream.models.qwen3_omni.talker.code_predictor import CodePredictorRunner, batch_buckets
from omnistream.models.qwen3_omni.talker.frame_steps import CODE_PREDICTOR_TOP_K, CODE_PREDICTOR_TOP_P

SAMPLED = SamplingParams(temperature=1.0, top_k=CODE_PREDICTOR_TOP_K, top_p=CODE_PREDICTOR_TOP_P)
GREEDY = SamplingParams()


@pytest.fixture(scope="module", params=["float32", "float64"])
def code_predictor(request, tiny_model_dir):
    torch.set_grad_enabled(False)
    holder = load_stage("talker", tiny_model_dir, LoadOptions(dtype=request.param))
    yield holder.talker.code_predictor
    torch.set_grad_enabled(True)


@pytest.fixture(scope="module")
def code_predictor32(tiny_model_dir):
    """Shapes, syncs and caches do not depend on the dtype: one is enough for those."""
    torch.set_grad_enabled(False)
    yield load_stage("talker", tiny_model_dir, LoadOptions(dtype="float32")).talker.code_predictor
    torch.set_grad_enabled(True)


def _inputs(cp, batch: int, seed: int) -> torch.Tensor:
    """[B, 2, H]: stands in for (talker hidden, codebook-0 embedding) rows."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 2, cp.config.hidden_size, generator=generator, dtype=cp.dtype)


def _dynamic_step(cp, cache: DynamicCache, group: int, embeds: torch.Tensor) -> torch.Tensor:
    """The talker engine's code predictor step before the static cache (one shared DynamicCache)."""
    out = cp.model(inputs_embeds=embeds, cache=cache, use_cache=True)
    return cp.lm_head[group](out.last_hidden_state[:, -1])


def _frame(cp, step, x: torch.Tensor, sampling: SamplingParams, generators) -> tuple[list, list]:
    """Codebooks 1..15 of each row as the engine's loop picks them; also every step's logits."""
    embedding = cp.model.get_input_embeddings()
    codes, logits_seen, embeds = [], [], x
    for group in range(cp.config.num_code_groups - 1):
        logits = step(group, embeds)
        logits_seen.append(logits.clone())
        picked = [choose(logits[row], sampling, generators[row]) for row in range(x.shape[0])]
        codes.append(picked)
        embeds = embedding[group](torch.tensor(picked, device=x.device).view(-1, 1))
    return codes, logits_seen


def _dynamic_frame(cp, x, sampling, generators):
    cache = DynamicCache(config=cp.config)
    return _frame(cp, lambda g, e: _dynamic_step(cp, cache, g, e), x, sampling, generators)


def _generators(batch: int, seed: int, device: str = "cpu") -> list[torch.Generator]:
    return [torch.Generator(device=device).manual_seed(seed + row) for row in range(batch)]


def test_batch_buckets():
    assert batch_buckets(1) == (1,)
    assert batch_buckets(8) == (1, 2, 4, 8)
    assert batch_buckets(12) == (1, 2, 4, 8, 12)
    with pytest.raises(ValueError):
        batch_buckets(0)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "seeded"])
def test_logits_and_codes_equal_the_dynamic_cache_path(code_predictor, sampling):
    cp = code_predictor
    runner = CodePredictorRunner(cp, 8, cp.dtype, "cpu")
    for batch in (1, 3):
        for frame in range(2):  # the second frame reuses the cache the first one wrote
            x = _inputs(cp, batch, seed=10 * batch + frame)
            want_codes, want_logits = _dynamic_frame(cp, x, sampling, _generators(batch, frame))
            codes, logits = _frame(cp, runner.run, x, sampling, _generators(batch, frame))
            assert codes == want_codes
            for got, want in zip(logits, want_logits, strict=True):
                assert torch.equal(got, want)  # bitwise: no padding without CUDA graphs


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "seeded"])
def test_codes_equal_transformers_generate(code_predictor, sampling):
    """One row against the model's own `generate`, which the reference talker calls per frame."""
    cp = code_predictor
    runner = CodePredictorRunner(cp, 2, cp.dtype, "cpu")
    for seed in range(2):
        x = _inputs(cp, 1, seed)
        kwargs = {"do_sample": False}
        if not sampling.greedy:
            kwargs = {"do_sample": True, "top_k": CODE_PREDICTOR_TOP_K, "top_p": CODE_PREDICTOR_TOP_P}
        torch.manual_seed(seed)
        reference = cp.generate(
            inputs_embeds=x, max_new_tokens=cp.config.num_code_groups - 1, temperature=1.0, **kwargs
        )
        codes, _ = _frame(cp, runner.run, x, sampling, [torch.Generator().manual_seed(seed)])
        assert [c[0] for c in codes] == reference[0].tolist()


def test_padded_buckets_keep_rows_apart(code_predictor):
    """With graph buckets a batch of 3 runs in the 4-bucket, 5 in the 8-bucket: the pad rows, whatever
    they hold, change nothing, and the codes are the DynamicCache path's (logits within rounding:
    the matmuls see more rows)."""
    cp = code_predictor
    runner = CodePredictorRunner(cp, 8, cp.dtype, "cpu", buckets=batch_buckets(8))
    assert runner.buckets == (1, 2, 4, 8) and runner.bucket_for(3) == 4 and runner.bucket_for(5) == 8
    tolerance = 64 * torch.finfo(cp.dtype).eps
    for batch in (3, 5):
        x = _inputs(cp, batch, seed=batch)
        for static in runner.inputs.values():
            static.fill_(1e3)  # garbage in the pad rows
        want_codes, want_logits = _dynamic_frame(cp, x, GREEDY, [None] * batch)
        codes, logits = _frame(cp, runner.run, x, GREEDY, [None] * batch)
        assert codes == want_codes
        for got, want in zip(logits, want_logits, strict=True):
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)
    with pytest.raises(ValueError, match="largest bucket"):
        runner.bucket_for(9)


def test_replay_path_copies_into_static_inputs_and_reads_static_outputs(code_predictor32):
    """What `run` does once graphs are captured, without a GPU: a stand-in for each CUDA graph
    replays `forward` on the bucket's static input into the step's static output, as a captured
    graph would. The codes must not change; capture itself is left to a CUDA machine."""
    cp = code_predictor32
    runner = CodePredictorRunner(cp, 4, cp.dtype, "cpu", buckets=batch_buckets(4))

    class ForwardReplay:
        def __init__(self, bucket: int, group: int) -> None:
            self.bucket, self.group = bucket, group
            static = runner.inputs[(bucket, runner.rows(group))]
            runner.outputs[(bucket, group)] = torch.zeros_like(runner.forward(group, static))

        def replay(self) -> None:
            static = runner.inputs[(self.bucket, runner.rows(self.group))]
            runner.outputs[(self.bucket, self.group)].copy_(runner.forward(self.group, static))

    for bucket in runner.buckets:
        for group in range(runner.num_steps):
            runner.graphs[(bucket, group)] = ForwardReplay(bucket, group)
    x = _inputs(cp, 3, seed=3)
    want_codes, _ = _dynamic_frame(cp, x, SAMPLED, _generators(3, 7))
    codes, _ = _frame(cp, runner.run, x, SAMPLED, _generators(3, 7))
    assert codes == want_codes


def test_cuda_graphs_refused_off_cuda(code_predictor32):
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        CodePredictorRunner(code_predictor32, 2, code_predictor32.dtype, "cpu", cuda_graphs=True)


# --- graph readiness -------------------------------------------------------------------------------
class _OpLog(TorchDispatchMode):
    """Every aten op the step dispatches, with its output shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, list[tuple[int, ...]]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else [out]
        shapes = [tuple(t.shape) for t in outs if isinstance(t, torch.Tensor)]
        self.ops.append((str(func.overloadpacket), shapes))
        return out


# What a host sync or a data-dependent shape dispatches to: .item()/int()/.tolist(), nonzero, ...
HOST_SYNC_OPS = {"aten._local_scalar_dense", "aten.item", "aten.nonzero", "aten.masked_select", "aten.unique"}


def test_step_has_no_host_sync_and_fixed_shapes_across_frames(code_predictor32):
    cp = code_predictor32
    runner = CodePredictorRunner(cp, 4, cp.dtype, "cpu", buckets=batch_buckets(4))
    logs = []
    for frame in range(2):
        x = _inputs(cp, 4, seed=frame)
        log = _OpLog()
        with log:
            for group in range(runner.num_steps):
                runner.forward(group, x if group == 0 else x[:, :1])
        logs.append(log.ops)
    synced = {name for name, _ in logs[0]} & HOST_SYNC_OPS
    assert not synced, f"host syncs in the step: {synced}"
    assert logs[0] == logs[1]  # the same ops with the same shapes, frame after frame


def test_cache_is_static_across_frames(code_predictor32, monkeypatch):
    cp = code_predictor32
    runner = CodePredictorRunner(cp, 4, cp.dtype, "cpu", buckets=batch_buckets(4))
    pointers = [t.data_ptr() for t in runner.keys + runner.values + list(runner.inputs.values())]
    created = []
    original = transformers.cache_utils.DynamicCache.__init__

    def counting_init(self, *args, **kwargs):
        created.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(transformers.cache_utils.DynamicCache, "__init__", counting_init)
    for batch in (1, 3):
        _frame(cp, runner.run, _inputs(cp, batch, seed=batch), GREEDY, [None] * batch)
    assert created == []
    assert [t.data_ptr() for t in runner.keys + runner.values + list(runner.inputs.values())] == pointers
    assert runner.keys[0].abs().sum() > 0  # the frames did write there


def test_step_compiles_without_graph_breaks(code_predictor32):
    """`fullgraph=True` fails on any graph break: the step is one traceable graph per (bucket, step)."""
    cp = code_predictor32
    runner = CodePredictorRunner(cp, 4, cp.dtype, "cpu", buckets=batch_buckets(4))
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=16):
        compiled = torch.compile(runner.forward, backend="eager", fullgraph=True)
        for bucket, group in ((1, 0), (4, 1), (4, runner.num_steps - 1)):
            x = _inputs(cp, bucket, seed=group)[:, : runner.rows(group)]
            want = runner.forward(group, x)
            assert torch.equal(compiled(group, x), want)
    torch._dynamo.reset()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graph_replay_matches_eager_steps(tiny_model_dir):
    """On a GPU: the captured graphs give the eager steps' codes and logits (same buckets, so the
    same kernels), and greedy codes equal the DynamicCache path's."""
    torch.set_grad_enabled(False)
    cp = load_stage(
        "talker", tiny_model_dir, LoadOptions(device="cuda", dtype="float32")
    ).talker.code_predictor
    graphs = CodePredictorRunner(cp, 8, cp.dtype, "cuda", cuda_graphs=True)
    eager = CodePredictorRunner(cp, 8, cp.dtype, "cuda", buckets=graphs.buckets)
    assert len(graphs.graphs) == len(graphs.buckets) * graphs.num_steps
    for batch in (1, 3, 8):
        for frame in range(2):
            x = _inputs(cp, batch, seed=frame).to("cuda")
            want_codes, want_logits = _frame(cp, eager.run, x, SAMPLED, _generators(batch, frame, "cuda"))
            codes, logits = _frame(cp, graphs.run, x, SAMPLED, _generators(batch, frame, "cuda"))
            assert codes == want_codes
            for got, want in zip(logits, want_logits, strict=True):
                torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
            greedy, _ = _frame(cp, graphs.run, x, GREEDY, [None] * batch)
            assert greedy == _dynamic_frame(cp, x, GREEDY, [None] * batch)[0]
    torch.set_grad_enabled(True)
