"""Static talker frames: the capturable steps give the eager engine's codes, keep their shapes, and
leave a small constant of host ops per frame outside the capturable regions.

The engines are stepped by hand on the test thread (`plan_step` + `run_step`) where ops are counted,
as tests/unit/models/qwen3_omni/test_host_syncs.py does; whole runs go through the engine's own thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from omnistream.bench.op_counts import static_talker_frame
from omnistream.engine import capture
from omnistream.engine.load_options import LoadOptions
from omnistream.engine.settings import TalkerEngineSettings, ThinkerEngineSettings, derive
from omnistream.models.qwen3_omni.talker.engine import TalkerEngine
from omnistream.models.qwen3_omni.talker.frame import MIN_KV_BUCKET, kv_bucket
from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine
from omnistream.request.sampling_params import SamplingParams
from omnistream.request.stage_chain import TalkerParams
from tests.fake_graph import FakeGraph, WrongGraph
from tests.talker_codes import talker_codes

F32 = LoadOptions(dtype="float32")
# Host ops of a greedy frame outside the regions: the two plan copies and the two id copies back.
MAX_OUTSIDE_GREEDY = 16
# Per sampled row and step, its own generator fills its noise: a select and an exponential_.
OPS_PER_SAMPLED_ROW = 2 * 2  # (select + exponential_) x (code predictor step, decode step)


@pytest.fixture(scope="module")
def builds(tiny_model_dir, real_shaped_model_dir) -> dict[str, str]:
    return {"tiny": tiny_model_dir, "real-shaped": real_shaped_model_dir}


SAMPLING = [
    SamplingParams(temperature=0.9, top_k=40, top_p=0.95, repetition_penalty=1.1, seed=1),
    SamplingParams(),
    SamplingParams(temperature=0.7, top_k=0, top_p=1.0, seed=2),
    SamplingParams(repetition_penalty=1.2),
]


def _codes(model_dir: str, sampling: list[SamplingParams], static: bool, graph_buckets: bool = False):
    """Every request's frames, all input given before the engine starts (the same batches)."""
    options = dataclasses.replace(F32, static_frames=static)
    return talker_codes(model_dir, sampling, options, graph_buckets=graph_buckets)


@pytest.mark.parametrize("build", ["tiny", "real-shaped"])
def test_static_frames_give_the_eager_codes(builds, build):
    """Greedy and seeded-sampled rows (penalties included) in one batch, rows ending their text at
    different frames: bitwise the eager path's codes (exact buckets)."""
    eager = _codes(builds[build], SAMPLING, static=False)
    static = _codes(builds[build], SAMPLING, static=True)
    assert sum(len(frames) for frames in eager) > 8
    assert static == eager


@pytest.mark.parametrize("build", ["tiny", "real-shaped"])
def test_graph_buckets_give_the_eager_greedy_codes(builds, build):
    """Power-of-two KV widths (wider than the rows, masked) and a batch of 3 padded to the code
    predictor's bucket 4 by a scratch row: greedy float32 codes still equal the eager path's."""
    greedy = [SamplingParams()] * 3
    eager = _codes(builds[build], greedy, static=False)
    assert _codes(builds[build], greedy, static=True, graph_buckets=True) == eager


def test_kv_buckets():
    assert kv_bucket(5, 256, graph_buckets=False) == 5
    assert kv_bucket(5, 256, graph_buckets=True) == MIN_KV_BUCKET
    assert kv_bucket(MIN_KV_BUCKET + 1, 256, graph_buckets=True) == 2 * MIN_KV_BUCKET
    assert kv_bucket(200, 256, graph_buckets=True) == 256
    with pytest.raises(ValueError, match="KV capacity"):
        kv_bucket(257, 256, graph_buckets=True)


# --- what a frame dispatches -----------------------------------------------------------------------
def _outside(model_dir: str, batch: int, greedy: bool):
    return static_talker_frame(model_dir, batch, F32, greedy)


def test_ops_outside_the_regions_are_a_constant_per_frame(builds):
    """Greedy: the same few host ops per frame whatever the layers (1- and 5-layer code predictor)
    and the batch (1, 4); sampled: those plus one noise draw per sampled row and step (the
    request's own generator), and at most 100 at batch 8."""
    greedy = {(b, n): _outside(d, n, greedy=True) for b, d in builds.items() for n in (1, 4)}
    reference = greedy["tiny", 1]
    assert 0 < reference.outside <= MAX_OUTSIDE_GREEDY, reference.outside_ops
    for key, counts in greedy.items():
        assert counts.outside_ops == reference.outside_ops, key
        assert counts.inside > 10 * counts.outside, key  # the frame's work is inside
    sampled = {(b, n): _outside(d, n, greedy=False) for b, d in builds.items() for n in (1, 8)}
    base = sampled["tiny", 1].outside - OPS_PER_SAMPLED_ROW
    for (build, batch), counts in sampled.items():
        assert counts.outside == base + OPS_PER_SAMPLED_ROW * batch <= 100, (build, batch, counts.outside_ops)
        assert counts.outside_ops["aten.exponential_"] == 2 * batch


class _RegionLog(TorchDispatchMode):
    """The ops dispatched inside capturable regions, with their output shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, list[tuple[int, ...]]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if capture.inside():
            outs = out if isinstance(out, (tuple, list)) else [out]
            self.ops.append((str(func.overloadpacket), [tuple(t.shape) for t in outs if torch.is_tensor(t)]))
        return out


# A host sync or a data-dependent shape: .item()/int()/.tolist(), nonzero, masked_select, ...
HOST_SYNC_OPS = {"aten._local_scalar_dense", "aten.item", "aten.nonzero", "aten.masked_select", "aten.unique"}


def test_regions_have_fixed_shapes_and_no_host_sync(tiny_model_dir):
    """Two frames in the same buckets (batch 2, one KV width bucket) dispatch the same ops with the
    same shapes inside the regions, and none of them syncs with the host."""
    options = dataclasses.replace(F32, static_frames=True)
    engine = TalkerEngine(
        tiny_model_dir,
        derive(TalkerEngineSettings, options, max_batch=2, max_model_len=256),
        graph_buckets=True,
    )
    assert engine.frame is not None
    prompt = ThinkerEngine(
        tiny_model_dir, derive(ThinkerEngineSettings, F32, max_batch=1, max_model_len=256)
    ).encode_chat([{"role": "user", "content": "hello"}])

    def step(log: _RegionLog | None = None) -> None:
        work = engine.plan_step()
        assert work is not None
        with torch.inference_mode():
            if log is None:
                engine.run_step(work)
            else:
                with log:
                    engine.run_step(work)

    async def run():
        for row in range(2):
            params = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=row)
            engine.add_request(f"r{row}", TalkerParams(max_frames=32, sampling=params))
            engine.feed(f"r{row}", list(range(5, 45)), last=False, prompt_ids=prompt)
        while not all(s.pending_code0 is not None for s in engine.states()):
            step()
        logs = [_RegionLog(), _RegionLog()]
        for log in logs:
            step(log)
        return logs

    first, second = asyncio.run(run())
    assert first.ops and first.ops == second.ops
    assert not {name for name, _ in first.ops} & HOST_SYNC_OPS


# --- the CUDA graph path, with CUDA faked ----------------------------------------------------------
def _graph_codes(model_dir, monkeypatch, graph_type, sampling) -> tuple[list, list]:
    """The codes with the frame's CUDA graphs faked by `graph_type` on the CPU, and the graphs
    recorded: `_record` makes one per (step, bucket, KV width, variant), the CUDA-only guard is
    passed (tested below) and the graph path runs as on a GPU."""
    from omnistream.models.qwen3_omni.talker import frame as talker_frame

    recorded: list[FakeGraph] = []

    def record(self, step):
        graph = graph_type(step)
        recorded.append(graph)
        return graph, graph.out

    monkeypatch.setattr(talker_frame.StaticTalkerFrame, "_record", record)
    monkeypatch.setattr(
        talker_frame.StaticTalkerFrame, "_current_device", lambda self: contextlib.nullcontext()
    )
    original = talker_frame.StaticTalkerFrame.__init__

    def cpu_graphs(self, *args, **kwargs):
        kwargs["cuda_graphs"] = False
        original(self, *args, **kwargs)
        self.cuda_graphs = True

    monkeypatch.setattr(talker_frame.StaticTalkerFrame, "__init__", cpu_graphs)
    codes = _codes(model_dir, sampling, static=True, graph_buckets=True)
    monkeypatch.setattr(talker_frame.StaticTalkerFrame, "__init__", original)
    return codes, recorded


def test_graph_path_replays_static_inputs_and_gives_the_eager_codes(tiny_model_dir, monkeypatch):
    """What the frame does once graphs are captured, without a GPU: each step's inputs are copied
    into the bucket's static inputs, a graph per (step, bucket, KV width, sampling variant) is
    recorded on first use and replayed after, and its output is what the frame reads. The codes
    must be the eager path's; the capture itself (`_record` on CUDA) is left to a CUDA machine."""
    sampling = [SAMPLING[0], SamplingParams(), SamplingParams()]
    graphs, recorded = _graph_codes(tiny_model_dir, monkeypatch, FakeGraph, sampling)
    eager = _codes(tiny_model_dir, sampling, static=False)
    assert graphs == eager
    assert recorded and sum(g.replays for g in recorded) > len(recorded)  # recorded once, replayed
    kinds = {g.step.__qualname__.split(".")[1] for g in recorded}
    assert kinds == {"predict", "decode"}  # both steps of the frame replay


def test_a_graph_that_replays_other_values_than_its_eager_step_is_dropped_for_eager(
    tiny_model_dir, monkeypatch, caplog
):
    """Graphs are on by default on CUDA and have to be safe there: each one's first replay is
    compared with an eager run of the same step, and one that differs never serves a frame."""
    sampling = [SamplingParams(), SamplingParams()]
    graphs, recorded = _graph_codes(tiny_model_dir, monkeypatch, WrongGraph, sampling)
    assert graphs == _codes(tiny_model_dir, sampling, static=False)
    assert recorded and all(g.replays == 1 for g in recorded)  # checked once, never replayed again
    assert "replays other values than its eager step" in caplog.text


def test_cuda_graphs_refused_off_cuda(tiny_model_dir):
    options = LoadOptions(dtype="float32", cuda_graphs=True, static_frames=True)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        TalkerEngine(tiny_model_dir, derive(TalkerEngineSettings, options, max_batch=2, max_model_len=64))


def test_rows_decoding_at_a_rope_delta_give_the_eager_codes(tiny_model_dir):
    """Prompts with vision decode at position + their rope delta (fractional here, and beside a
    row without one): the static decode's positions round as the eager path's."""

    def frames(static: bool) -> list[list[list[int]]]:
        engine = TalkerEngine(
            tiny_model_dir,
            derive(TalkerEngineSettings, F32, max_batch=2, max_model_len=256, static_frames=static),
        )
        prompt = ThinkerEngine(
            tiny_model_dir, derive(ThinkerEngineSettings, F32, max_batch=1, max_model_len=256)
        ).encode_chat([{"role": "user", "content": "hello"}])

        def step() -> None:
            work = engine.plan_step()
            assert work is not None
            with torch.inference_mode():
                engine.run_step(work)

        async def run():
            outputs = []
            for row in range(2):
                outputs.append(engine.add_request(f"r{row}", TalkerParams(max_frames=32)))
                engine.feed(f"r{row}", list(range(5, 45)), last=False, prompt_ids=prompt)
            states = list(engine.states())
            while not all(s.pending_code0 is not None for s in states):
                step()
            states[0].rope_delta = 2.5  # as talker_rope would set for an image prompt
            for _ in range(8):
                step()
            return [out.queued() for out in outputs]

        return [[item.codes for item in items] for items in asyncio.run(run())]

    eager = frames(static=False)
    assert min(len(f) for f in eager) >= 8
    assert frames(static=True) == eager
