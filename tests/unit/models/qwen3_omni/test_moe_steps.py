"""The thinker's and the talker's decode steps, in the experts implementations the project selects,
wait for no device inside their MoE blocks, and the fixed experts answer as transformers' eager
experts do.

On the real-shaped build (128 experts, top-8 thinker and top-6 talker rows), at batch 1 and 16,
greedy and sampled: `fixed` (every CUDA selection but bfloat16 on SM90/SM100, and float64) records
nothing; `grouped_mm` (the CPU's and SM90's) records only its kernel (tests/moe_syncs.py). The
engines are stepped by hand on the test thread (`plan_step` + `run_step`), as their thread does.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from omnistream.engine.load_options import LoadOptions
from omnistream.engine.settings import TalkerEngineSettings, ThinkerEngineSettings, derive
from omnistream.models.qwen3_omni.talker.engine import TalkerEngine
from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine
from omnistream.request.sampling_params import SamplingParams
from omnistream.request.stage_chain import TalkerParams, ThinkerParams
from tests.moe_syncs import MoeSyncs
from tests.talker_codes import talker_codes

ALLOWED = {"fixed": set(), "grouped_mm": {"aten._grouped_mm"}}


def _sampling(row: int, greedy: bool) -> SamplingParams:
    if greedy:
        return SamplingParams()
    return SamplingParams(temperature=0.8, top_k=20, top_p=0.9, repetition_penalty=1.1, seed=row)


def _step(engine) -> None:
    work = engine.plan_step()
    assert work is not None, "the engine has no work"
    with torch.inference_mode():
        engine.run_step(work)


def _counted(engine, model: torch.nn.Module) -> MoeSyncs:
    work = engine.plan_step()
    assert work is not None, "the engine has no work"
    with torch.inference_mode(), MoeSyncs(model) as syncs:
        engine.run_step(work)
    return syncs


def _options(experts: str, dtype: str = "float32") -> LoadOptions:
    return LoadOptions(dtype=dtype, experts=experts)  # type: ignore[arg-type]


def _prompt(model_dir: str, text: str = "hello there") -> list[int]:
    engine = ThinkerEngine(model_dir, ThinkerEngineSettings(dtype="float32", max_batch=1, max_model_len=256))
    return engine.encode_chat([{"role": "user", "content": text}])


def thinker_decode(model_dir: str, experts: str, batch: int, greedy: bool) -> MoeSyncs:
    engine = ThinkerEngine(
        model_dir, derive(ThinkerEngineSettings, _options(experts), max_batch=batch, max_model_len=256)
    )
    prompt = _prompt(model_dir)

    async def run() -> MoeSyncs:
        for row in range(batch):
            params = ThinkerParams(max_tokens=64, ignore_eos=True, sampling=_sampling(row, greedy))
            engine.add_request(f"r{row}", prompt, params)
        for _ in range(batch + 1):  # one prefill a step, then the first decode
            _step(engine)
        assert all(s.next_token is not None for s in engine.states())
        return _counted(engine, engine.thinker)

    return asyncio.run(run())


def talker_frame(model_dir: str, experts: str, batch: int, greedy: bool) -> MoeSyncs:
    engine = TalkerEngine(
        model_dir, derive(TalkerEngineSettings, _options(experts), max_batch=batch, max_model_len=256)
    )
    prompt = _prompt(model_dir, "hello")

    async def run() -> MoeSyncs:
        for row in range(batch):
            engine.add_request(f"r{row}", TalkerParams(max_frames=64, sampling=_sampling(row, greedy)))
            engine.feed(f"r{row}", list(range(5, 45)), last=False, prompt_ids=prompt)
        for _ in range(batch + 1):  # one prefill a step, then the first frame
            _step(engine)
        return _counted(engine, engine.talker)

    return asyncio.run(run())


STEPS = {"thinker": thinker_decode, "talker": talker_frame}
CASES = [
    pytest.param(
        stage, "fixed", batch, greedy, id=f"{stage}-fixed-{batch}-{'greedy' if greedy else 'sampled'}"
    )
    for stage in STEPS
    for batch in (1, 16)
    for greedy in (True, False)
] + [pytest.param(stage, "grouped_mm", 16, False, id=f"{stage}-grouped_mm-16-sampled") for stage in STEPS]


@pytest.mark.parametrize(("stage", "experts", "batch", "greedy"), CASES)
def test_a_decode_step_waits_for_no_device_in_its_experts(
    stage, experts, batch, greedy, real_shaped_model_dir
):
    syncs = STEPS[stage](real_shaped_model_dir, experts, batch, greedy)
    assert syncs.blocks >= 2, "the step ran no MoE block"
    assert set(syncs.found) <= ALLOWED[experts], dict(syncs.found)


def test_eager_experts_are_seen_waiting(real_shaped_model_dir):
    """The recorder on a real engine step: transformers' eager loop shows its syncs."""
    syncs = thinker_decode(real_shaped_model_dir, "eager", 4, greedy=True)
    assert syncs.found["aten.nonzero"] >= 2 and syncs.found["Tensor.__bool__"] > 0


def _thinker_tokens(model_dir: str, experts: str, dtype: str) -> list[list[int]]:
    engine = ThinkerEngine(
        model_dir, derive(ThinkerEngineSettings, _options(experts, dtype), max_batch=4, max_model_len=256)
    )
    texts = ["hello there", "tell me about the sea", "a", "caf\u00e9 and tomorrow?"]

    async def run():
        outputs = [
            engine.add_request(
                f"r{i}",
                engine.encode_chat([{"role": "user", "content": text}]),
                ThinkerParams(max_tokens=20, ignore_eos=True, sampling=_sampling(i, greedy=i % 2 == 0)),
            )
            for i, text in enumerate(texts)
        ]
        engine.start()
        return [[t async for item in out for t in item.token_ids] for out in outputs]

    try:
        return asyncio.run(run())
    finally:
        engine.stop()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("build", ["tiny", "real-shaped"])
def test_fixed_experts_answer_as_eager_experts(build, dtype, tiny_model_dir, real_shaped_model_dir):
    model_dir = tiny_model_dir if build == "tiny" else real_shaped_model_dir
    tokens = _thinker_tokens(model_dir, "fixed", dtype)
    assert tokens == _thinker_tokens(model_dir, "eager", dtype)
    assert all(len(t) == 20 for t in tokens)
    sampling = [_sampling(i, greedy=i % 2 == 0) for i in range(4)]
    codes = talker_codes(model_dir, sampling, _options("fixed", dtype), max_frames=12)
    assert codes == talker_codes(model_dir, sampling, _options("eager", dtype), max_frames=12)
    assert all(codes)
