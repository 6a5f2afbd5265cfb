"""Exact streaming Code2Wav: any chunking, batched with other requests, equals the one-shot decode.

Chunkings are the chunk plan's (`ChunkPlan.window_end`), under both schedules: fixed windows after
the first, and the growing ones (doubling up to the chunk size) the talker ships by default.

The reference is always the module's own forward, `code2wav(codes)`. Weights are re-randomised to
a realistic scale (random init leaves the audio at ~1e-6, where any error looks small).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from transformers import Qwen3OmniMoeConfig
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

from omnistream.engine.op_count import OpCounter
from omnistream.models.qwen3_omni.code2wav.stream import StreamingCode2Wav
from omnistream.request.chunk_plan import SCHEDULES, ChunkPlan

TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-5}

# The real checkpoint's structure (8 layers, window 72, 16 heads, rates 8,5,4,3, ratios 2,2) with
# narrow channels, so the default suite can afford it; `test_real_sizes` runs the real widths.
REAL_STRUCTURE_NARROW = dict(hidden_size=64, intermediate_size=128, decoder_dim=96)


def realistic(config: Qwen3OmniMoeCode2WavConfig, seed: int, dtype: torch.dtype) -> Qwen3OmniMoeCode2Wav:
    """A Code2Wav whose activations stay O(1) through every layer and whose audio has rms ~0.1."""
    torch.manual_seed(seed)
    model = Qwen3OmniMoeCode2Wav(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.5 / p[0].numel() ** 0.5)
            elif name.endswith(("alpha", "beta")):
                p.normal_(0, 0.5)
            elif name.endswith(("scale", "gamma")):
                p.uniform_(0.1, 1.0)
            elif name.endswith("bias"):
                p.normal_(0, 0.1)
            else:  # norm weights
                p.uniform_(0.5, 1.5)
        model.to(dtype)
        probe = model(torch.randint(0, config.codebook_size, (1, config.num_quantizers, 30)))
        model.decoder[-1].conv.weight.mul_(0.1 / float(probe.std()))
    return model


@dataclass
class Request:
    codes: torch.Tensor  # [16, T]
    initial: int
    chunk: int
    joins: int  # the batched step at which it joins
    schedule: str = "fixed"

    def chunks(self) -> list[torch.Tensor]:
        """The windows of the plan (`initial` may exceed `chunk` here: fixed still starts with it)."""
        plan = ChunkPlan(self.initial, self.chunk, 0, self.schedule)
        bounds, at = [], 0
        while at < self.codes.shape[1]:
            end = min(plan.window_end(at), self.codes.shape[1])
            bounds.append(self.codes[:, at:end])
            at = end
        return bounds


def stream(decoder: StreamingCode2Wav, requests: list[Request]) -> list[torch.Tensor]:
    """Run the requests through batched steps; they join at their step and leave when done."""
    todo = [r.chunks() for r in requests]
    states = [decoder.new_state() for _ in requests]
    audio: list[list[torch.Tensor]] = [[] for _ in requests]
    step = 0
    while any(todo):
        rows = [i for i, r in enumerate(requests) if r.joins <= step and todo[i]]
        if rows:
            out, new = decoder.step([states[i] for i in rows], [todo[i].pop(0) for i in rows])
            for i, a, s in zip(rows, out, new, strict=True):
                audio[i].append(a)
                states[i] = s
        step += 1
    return [torch.cat(a) for a in audio]


def requests_strategy(max_frames: int, schedule: str = "fixed"):
    one = st.builds(
        lambda length, initial, chunk, joins, seed: Request(
            torch.randint(0, 2048, (16, length), generator=torch.Generator().manual_seed(seed)),
            initial,
            chunk,
            joins,
            schedule,
        ),
        st.integers(1, max_frames),
        st.integers(1, 25),
        st.integers(1, 100),
        st.integers(0, 4),
        st.integers(0, 2**16),
    )
    return st.lists(one, min_size=1, max_size=3)


def check(model: Qwen3OmniMoeCode2Wav, requests: list[Request], dtype: torch.dtype) -> float:
    streamed = stream(StreamingCode2Wav(model), requests)
    worst = 0.0
    with torch.no_grad():
        for r, audio in zip(requests, streamed, strict=True):
            full = model(r.codes[None]).reshape(-1)
            assert audio.shape == full.shape
            worst = max(worst, float((audio - full).abs().max()))
    assert worst <= TOLERANCE[dtype], worst
    print(f"max abs difference {worst:.3g} ({dtype}, {len(requests)} request(s))")
    return worst


def hypothesis_settings(examples: int):
    return settings(
        max_examples=examples,
        derandomize=True,  # the same examples on every run of the same source tree
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Hundreds of small steps: on a shared 2-core machine, torch's thread pool only adds waiting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_config(tiny_model_dir) -> Qwen3OmniMoeCode2WavConfig:
    return Qwen3OmniMoeConfig.from_pretrained(tiny_model_dir).code2wav_config


@pytest.fixture(scope="module")
def models(tiny_config) -> dict[tuple[str, torch.dtype], Qwen3OmniMoeCode2Wav]:
    narrow = Qwen3OmniMoeCode2WavConfig(**REAL_STRUCTURE_NARROW)
    return {
        (name, dtype): realistic(config, seed=1, dtype=dtype)
        for name, config in (("tiny", tiny_config), ("real-structure", narrow))
        for dtype in (torch.float64, torch.float32)
    }


def test_realistic_weights_make_audible_unclipped_audio(models):
    model = models[("tiny", torch.float64)]
    audio = model(torch.randint(0, 2048, (1, 16, 50), generator=torch.Generator().manual_seed(3)))
    assert 0.03 < float(audio.detach().std()) < 0.3
    assert float((audio.abs() >= 1).float().mean()) < 0.01


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("name", ["tiny", "real-structure"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_stream_equals_one_shot_decode(models, name, dtype, schedule):
    model = models[(name, dtype)]

    @hypothesis_settings(examples=4)
    @given(requests=requests_strategy(400, schedule))
    def run(requests):
        check(model, requests, dtype)

    run()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_past_the_sliding_window_one_frame_at_a_time(models, dtype):
    """Single frames across the window edge: the KV cache keeps exactly `window - 1` frames."""
    codes = torch.randint(0, 2048, (16, 150), generator=torch.Generator().manual_seed(5))
    requests = [Request(codes, 1, 1, 0), Request(codes[:, :80], 3, 2, 1)]
    check(models[("real-structure", dtype)], requests, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_the_default_growing_plan_past_the_sliding_window(models, dtype):
    """The talker's default plan (2, 2, 4, 8, 16, 25, ...) beside a fixed one, across the window edge."""
    codes = torch.randint(0, 2048, (16, 150), generator=torch.Generator().manual_seed(6))
    assert Request(codes, 2, 25, 0, "grow").chunks()[5].shape[1] == 25  # it did grow to the cap
    requests = [Request(codes, 2, 25, 0, "grow"), Request(codes[:, :97], 4, 25, 1, "fixed")]
    check(models[("real-structure", dtype)], requests, dtype)


def test_first_chunk_needs_no_lookahead(models):
    """One frame in gives its audio at once: 1920 - 555 samples, then 1920 per frame."""
    model = models[("tiny", torch.float64)]
    decoder = StreamingCode2Wav(model)
    codes = torch.randint(0, 2048, (16, 3), generator=torch.Generator().manual_seed(9))
    state = decoder.new_state()
    sizes = []
    for i in range(3):
        (audio,), (state,) = decoder.step([state], [codes[:, i : i + 1]])
        sizes.append(audio.numel())
    assert sizes == [1920 - 555, 1920, 1920]


def test_a_failed_step_leaves_the_states_unchanged(models):
    decoder = StreamingCode2Wav(models[("tiny", torch.float64)])
    codes = torch.randint(0, 2048, (16, 10), generator=torch.Generator().manual_seed(2))
    (_,), (state,) = decoder.step([decoder.new_state()], [codes[:, :4]])
    with pytest.raises(IndexError):
        decoder.step([state, state], [codes[:, 4:], torch.full((16, 2), 10**6)])  # out of the table
    (again,), _ = decoder.step([state], [codes[:, 4:]])
    (whole,), _ = decoder.step([decoder.new_state()], [codes])
    torch.testing.assert_close(again, whole[-again.numel() :], rtol=0, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_real_sizes(dtype):
    """The real checkpoint's configuration, widths included (minutes on a CPU)."""
    model = realistic(Qwen3OmniMoeCode2WavConfig(), seed=2, dtype=dtype)

    codes = torch.randint(0, 2048, (16, 100), generator=torch.Generator().manual_seed(1))
    past_the_window = [Request(codes, 4, 25, 0), Request(codes[:, :77], 1, 7, 2)]

    @hypothesis_settings(examples=2)
    @given(requests=requests_strategy(120))
    @example(requests=past_the_window)
    def run(requests):
        check(model, requests, dtype)

    run()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny", "real-structure"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_stream_equals_one_shot_decode_long(models, name, dtype, schedule):
    model = models[(name, dtype)]

    @hypothesis_settings(examples=25)
    @given(requests=requests_strategy(400, schedule))
    def run(requests):
        check(model, requests, dtype)

    run()


@pytest.mark.parametrize("fresh", [False, True], ids=["carried", "first-chunk"])
def test_a_step_dispatches_the_same_ops_at_any_batch(models, fresh):
    """No per-row loop in the step: the rows' states are stacked and the new ones gathered, so
    batch 8 dispatches exactly the ops of batch 1 (rows at different positions and lengths)."""
    decoder = StreamingCode2Wav(models[("tiny", torch.float32)])
    gen = torch.Generator().manual_seed(11)

    def ops(batch: int) -> int:
        states = []
        for row in range(batch):
            state = decoder.new_state()
            if not fresh:  # carried state: every row already past its first chunk, at its own position
                _, (state,) = decoder.step([state], [torch.randint(0, 2048, (16, 1 + row), generator=gen)])
            states.append(state)
        codes = [torch.randint(0, 2048, (16, 1 + row % 3), generator=gen) for row in range(batch)]
        with OpCounter() as counter:
            decoder.step_padded(states, codes)
        return counter.counts.total

    assert ops(8) == ops(3) == ops(1) > 0
