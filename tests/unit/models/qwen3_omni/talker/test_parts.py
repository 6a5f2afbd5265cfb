"""The talker engine's parts alone, built with small fakes: no weights, no engine thread.

`DeadlineSchedule` gets a fake slot pool and EOS flags and plain request states; `FrameSteps` gets a
fake request book, a fake talker and code predictor; each test checks what the engine relies on
(which requests step, what a frame emits, when a request ends).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import pytest
import torch

from omnistream.engine.batch_sampler import BatchSampler
from omnistream.engine.kvcache import SlotKVCache
from omnistream.engine.output_stream import OutputStream
from omnistream.engine.playout import Playout
from omnistream.engine.sampling import SamplingParams
from omnistream.engine.stats import EngineStats
from omnistream.models.qwen3_omni.talker.eos import EosMask
from omnistream.models.qwen3_omni.talker.frame_steps import FrameSteps
from omnistream.models.qwen3_omni.talker.prompt import ASSISTANT_PROMPT_TOKENS, TTS_EOS
from omnistream.models.qwen3_omni.talker.schedule import (
    NEAR_DRY_S,
    URGENT_PREFILL_ROWS,
    DeadlineSchedule,
)
from omnistream.models.qwen3_omni.talker.state import TalkerOutput, _TalkerState
from omnistream.request.stage_chain import TalkerParams

CODEC_EOS = 7


class Pool:
    """A slot pool of `free` slots, handing out 0, 1, 2, ..."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.given: list[int] = []

    @property
    def free_slots(self) -> int:
        return self.free

    def allocate(self) -> int:
        self.free -= 1
        self.given.append(len(self.given))
        return self.given[-1]


class Flags:
    def __init__(self) -> None:
        self.set_to: dict[int, bool] = {}

    def set(self, slot: int, ignore_eos: bool) -> None:
        self.set_to[slot] = ignore_eos


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _state(loop: asyncio.AbstractEventLoop, rid: str, **fields: object) -> _TalkerState:
    state = _TalkerState(request_id=rid, output=OutputStream(loop, 8), **fields)  # type: ignore[arg-type]
    state.playout = Playout(state.arrived)
    return state


def _new_prompt(loop: asyncio.AbstractEventLoop, rid: str, rows: int = 20, **params: object) -> _TalkerState:
    return _state(
        loop,
        rid,
        prompt_ids=[1, 2, 3],
        stream=[5, 6, 7, 8],
        prompt_row_count=rows,
        params=TalkerParams(**params),  # type: ignore[arg-type]
    )


def _playing(loop: asyncio.AbstractEventLoop, rid: str, buffered: float) -> _TalkerState:
    """A prefilled request whose listener has `buffered` seconds left and whose next text row is known."""
    state = _state(loop, rid, prefill_done=True, slot=9, stream=[5, 6, 7, 8, 9, 10], frames=1)
    now = time.monotonic()
    state.playout = Playout(state.arrived, first_output=now - 1.0, seconds_out=1.0 + buffered)
    return state


def test_new_prompts_share_the_prefill_budget_and_take_slots(loop) -> None:
    pool, flags = Pool(free=2), Flags()
    schedule = DeadlineSchedule(pool, flags, prefill_chunk=30, max_step_batch=4)
    first = _new_prompt(loop, "a", rows=20, ignore_eos=True)
    second = _new_prompt(loop, "b", rows=20)
    third = _new_prompt(loop, "c", rows=20)
    step = schedule.pick([first, second, third])
    assert step is not None
    # 20 rows for the first prompt, what is left (10) for the second, none for the third.
    assert [(s.request_id, take) for s, take in step.prefill] == [("a", 20), ("b", 10)]
    assert (first.slot, second.slot, third.slot) == (0, 1, None)
    assert flags.set_to == {0: True, 1: False}
    assert step.predict == step.decode == [] and step.deferred == 0


def test_frame_rows_go_most_urgent_first_and_the_rest_are_deferred(loop) -> None:
    schedule = DeadlineSchedule(Pool(free=0), Flags(), prefill_chunk=30, max_step_batch=1)
    ahead, behind = _playing(loop, "ahead", buffered=5.0), _playing(loop, "behind", buffered=0.1)
    step = schedule.pick([ahead, behind])
    assert step is not None
    assert step.decode == [behind] and step.deferred == 1
    assert len(step.buffered) == 1 and step.buffered[0] == pytest.approx(0.1, abs=0.05)


def test_nothing_to_do_is_none(loop) -> None:
    schedule = DeadlineSchedule(Pool(free=0), Flags(), prefill_chunk=30, max_step_batch=1)
    waiting = _new_prompt(loop, "w")  # no free slot
    assert schedule.pick([waiting]) is None


def test_prefill_budget_shrinks_while_a_listener_is_near_dry(loop) -> None:
    schedule = DeadlineSchedule(Pool(free=1), Flags(), prefill_chunk=512, max_step_batch=4)
    now = time.monotonic()
    comfortable = [_playing(loop, "far", buffered=NEAR_DRY_S + 1.0)]
    assert schedule.prefill_budget(comfortable, now) == 512
    near = [_playing(loop, "near", buffered=0.2)]
    assert schedule.prefill_budget(near, now) == URGENT_PREFILL_ROWS  # nothing measured yet
    schedule.measure_prefill(rows=100, seconds=0.1)  # 1 ms a row
    assert schedule.prefill_row_seconds == pytest.approx(1e-3)
    # Half of ~0.2 s left at 1 ms a row: ~100 rows.
    assert 90 <= schedule.prefill_budget(near, now) <= 100
    schedule.measure_prefill(rows=0, seconds=1.0)  # no rows: no sample
    assert schedule.prefill_row_seconds == pytest.approx(1e-3)


def test_a_zero_prefill_chunk_is_refused() -> None:
    with pytest.raises(ValueError, match="prefill_chunk"):
        DeadlineSchedule(Pool(free=1), Flags(), prefill_chunk=0, max_step_batch=1)


def test_text_row_ready_waits_for_the_next_token_or_the_end(loop) -> None:
    state = _state(loop, "r", stream=[5, 6, 7, 8, 9], frames=1)
    assert not DeadlineSchedule.text_row_ready(state)  # its row, token 9, may be the thinker's last
    state.stream.append(10)
    assert DeadlineSchedule.text_row_ready(state)
    ended = _state(loop, "e", stream=[5, 6, 7, 8, 9], frames=1, input_done=True)
    assert DeadlineSchedule.text_row_ready(ended)  # the thinker's last token: tts_eos's place


# --- FrameSteps ----------------------------------------------------------------------------------


class Book:
    """The request book a frame reports to: failures are collected, finished requests recorded."""

    def __init__(self) -> None:
        self.stats = EngineStats()
        self.finished: list[str] = []
        self.failed: list[str] = []

    @contextlib.contextmanager
    def row(self, state: _TalkerState) -> Iterator[None]:
        try:
            yield
        except Exception:
            self.failed.append(state.request_id)

    def finish(self, state: _TalkerState) -> None:
        state.finished = True
        self.finished.append(state.request_id)


class FakeTalker:
    """Hidden rows are the inputs; the codec head scores code `hidden[..., 0]` highest."""

    VOCAB = 16

    def __init__(self) -> None:
        self.embedding = torch.nn.Embedding(self.VOCAB, 4)

    def model(self, inputs_embeds: torch.Tensor, **_: object) -> object:
        class Out:
            last_hidden_state = inputs_embeds

        return Out()

    def codec_head(self, hidden: torch.Tensor) -> torch.Tensor:
        wanted = hidden[..., 0].long().clamp(0, self.VOCAB - 1)
        return torch.nn.functional.one_hot(wanted, self.VOCAB).float() * 10

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.embedding


class FakeCodePredictor:
    """Every group's logits pick code `group + 1`."""

    def run(self, group: int, embeds: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(embeds.shape[0], FakeTalker.VOCAB)
        logits[:, group + 1] = 10.0
        return logits


def _frames(book: Book, cache: SlotKVCache | None = None, groups: int = 3) -> FrameSteps:
    slots = 2
    return FrameSteps(
        requests=book,
        talker=FakeTalker(),
        cp_embeddings=[torch.nn.Embedding(FakeTalker.VOCAB, 4) for _ in range(groups - 1)],
        code_predictor=FakeCodePredictor(),  # type: ignore[arg-type]
        frame=None,
        prompts=None,  # type: ignore[arg-type]  # the eager text rows are not used here
        cache=cache,  # type: ignore[arg-type]
        sampler=BatchSampler(FakeTalker.VOCAB, "cpu", slots=slots),
        cp_sampler=BatchSampler(FakeTalker.VOCAB, "cpu"),
        eos_mask=EosMask(FakeTalker.VOCAB, CODEC_EOS, slots, "cpu"),
        device="cpu",
        codec_eos=CODEC_EOS,
        num_groups=groups,
        frame_seconds=0.08,
    )


def test_codec_eos_finishes_the_request_and_another_code_waits_for_its_residuals(loop) -> None:
    book = Book()
    frames = _frames(book)
    ending, going = _state(loop, "end"), _state(loop, "go")
    frames.accept_code0(ending, CODEC_EOS, None)
    assert book.finished == ["end"]
    assert ending.output.queued() == [TalkerOutput(None, 0, finished=True, finish_reason="stop")]
    hidden = torch.ones(1, 1, 4)
    frames.accept_code0(going, 3, hidden)
    assert going.pending_code0 == 3 and going.past_hidden is hidden and book.finished == ["end"]


def test_predict_residuals_emits_a_whole_frame_and_counts_it(loop) -> None:
    book = Book()
    frames = _frames(book, groups=3)
    state = _state(loop, "r", params=TalkerParams(max_frames=2))
    state.pending_code0, state.past_hidden = 4, torch.zeros(1, 1, 4)
    frames.predict_residuals([state])
    assert state.output.queued() == [TalkerOutput([4, 1, 2], 0, finished=False, finish_reason=None)]
    assert state.frames == 1 and state.pending_code0 is None and state.next_codec_sum is not None
    assert book.stats.last_units == 1 and state.playout.seconds_out == pytest.approx(0.08)
    state.pending_code0, state.past_hidden = 5, torch.zeros(1, 1, 4)
    frames.predict_residuals([state])  # the second frame is max_frames: the request ends
    assert state.output.queued()[-1] == TalkerOutput([5, 1, 2], 1, finished=True, finish_reason="length")
    assert book.finished == ["r"]


def test_next_picks_and_the_code_predictors_sampling(loop) -> None:
    frames = _frames(Book())
    greedy = _state(loop, "g", stream=[5, 6, 7, 8, 9, 10], frames=1)
    sampled = _state(
        loop,
        "s",
        stream=[5, 6, 7, 8, 9, 10],
        frames=2,
        input_done=True,
        params=TalkerParams(sampling=SamplingParams(temperature=0.9)),
    )
    # Frame 1 reads assistant-stream token 4; frame 2 of an ended stream of 6 is tts_eos's place.
    assert frames.next_picks([greedy, sampled]) == [9, TTS_EOS]
    rows = frames.cp_rows([greedy, sampled])
    assert rows[0].params.greedy and not rows[1].params.greedy
    assert rows[1].params.top_k == 50 and rows[1].params.top_p == 0.8
    assert ASSISTANT_PROMPT_TOKENS == 4


def test_talker_forward_and_code0_through_a_real_cache(loop) -> None:
    book = Book()
    cache = SlotKVCache(num_layers=1, num_kv_heads=1, head_dim=4, slots=2, capacity=8, dtype=torch.float32)
    frames = _frames(book, cache=cache)
    state = _state(loop, "r")
    state.slot = cache.allocate()
    rows = torch.zeros(1, 2, 4)
    rows[0, -1, 0] = 3.0  # the fake head picks code 3 from the last row
    hidden = frames.talker_forward([state], rows, commit=False)
    assert hidden.shape == (1, 1, 4)
    frames.take_code0([state], hidden, first=True, commit=True)
    assert state.pending_code0 == 3
    assert cache.lengths[state.slot] == 2  # committed once codebook 0 was chosen


def test_user_positions_are_the_rows_of_user_turns_whatever_the_ids():
    """The numpy form against the rule spelled out: a position belongs to the turn of the last
    <|im_start|> at or before it (position 0's turn before any), a user turn when its role is."""
    import random

    from omnistream.models.qwen3_omni.talker.prompt import user_positions

    def spelled_out(ids: list[int]) -> list[int]:
        out, last = [], 0
        for i, t in enumerate(ids):
            if t == 1:
                last = i
            if ids[min(last + 1, len(ids) - 1)] == 2:
                out.append(i)
        return out

    rng = random.Random(0)
    cases = [[], [1], [2], [1, 2], [2, 1], [1, 3, 1, 2, 5, 6], [5, 2, 7, 1, 3, 9, 1, 2]]
    cases += [[rng.choice([1, 2, 3, 4]) for _ in range(rng.randrange(1, 60))] for _ in range(300)]
    for ids in cases:
        assert user_positions(ids, 1, 2) == spelled_out(ids), ids
