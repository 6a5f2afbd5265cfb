import pytest
import torch

from omnistream.request.chunk_plan import ChunkPlan
from omnistream.request.generation import GenerationRequest
from omnistream.request.sampling_params import SamplingParams
from omnistream.request.stage_chain import (
    STAGES,
    CodecFeed,
    InputHold,
    TalkerFeed,
    stage_opens,
    stages_for,
)


def test_async_hold_passes_every_piece_at_once():
    hold = InputHold("async", TalkerFeed.merge)
    first = TalkerFeed([1], False, prompt_ids=[7, 8])
    assert hold.push(first, False) == [first]
    last = TalkerFeed([], True)
    assert hold.push(last, True) == [last]


def test_sequential_hold_releases_one_merged_piece_with_the_last():
    hold = InputHold("sequential", TalkerFeed.merge)
    row = torch.ones(4)
    assert hold.push(TalkerFeed([1, 2], False, prompt_ids=[7, 8], multimodal_hidden={1: row}), False) == []
    assert hold.push(TalkerFeed([3], False), False) == []
    (merged,) = hold.push(TalkerFeed([4], True), True)
    assert merged.token_ids == [1, 2, 3, 4]
    assert merged.prompt_ids == [7, 8]
    assert merged.last
    assert merged.multimodal_hidden is not None and merged.multimodal_hidden[1] is row


def test_codec_feeds_merge_into_one_tensor_from_the_first_frame():
    a = torch.arange(32).reshape(16, 2)
    b = torch.arange(16).reshape(16, 1)
    hold = InputHold("sequential", CodecFeed.merge)
    assert hold.push(CodecFeed(a, 0, False), False) == []
    assert hold.push(CodecFeed(None, 2, False), False) == []
    (merged,) = hold.push(CodecFeed(b, 2, True), True)
    assert merged.first_frame == 0 and merged.last
    assert torch.equal(merged.codes, torch.cat([a, b], dim=1))


def test_codec_merge_without_frames_has_no_codes():
    merged = CodecFeed.merge([CodecFeed(None, 0, True)])
    assert merged.codes is None and merged.frames == 0 and merged.last


def test_text_only_requests_open_only_the_thinker():
    request = GenerationRequest(messages=[{"role": "user", "content": "hi"}], return_audio=False)
    assert stages_for(request) == ("thinker",)
    opens = stage_opens(request, ChunkPlan())
    assert opens.talker is None and opens.plan is None


def test_audio_requests_open_every_stage_with_the_request_values():
    talker_sampling = SamplingParams(temperature=0.9, top_k=50, seed=3)
    request = GenerationRequest(
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=12,
        speaker="chelsie",
        max_audio_frames=99,
        talker_sampling=talker_sampling,
        mode="sequential",
    )
    plan = ChunkPlan(2, 25, 25)
    opens = stage_opens(request, plan)
    assert stages_for(request) == STAGES
    assert opens.thinker.max_tokens == 12
    assert opens.talker is not None
    assert (opens.talker.speaker, opens.talker.max_frames, opens.talker.sampling) == (
        "chelsie",
        99,
        talker_sampling,
    )
    assert opens.plan == plan and opens.mode == "sequential"


def test_a_given_answer_reaches_the_thinker_open_and_its_wire_form():
    from omnistream.wire.convert import thinker_open_proto

    request = GenerationRequest(messages=[{"role": "user", "content": "hi"}], assistant_text="Hi <|im_end|>!")
    opens = stage_opens(request, ChunkPlan())
    assert opens.thinker.assistant_text == "Hi <|im_end|>!"
    wire = thinker_open_proto("r", opens, request.messages, None)
    assert wire.assistant_text == "Hi <|im_end|>!"
    plain = GenerationRequest(messages=[{"role": "user", "content": "hi"}])
    assert thinker_open_proto("r", stage_opens(plain, ChunkPlan()), plain.messages, None).assistant_text == ""


def test_ignore_eos_reaches_the_talker_open_and_its_wire_form():
    """A fixed-length request (the benchmark's) must not end at the talker's EOS either."""
    from omnistream.wire.convert import talker_open_proto

    for ignore in (True, False):
        request = GenerationRequest(messages=[{"role": "user", "content": "hi"}], ignore_eos=ignore)
        opens = stage_opens(request, ChunkPlan())
        assert opens.thinker.ignore_eos is ignore and opens.talker is not None
        assert opens.talker.ignore_eos is ignore
        assert talker_open_proto("r", opens).ignore_eos is ignore


def test_a_cache_scope_reaches_both_opens_and_their_wire_forms_and_a_long_one_is_refused():
    from omnistream.request.errors import InvalidRequest
    from omnistream.wire.convert import (
        MAX_CACHE_SCOPE_BYTES,
        checked_cache_scope,
        talker_open_proto,
        thinker_open_proto,
    )

    request = GenerationRequest(messages=[{"role": "user", "content": "hi"}], cache_scope=b"\x00session")
    opens = stage_opens(request, ChunkPlan())
    assert opens.talker is not None
    assert opens.thinker.cache_scope == opens.talker.cache_scope == b"\x00session"
    assert thinker_open_proto("r", opens, request.messages, None).cache_scope == b"\x00session"
    assert talker_open_proto("r", opens).cache_scope == b"\x00session"
    assert checked_cache_scope(b"x" * MAX_CACHE_SCOPE_BYTES) == b"x" * MAX_CACHE_SCOPE_BYTES
    with pytest.raises(InvalidRequest, match="cache_scope") as err:
        checked_cache_scope(b"x" * (MAX_CACHE_SCOPE_BYTES + 1))
    assert err.value.field == "cache_scope"
