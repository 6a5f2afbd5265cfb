"""`TalkerIntake` alone, with made-up token ids and plain request states: no weights, no engine.

What the engine relies on: a malformed input is refused with the field a client can act on and
leaves the request's state as it was, a good one fills in what the schedule and the prefill read,
and an input that ends with nothing spoken is told apart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import torch

from omnistream.engine.output_stream import OutputStream
from omnistream.models.qwen3_omni.talker.deep_rows import DeepRows
from omnistream.models.qwen3_omni.talker.intake import TalkerIntake
from omnistream.models.qwen3_omni.talker.prompt import ASSISTANT_PROMPT_ROWS
from omnistream.models.qwen3_omni.talker.state import _TalkerState
from omnistream.request.errors import InvalidRequest
from omnistream.request.media import MediaLayout
from omnistream.request.stage_chain import TalkerParams

VOCAB, WIDTH = 100, 4
IM_START, USER, ASSISTANT, IM_END, AUDIO, NL = 90, 91, 92, 93, 80, 10
# A user turn with two audio tokens (positions 3 and 4), then the assistant turn's head.
PROMPT = [IM_START, USER, 5, AUDIO, AUDIO, 6, IM_END, IM_START, ASSISTANT, NL]
USERS = list(range(7))  # the user turn's positions, its <|im_start|> included
TAIL = PROMPT[7:]  # the assistant stream's start


def _intake(max_model_len: int = 512) -> TalkerIntake:
    return TalkerIntake(
        thinker_vocab=VOCAB,
        hidden_width=WIDTH,
        multimodal_ids={AUDIO},
        im_start_id=IM_START,
        assistant_id=ASSISTANT,
        user_id=USER,
        max_model_len=max_model_len,
        device="cpu",
        dtype=torch.float64,
    )


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _state(loop: asyncio.AbstractEventLoop, max_frames: int = 100) -> _TalkerState:
    return _TalkerState(
        request_id="r", output=OutputStream(loop, 8), params=TalkerParams(max_frames=max_frames)
    )


def _deep(positions: list[int], width: int = WIDTH) -> DeepRows:
    return DeepRows(positions, torch.randn(len(positions), width, dtype=torch.float64))


def _untouched(state: _TalkerState) -> bool:
    return state.prompt_ids is None and state.stream == [] and state.spoken_tokens == 0


def test_a_prompt_then_tokens_fill_what_the_schedule_and_the_prefill_read(loop):
    intake, state = _intake(), _state(loop)
    deep, layout = _deep([3, 4]), MediaLayout(audio_feature_lengths=(12,))
    prompt = list(PROMPT)
    assert intake.take(state, [20, 21], False, prompt, deep, layout) is False
    prompt.append(0)  # the state holds its own copy
    assert state.prompt_ids == PROMPT and state.user_positions == USERS
    assert state.prompt_row_count == len(USERS) + ASSISTANT_PROMPT_ROWS
    assert state.stream == [*TAIL, 20, 21] and state.spoken_tokens == 2 and not state.input_done
    assert state.multimodal_hidden is deep and state.media_layout is layout
    assert intake.take(state, [22], True, None, None, None) is False
    assert state.stream == [*TAIL, 20, 21, 22] and state.spoken_tokens == 3 and state.input_done


def test_an_input_that_ends_with_nothing_spoken_is_told_apart(loop):
    intake, state = _intake(), _state(loop)
    assert intake.take(state, [], False, PROMPT, _deep([3, 4]), None) is False
    assert intake.take(state, [], True, None, None, None) is True
    assert state.input_done and state.spoken_tokens == 0


def test_the_end_needs_a_generated_token_after_the_assistant_head(loop):
    """A prompt ending at `<|im_start|>assistant` needs the newline and a content token to come."""
    intake, state = _intake(), _state(loop)
    prompt = [IM_START, USER, 5, IM_END, IM_START, ASSISTANT]
    with pytest.raises(InvalidRequest, match="at least one generated token"):
        intake.take(state, [NL], True, prompt, None, None)
    ok = _state(loop)
    assert intake.take(ok, [NL, 20], True, prompt, None, None) is False


def test_ids_outside_the_thinker_vocabulary_are_refused(loop):
    intake = _intake()
    intake.check_tokens([0, VOCAB - 1])
    for bad in ([VOCAB], [-1]):
        with pytest.raises(InvalidRequest, match=r"token ids must be in \[0, 100\)") as err:
            intake.check_tokens(bad)
        assert err.value.field == "token_ids"
        state = _state(loop)
        with pytest.raises(InvalidRequest, match="prompt ids") as err:
            intake.take(state, [20], False, [*PROMPT[:5], *bad, *PROMPT[5:]], _deep([3, 4]), None)
        assert err.value.field == "prompt_ids" and _untouched(state)


def test_deep_rows_come_in_the_engines_dtype_in_one_copy():
    intake = _intake()
    assert intake.device_rows(None) is None
    rows = intake.device_rows({4: torch.ones(WIDTH), 3: torch.zeros(WIDTH)})
    assert rows is not None and rows.positions == [4, 3] and rows.rows.dtype == torch.float64
    assert torch.equal(rows[4], torch.ones(WIDTH, dtype=torch.float64))
    ready = _deep([3])
    assert intake.device_rows(ready) is ready  # already there: no copy
    with pytest.raises(InvalidRequest, match="one width") as err:
        intake.device_rows({3: torch.zeros(WIDTH), 4: torch.zeros(WIDTH + 1)})
    assert err.value.field == "prompt_hidden"


def test_a_prompt_with_no_assistant_turn_or_too_long_for_max_frames_is_refused(loop):
    intake, state = _intake(), _state(loop)
    with pytest.raises(InvalidRequest, match="assistant") as err:
        intake.take(state, [20], False, PROMPT[:7], _deep([3, 4]), None)
    assert err.value.field == "prompt_ids" and _untouched(state)
    fits = len(PROMPT) + ASSISTANT_PROMPT_ROWS + 100  # the bound: every id a row, plus the assistant rows
    assert intake.take(_state(loop, max_frames=100), [20], False, PROMPT, _deep([3, 4]), None) is False
    tight = _intake(max_model_len=fits - 1)
    state = _state(loop, max_frames=100)
    with pytest.raises(InvalidRequest, match="exceeds the talker length") as err:
        tight.take(state, [20], False, PROMPT, _deep([3, 4]), None)
    assert err.value.field == "max_frames" and _untouched(state)
    assert _intake(max_model_len=fits).take(_state(loop), [20], False, PROMPT, _deep([3, 4]), None) is False


@pytest.mark.parametrize(
    ("positions", "width", "field", "message"),
    [
        ([3], WIDTH, "prompt_hidden", r"prompt positions \[4\] hold audio"),  # a row missing
        ([], WIDTH, "prompt_hidden", r"prompt positions \[3, 4\]"),  # none given
        ([2, 3, 4], WIDTH, "multimodal_positions", "position 2 holds no audio"),  # a text position
        ([3, 4, 99], WIDTH, "multimodal_positions", "position 99 holds no audio"),  # past the prompt
        ([3, 4], WIDTH + 1, "prompt_hidden", f"must have width {WIDTH}"),
    ],
)
def test_deep_rows_must_match_the_prompts_multimodal_positions_one_for_one(
    loop, positions, width, field, message
):
    intake, state = _intake(), _state(loop)
    with pytest.raises(InvalidRequest, match=message) as err:
        intake.take(state, [20], False, PROMPT, _deep(positions, width), None)
    assert err.value.field == field and _untouched(state)


def test_a_prompt_without_multimodal_tokens_takes_no_rows_and_no_hidden(loop):
    intake = _intake()
    plain = [IM_START, USER, 5, IM_END, IM_START, ASSISTANT, NL]
    assert intake.take(_state(loop), [20], False, plain, None, None) is False
    assert intake.take(_state(loop), [20], False, plain, _deep([]), None) is False
    intake.check_multimodal(PROMPT, [7, 8, 9], None)  # its audio is outside these user positions


def test_inputs_must_come_in_order(loop):
    intake, state = _intake(), _state(loop)
    with pytest.raises(InvalidRequest, match="must carry the prompt ids") as err:
        intake.take(state, [20], False, None, None, None)
    assert err.value.field == "prompt_ids" and _untouched(state)
    intake.take(state, [20], False, PROMPT, _deep([3, 4]), None)
    with pytest.raises(InvalidRequest, match="already given") as err:
        intake.take(state, [21], False, PROMPT, _deep([3, 4]), None)
    assert err.value.field == "prompt_ids"
    for deep, layout in ((_deep([3, 4]), None), (None, MediaLayout())):
        with pytest.raises(InvalidRequest, match="with the prompt only") as err:
            intake.take(state, [21], False, None, deep, layout)
        assert err.value.field == "prompt_hidden"
    assert state.stream == [*TAIL, 20]  # none of the refused inputs joined
    intake.take(state, [21], True, None, None, None)
    with pytest.raises(InvalidRequest, match="already received its last input"):
        intake.take(state, [22], False, None, None, None)
    assert state.stream == [*TAIL, 20, 21]
