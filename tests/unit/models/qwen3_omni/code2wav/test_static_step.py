"""Code2Wav's fixed-shape streaming step (code2wav/static_step.py) against the reference path
(code2wav/stream.py, which tests/reference/models/qwen3_omni/code2wav/test_stream.py holds to the
module's own forward):

- exact buckets (the CPU default): the same samples bit for bit, at batch 1 and batched, rows at
  their first window beside carried ones, float32 and float64, on the tiny build, the real-shaped
  build and the real model's structure (8 layers, window 72) with narrow widths;
- graph buckets (padded batch and frames, as with CUDA graphs): the same samples to an ulp, and a
  padding row never reaches a real row (bit for bit the same as a real row in its place);
- its host work outside capturable regions: a constant handful of ops at batch 1 and 16, whatever
  the model's depth (fails if per-row or per-layer host work comes back);
- the CUDA graph path with the capture faked on the CPU (a fake graph replays the step eagerly: no
  CUDA graph is pretended to run): kept graphs give the eager samples; a graph that replays other
  values or fails to capture is dropped and its bucket runs eagerly.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import torch
from transformers import Qwen3OmniMoeConfig
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig

from omnistream.engine.load_options import LoadOptions
from omnistream.engine.op_count import OpCounter
from omnistream.engine.settings import Code2WavEngineSettings
from omnistream.models.qwen3_omni.checkpoint import load_stage
from omnistream.models.qwen3_omni.code2wav.engine import Code2WavEngine
from omnistream.models.qwen3_omni.code2wav.static_step import StaticCode2WavStep, frame_bucket
from omnistream.models.qwen3_omni.code2wav.stream import StreamingCode2Wav
from omnistream.models.qwen3_omni.codec_chunks import ChunkPlan
from tests.fake_graph import FakeGraph, WrongGraph
from tests.reference.models.qwen3_omni.code2wav.test_stream import REAL_STRUCTURE_NARROW, realistic

DTYPES = {"float32": torch.float32, "float64": torch.float64}
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-6}  # graph buckets: an ulp or so at rms ~0.1
MAX_OUTSIDE_OPS = 20  # issue 63: host ops per Code2Wav step outside capturable regions

# A script: per step, the rows that step and their windows' frame counts. Row r joins at step r
# (a first window beside carried ones); lengths differ per row and step (padded within the batch).
Script = list[list[tuple[int, int]]]


def _script(rows: int, steps: int) -> Script:
    return [[(r, 1 + (s * 7 + r * 5) % 11) for r in range(rows) if r <= s] for s in range(steps)]


def _codes(script: Script, seed: int) -> dict[tuple[int, int], torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        (s, r): torch.randint(0, 2048, (16, n), generator=gen)
        for s, step in enumerate(script)
        for r, n in step
    }


def _reference(model, script: Script, codes) -> dict[tuple[int, int], torch.Tensor]:
    decoder = StreamingCode2Wav(model)
    states: dict[int, object] = {}
    out = {}
    for s, step in enumerate(script):
        rows = [r for r, _ in step]
        audio, new = decoder.step(
            [states.get(r) or decoder.new_state() for r in rows], [codes[(s, r)] for r in rows]
        )
        for r, a, state in zip(rows, audio, new, strict=True):
            out[(s, r)], states[r] = a, state
    return out


def _static(stepper: StaticCode2WavStep, script: Script, codes) -> dict[tuple[int, int], torch.Tensor]:
    streams: dict[int, object] = {}
    out = {}
    for s, step in enumerate(script):
        rows = [r for r, _ in step]
        for r in rows:
            if r not in streams:
                streams[r] = stepper.new_stream()
        audio, lens, new = stepper.step_padded(
            [streams[r] for r in rows], [codes[(s, r)].numpy() for r in rows]
        )
        for b, (r, n, stream) in enumerate(zip(rows, lens, new, strict=True)):
            out[(s, r)], streams[r] = audio[b, :n].clone(), stream
    for stream in streams.values():  # the streams end: their slots are free again (as the engine does)
        stepper.release(stream)
    return out


@pytest.fixture(scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def models(tiny_model_dir, real_shaped_model_dir, one_thread):
    """(build, dtype) -> a Code2Wav: the tiny and real-shaped checkpoints' own, and realistic weights
    (audio at rms ~0.1, where an error shows) on the tiny structure and the real one, narrow."""
    built = {}
    for name, dtype in DTYPES.items():
        for build, directory in (("tiny", tiny_model_dir), ("real-shaped", real_shaped_model_dir)):
            built[(build, dtype)] = load_stage("code2wav", directory, LoadOptions(dtype=name)).code2wav
        tiny_config = Qwen3OmniMoeConfig.from_pretrained(tiny_model_dir).code2wav_config
        built[("tiny-realistic", dtype)] = realistic(tiny_config, seed=1, dtype=dtype)
        narrow = Qwen3OmniMoeCode2WavConfig(**REAL_STRUCTURE_NARROW)
        built[("real-structure", dtype)] = realistic(narrow, seed=1, dtype=dtype)
    return built


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("build", ["tiny", "real-shaped", "real-structure"])
@pytest.mark.parametrize("rows", [1, 3])
def test_exact_buckets_give_the_reference_samples_bit_for_bit(models, build, dtype, rows):
    model = models[(build, dtype)]
    script = _script(rows, steps=12)  # the real structure's rows pass its 72-frame window
    codes = _codes(script, seed=rows)
    static = _static(StaticCode2WavStep(model, slots=rows, max_batch=rows), script, codes)
    reference = _reference(model, script, codes)
    assert static.keys() == reference.keys()
    for key, audio in reference.items():
        assert torch.equal(static[key], audio), key


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("build", ["tiny-realistic", "real-structure"])
@pytest.mark.parametrize("rows", [1, 3])
def test_graph_buckets_give_the_reference_samples_to_an_ulp(models, build, dtype, rows):
    """As with CUDA graphs: frames pad to a power of two (or 25) and batch 3 runs in bucket 4. The
    samples are the reference's to an ulp: padded matmuls and convs may round differently."""
    model = models[(build, dtype)]
    script = _script(rows, steps=8)
    codes = _codes(script, seed=5)
    padded = _static(StaticCode2WavStep(model, slots=rows, max_batch=4, graph_buckets=True), script, codes)
    reference = _reference(model, script, codes)
    assert padded.keys() == reference.keys()
    for key, audio in reference.items():
        torch.testing.assert_close(padded[key], audio, rtol=0, atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_a_padding_row_never_reaches_a_real_row(models, dtype):
    """Batch 3 in bucket 4 against batch 4 with a real row where the padding row was: the same
    shapes, so the three real rows' samples must be the same bit for bit."""
    model = models[("real-structure", dtype)]
    # Three rows from the start (bucket 4 at every step), a fourth of one frame a step (so never
    # the longest: the frame bucket is the three rows' own).
    three = [[(r, 1 + (s * 7 + r * 5) % 11) for r in range(3)] for s in range(8)]
    script = [[*step, (3, 1)] for step in three]
    codes = _codes(script, seed=6)
    padded = _static(StaticCode2WavStep(model, slots=3, max_batch=4, graph_buckets=True), three, codes)
    full = _static(StaticCode2WavStep(model, slots=4, max_batch=4, graph_buckets=True), script, codes)
    assert padded and all(torch.equal(audio, full[key]) for key, audio in padded.items())


def test_frame_buckets():
    assert [frame_bucket(n, False) for n in (1, 3, 25, 26)] == [1, 3, 25, 26]
    sizes = (1, 2, 3, 5, 16, 17, 25, 26, 33)
    assert [frame_bucket(n, True) for n in sizes] == [1, 2, 4, 8, 16, 25, 25, 32, 64]


def test_a_reused_slot_starts_its_new_stream_from_zeros(models):
    """A slot keeps its last stream's state when released; the next stream in it reads zeros."""
    model = models[("real-structure", torch.float64)]
    stepper = StaticCode2WavStep(model, slots=1, max_batch=1)
    script = _script(1, steps=3)
    codes = _codes(script, seed=7)
    first = _static(stepper, script, codes)
    assert stepper.slots.pool[0].abs().sum() > 0  # the ended stream's state is still there
    again = _static(stepper, script, codes)  # in slot 0 again: the only one
    assert all(torch.equal(first[k], again[k]) for k in first)


def test_a_failed_step_leaves_every_slot_as_it_was(models):
    model = models[("tiny-realistic", torch.float64)]
    stepper = StaticCode2WavStep(model, slots=3, max_batch=2)
    codes = torch.randint(0, 2048, (16, 10), generator=torch.Generator().manual_seed(2))
    _, _, (stream,) = stepper.step_padded([stepper.new_stream()], [codes[:, :4].numpy()])
    before = stepper.slots.pool.clone()
    bad = torch.full((16, 2), 10**6).numpy()
    with pytest.raises(IndexError):  # out of the codebook: the embedding fails, nothing commits
        stepper.step_padded([stream, stepper.new_stream()], [codes[:, 4:].numpy(), bad])
    assert torch.equal(stepper.slots.pool, before)
    audio, _, _ = stepper.step_padded([stream], [codes[:, 4:].numpy()])
    unfailed = StaticCode2WavStep(model, slots=1, max_batch=2)  # the same windows, no failure between
    _, _, (other,) = unfailed.step_padded([unfailed.new_stream()], [codes[:, :4].numpy()])
    assert torch.equal(audio, unfailed.step_padded([other], [codes[:, 4:].numpy()])[0])


# --- host work outside the capturable regions ------------------------------------------------------
def _outside_ops(model, batch: int, fresh: bool, graph_buckets: bool) -> tuple[int, int]:
    stepper = StaticCode2WavStep(model, slots=batch, max_batch=16, graph_buckets=graph_buckets)
    gen = torch.Generator().manual_seed(11)
    streams = [stepper.new_stream() for _ in range(batch)]
    if not fresh:  # carried: every row past its first window, at its own position
        _, _, streams = stepper.step_padded(
            streams, [torch.randint(0, 2048, (16, 1 + b % 5), generator=gen).numpy() for b in range(batch)]
        )
    codes = [torch.randint(0, 2048, (16, 1 + b % 3), generator=gen).numpy() for b in range(batch)]
    with torch.inference_mode(), OpCounter() as counter:
        audio, _, _ = stepper.step_padded(streams, codes)
        audio.to(torch.float32).cpu().numpy()  # the engine's one copy back
    return counter.counts.outside, counter.counts.inside


@pytest.mark.parametrize("graph_buckets", [False, True], ids=["exact", "graph-buckets"])
@pytest.mark.parametrize("fresh", [False, True], ids=["carried", "first-window"])
@pytest.mark.parametrize("build", ["tiny", "real-structure"])
def test_host_work_per_step_is_a_small_constant(models, build, fresh, graph_buckets):
    """At most MAX_OUTSIDE_OPS ops outside the step's regions, the same at batch 1 and 16 and for
    one layer (tiny) or eight (the real structure): nothing per row, per layer or per conv."""
    model = models[(build, torch.float32)]
    one, sixteen = (_outside_ops(model, b, fresh, graph_buckets) for b in (1, 16))
    assert one[0] == sixteen[0] <= MAX_OUTSIDE_OPS, (one, sixteen)
    assert one[1] > 20 * one[0]  # the step's work is inside its regions


def test_the_outside_count_is_the_same_for_one_layer_or_eight(models):
    assert (
        _outside_ops(models[("tiny", torch.float32)], 4, False, True)[0]
        == _outside_ops(models[("real-structure", torch.float32)], 4, False, True)[0]
    )


# --- the CUDA graph path, capture faked --------------------------------------------------------------
def _faked_graphs(model, graph_type) -> tuple[StaticCode2WavStep, list[FakeGraph]]:
    """A step on the CPU whose CUDA graph path runs with `graph_type` as its captured graphs: the
    CUDA-only guard is passed (tested below) and every other part of the path runs as on a GPU
    (static inputs, one graph per bucket, the capture check)."""
    stepper = StaticCode2WavStep(model, slots=4, max_batch=4, graph_buckets=True)
    stepper.cuda_graphs = True
    recorded: list[FakeGraph] = []

    def record(step):
        if graph_type is None:
            raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture")
        graph = graph_type(step)
        recorded.append(graph)
        return graph, graph.out

    stepper.graphs.record = record
    stepper.graphs.device_context = contextlib.nullcontext
    return stepper, recorded


@pytest.mark.parametrize("graph_type", [FakeGraph, WrongGraph, None], ids=["kept", "wrong", "failing"])
def test_the_graph_path_gives_the_eager_samples_and_drops_a_doubtful_graph(models, graph_type, caplog):
    model = models[("tiny-realistic", torch.float32)]
    script = _script(3, steps=8)
    codes = _codes(script, seed=3)
    eager = _static(StaticCode2WavStep(model, slots=4, max_batch=4, graph_buckets=True), script, codes)
    stepper, recorded = _faked_graphs(model, graph_type)
    graphs = _static(stepper, script, codes)
    for key, audio in eager.items():
        assert torch.equal(graphs[key], audio), key
    keys = set(stepper.graphs.graphs)
    assert keys and len(keys) < len(script)  # one per (bucket, frames) met, some met again
    if graph_type is FakeGraph:
        assert len(recorded) == len(keys) and sum(g.replays for g in recorded) == len(script)
        assert all(graph is not None for graph, _ in stepper.graphs.graphs.values())
        assert set(stepper.static) == {k[:2] for k in keys}  # they read the buckets' static inputs
    else:
        assert all(graph is None for graph, _ in stepper.graphs.graphs.values())
        assert all(g.replays == 1 for g in recorded)  # checked once, never replayed again
        said = "replays other values than its eager step" if graph_type else "failed; it runs eagerly"
        assert caplog.text.count(said) == len(keys)


def test_cuda_graphs_refused_off_cuda(tiny_model_dir):
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        Code2WavEngine(tiny_model_dir, Code2WavEngineSettings(dtype="float32", cuda_graphs=True))


def test_the_engine_frees_a_stream_slot_when_its_request_ends(tiny_model_dir):
    """Each request holds a state slot from its first window to its end (finished or aborted): more
    requests than slots, one after another, all run; afterwards every slot is free."""
    engine = Code2WavEngine(
        tiny_model_dir, Code2WavEngineSettings(dtype="float32", max_batch=2, max_requests=2)
    )
    codes = torch.randint(0, 2048, (16, 9), generator=torch.Generator().manual_seed(4))

    async def run(rid: str, abort: bool) -> int:
        out = engine.add_request(rid, ChunkPlan(2, 4, 4))
        engine.feed(rid, codes, last=not abort)
        if abort:
            await out.get()  # its first window decoded: it holds a slot
            engine.abort(rid)
            return 0
        return len([chunk async for chunk in out])

    engine.start()
    try:
        ends = [asyncio.run(run(f"r{i}", abort=i % 2 == 1)) for i in range(5)]
    finally:
        engine.stop()
    engine.release_ended()
    assert ends == [4, 0, 4, 0, 4]  # every window of the finished ones (2, 2, 4, 1 frames)
    assert sorted(engine.streamer.slots._free) == [0, 1]
