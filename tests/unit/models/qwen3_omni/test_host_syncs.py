"""Host syncs per engine step stay a small constant, whatever the batch size and the layer count.

On a GPU every `.item()`, `.tolist()`, `int(tensor)`, `bool(tensor)` ... waits for the device, and
every tensor made from host data is a host -> device copy. On this CPU-only machine nothing waits,
so the test counts the calls themselves: it wraps those methods (wherever called) and the tensor
factories (when our code calls them), counts the calls made while one engine step runs, and
requires the same small count for batch 1 and batch 4 and for the 2-layer and a deeper tiny
checkpoint (per-layer or per-row syncs would grow). The engines are stepped by hand on the test
thread (`plan_step` + `run_step`), as their thread does.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from omnistream.engine.load_options import LoadOptions
from omnistream.engine.settings import (
    Code2WavEngineSettings,
    TalkerEngineSettings,
    ThinkerEngineSettings,
    derive,
)
from omnistream.models.build_lock import build_lock
from omnistream.models.qwen3_omni import tiny
from omnistream.models.qwen3_omni.code2wav.engine import Code2WavEngine
from omnistream.models.qwen3_omni.codec_chunks import ChunkPlan
from omnistream.models.qwen3_omni.talker.engine import TalkerEngine
from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine
from omnistream.request.sampling_params import SamplingParams
from omnistream.request.stage_chain import TalkerParams, ThinkerParams
from tests.conftest import CACHE

# Methods that hand a tensor's value to Python (a device -> host sync on a GPU).
SYNC_METHODS = ("item", "tolist", "__int__", "__bool__", "__float__", "__index__", "cpu", "numpy")
# Factories that make a tensor from host values (a host -> device copy on a GPU).
FACTORIES = ("tensor", "as_tensor", "arange")
# Factories count when our code calls them: transformers' own per-layer ones (the grouped-MoE
# `arange(device=...)`, `DynamicCache`'s empty tensors) are device-side and carry no host data.
_ROOT = Path(__file__).resolve().parents[4]
OUR_CODE = (str(_ROOT / "omnistream"), str(_ROOT / "services"))
# A step may sync a few times (the chosen ids back, the planned indices there), never per row/layer.
MAX_PER_STEP = 24


class SyncCounter:
    """Counts the watched calls made inside `counting()`, by name. The wrappers are in place only
    there (model loading builds buffers with the real factories, e.g. under a meta-device init)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def _wrap(self, name: str, fn, ours_only: bool):
        def counted(*args, **kwargs):
            if not ours_only or sys._getframe(1).f_code.co_filename.startswith(OUR_CODE):
                self.counts[name] += 1
            return fn(*args, **kwargs)

        return counted

    @contextlib.contextmanager
    def counting(self):
        self.counts.clear()
        saved = [(torch.Tensor, name, getattr(torch.Tensor, name)) for name in SYNC_METHODS]
        saved += [(torch, name, getattr(torch, name)) for name in FACTORIES]
        for owner, name, fn in saved:
            label = name if owner is torch.Tensor else f"torch.{name}"
            setattr(owner, name, self._wrap(label, fn, ours_only=owner is torch))
        try:
            yield self.counts
        finally:
            for owner, name, fn in saved:
                setattr(owner, name, fn)


@pytest.fixture(scope="module")
def deep_model_dir(tiny_model_dir) -> str:
    """The tiny checkpoint with 4 thinker/talker layers and 3 code-predictor and Code2Wav layers."""
    directory = Path(f"{CACHE}-deep")
    with build_lock(directory):
        if tiny.is_current(directory):
            return str(directory)
        base = tiny.tiny_config

        def deeper(ids, **kwargs):
            config = base(ids, **kwargs)
            cp = config.talker_config.code_predictor_config
            cp.num_hidden_layers = 3
            cp.layer_types = [cp.layer_types[0]] * 3
            config.code2wav_config.num_hidden_layers = 3
            return config

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(tiny, "tiny_config", deeper)
            tiny.make_tiny_model(directory, seed=0, layers=4, answers_end=False)
    return str(directory)


def _step(engine, counter: SyncCounter) -> Counter[str]:
    """One engine step on this thread, counting its calls."""
    work = engine.plan_step()
    assert work is not None, "the engine has no work"
    with torch.inference_mode(), counter.counting() as counts:
        engine.run_step(work)
    return Counter(counts)


def _sampling(row: int) -> SamplingParams:
    # Every row samples with every knob, so a batch differs from a single row only in its size.
    return SamplingParams(temperature=0.8, top_k=20, top_p=0.9, repetition_penalty=1.1, seed=row)


def thinker_decode_counts(model_dir: str, batch: int, counter: SyncCounter) -> Counter[str]:
    engine = ThinkerEngine(
        model_dir, ThinkerEngineSettings(dtype="float32", max_batch=batch, max_model_len=256)
    )

    async def run():
        prompt = engine.encode_chat([{"role": "user", "content": "hello there"}])
        for row in range(batch):
            engine.add_request(
                f"r{row}", prompt, ThinkerParams(max_tokens=64, ignore_eos=True, sampling=_sampling(row))
            )
        for _ in range(batch):  # one prefill per step
            _step(engine, counter)
        assert all(s.next_token is not None for s in engine.states())
        # The last row's first decode step also stores its prompt's blocks (once a request, after
        # its second token; host-side work on CPU positions, no device sync): past it, the steady
        # state.
        _step(engine, counter)
        assert not any(s.prompt_store_due for s in engine.states())
        return _step(engine, counter)  # a pure decode step of the whole batch

    return asyncio.run(run())


def talker_frame_counts(
    model_dir: str, batch: int, counter: SyncCounter, static_frames: bool = False
) -> Counter[str]:
    options = LoadOptions(dtype="float32", static_frames=static_frames)
    engine = TalkerEngine(
        model_dir, derive(TalkerEngineSettings, options, max_batch=batch, max_model_len=256)
    )
    thinker = ThinkerEngine(model_dir, ThinkerEngineSettings(dtype="float32", max_batch=1, max_model_len=256))

    async def run():
        prompt = thinker.encode_chat([{"role": "user", "content": "hello"}])
        for row in range(batch):
            engine.add_request(f"r{row}", TalkerParams(max_frames=64, sampling=_sampling(row)))
            engine.feed(f"r{row}", list(range(5, 45)), last=False, prompt_ids=prompt)
        for _ in range(batch):  # one prefill per step
            _step(engine, counter)
        states = list(engine.states())
        assert len(states) == batch and all(s.pending_code0 is not None for s in states)
        return _step(engine, counter)  # code predictor (16 codes) + talker forward, whole batch

    return asyncio.run(run())


def code2wav_counts(model_dir: str, batch: int, counter: SyncCounter) -> Counter[str]:
    engine = Code2WavEngine(model_dir, Code2WavEngineSettings(dtype="float32", max_batch=batch))
    gen = torch.Generator().manual_seed(0)

    async def run():
        for row in range(batch):
            engine.add_request(f"r{row}", ChunkPlan(4, 8, 8))
            engine.feed(f"r{row}", torch.randint(0, 2048, (16, 40), generator=gen), last=False)
        _step(engine, counter)  # first windows: fresh states
        return _step(engine, counter)  # a later window of every row, from carried state

    return asyncio.run(run())


def static_talker_frame_counts(model_dir: str, batch: int, counter: SyncCounter) -> Counter[str]:
    """The talker frame with static frames (omnistream/models/qwen3_omni/talker/frame.py)."""
    return talker_frame_counts(model_dir, batch, counter, static_frames=True)


CASES = {
    "thinker": thinker_decode_counts,
    "talker": talker_frame_counts,
    "talker-static": static_talker_frame_counts,
    "code2wav": code2wav_counts,
}


@pytest.mark.parametrize("stage", sorted(CASES))
def test_syncs_per_step_do_not_grow_with_batch_or_layers(stage, tiny_model_dir, deep_model_dir):
    measure = CASES[stage]
    counter = SyncCounter()
    results = {
        (name, batch): measure(directory, batch, counter)
        for name, directory in (("tiny", tiny_model_dir), ("deep", deep_model_dir))
        for batch in (1, 4)
    }
    for key, counts in results.items():
        print(stage, key, dict(counts), file=sys.stderr)
    reference = results["tiny", 1]
    assert 0 < sum(reference.values()) <= MAX_PER_STEP, dict(reference)
    for key, counts in results.items():
        assert counts == reference, f"{stage} {key}: {dict(counts)} != tiny batch 1: {dict(reference)}"


def test_the_counter_sees_a_sync():
    """The instrument itself: a per-row `.item()` loop shows up as one count per row."""
    counter = SyncCounter()
    with counter.counting() as counts:
        values = torch.arange(4)
        _ = [int(values[i].item()) for i in range(4)]
        _ = bool(values.sum() > 0)
    assert counts["item"] == 4 and counts["__bool__"] == 1
    assert "torch.arange" not in counts  # a factory counts only when omnistream/services call it
