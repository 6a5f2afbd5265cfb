"""The consistency rule: which replica infos may join a deployment (pure functions, no RPC)."""

from __future__ import annotations

import pytest

from gateway.cluster.deployment import Deployment, refusal
from omnistream.proto.omni.v1 import stage_pb2
from tests.unit.gateway.infos import VOICES, deployment, stage_info


def test_replicas_that_agree_join_even_with_other_limits_and_release():
    d = deployment()
    bigger = stage_info(
        "talker", software_version="0.2.0", limits=stage_pb2.StageLimits(max_batch=64, max_requests=256)
    )
    assert d.admit("talker", bigger) is None
    assert d.accepted["talker"].limits.max_batch == 8  # the first accepted stays the deployment's


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model_id", "other-model"),
        ("family", "qwen2_5_omni"),
        ("chunk_protocol_version", 2),
        ("voices", ["ethan"]),
        ("codebooks", 8),
        ("frames_per_second", 25.0),
    ],
)
def test_a_talker_that_differs_on_what_matters_is_refused_naming_it(field, value):
    reason = deployment().admit("talker", stage_info("talker", **{field: value}))
    assert reason is not None and field in reason and repr(value) in reason


def test_a_code2wav_with_another_sample_rate_is_refused():
    reason = deployment().admit("code2wav", stage_info("code2wav", sample_rate=16000))
    assert reason is not None and "sample_rate 16000 (deployment: 24000)" in reason


def test_stages_are_checked_against_each_other_before_any_replica_of_their_own():
    d = Deployment()
    assert d.admit("thinker", stage_info("thinker")) is None
    reason = d.admit("talker", stage_info("talker", model_id="other"))
    assert reason is not None and "of the thinker" in reason
    assert "talker" not in d.accepted  # a refused info never becomes the deployment's
    assert d.admit("talker", stage_info("talker")) is None
    reason = d.admit("code2wav", stage_info("code2wav", codebooks=8))
    assert reason is not None and "codebooks 8 (deployment: 16) of the talker" in reason


def test_the_thinker_and_code2wav_share_no_codec_facts():
    """Only the talker and code2wav compare codebooks: the thinker leaves them empty."""
    d = Deployment()
    assert d.admit("code2wav", stage_info("code2wav")) is None
    assert d.admit("thinker", stage_info("thinker")) is None


def test_an_answer_from_the_wrong_service_is_refused():
    assert "not a talker" in refusal("talker", stage_info("code2wav"), {})


def test_forgetting_a_stage_lets_the_next_replica_define_it():
    d = deployment()
    other_voices = stage_info("talker", voices=["vivian"])
    assert d.admit("talker", other_voices) is not None
    d.forget("talker")
    assert d.admit("talker", other_voices) is None
    assert d.voices == ("vivian",)


def test_what_the_gateway_reports_comes_from_the_stages():
    d = Deployment()
    assert d.model_card() is None and d.voices is None and d.sample_rate is None
    d = deployment()
    card = d.model_card()
    assert card is not None
    assert (card["id"], card["object"], card["owned_by"]) == ("qwen3-omni", "model", "omnistream")
    assert card["omnistream"]["voices"] == list(VOICES) and card["omnistream"]["sample_rate"] == 24000
    info = d.to_proto()
    assert (info.model_id, info.family, info.sample_rate, info.frames_per_second) == (
        "qwen3-omni",
        "qwen3_omni",
        24000,
        12.5,
    )
    assert list(info.input_modalities) == ["text"] and list(info.output_modalities) == ["text", "audio"]
    assert [s.stage for s in info.stages] == [1, 2, 3]


def test_the_context_is_the_thinkers_max_model_len():
    """What a realtime conversation may fill; unknown before a thinker that reports one."""
    assert Deployment().max_model_len is None
    assert deployment().max_model_len is None  # a stage too old to report it
    d = Deployment()
    limits = stage_pb2.StageLimits(max_batch=8, max_model_len=8192)
    assert d.admit("thinker", stage_info("thinker", limits=limits)) is None
    assert d.max_model_len == 8192
    d.thinker_max_model_len = lambda: 4096  # the thinkers in rotation (Replicas sets it)
    assert d.max_model_len == 4096


def test_the_default_voice_is_the_talkers():
    """What a request that names no voice speaks: the talker's Info says (ethan on Qwen3-Omni)."""
    assert Deployment().default_voice is None and deployment().default_voice == "ethan"
    d = deployment()
    reason = d.admit("talker", stage_info("talker", default_voice="chelsie"))
    assert reason is not None and "default_voice 'chelsie' (deployment: 'ethan')" in reason
    # A talker older than the field reports none: it speaks its own default, so it may join.
    assert d.admit("talker", stage_info("talker", default_voice="")) is None
    assert deployment(default_voice="").default_voice is None  # such a talker accepted first
