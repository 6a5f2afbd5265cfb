"""Readiness per need: text needs a thinker, audio every stage; refusals name what is missing."""

from __future__ import annotations

import pytest

from gateway.cluster.readiness import Readiness
from gateway.config import GatewayConfig
from omnistream.request.errors import Unavailable


def of(*up: str) -> Readiness:
    return Readiness.of(lambda stage: stage in up)


def test_everything_up_serves_both_kinds():
    readiness = of("thinker", "talker", "code2wav")
    assert readiness.ready and readiness.serves == {"text": True, "audio": True}
    assert readiness.body()["missing"] == {}
    readiness.require(audio=True)
    readiness.require(audio=False)


def test_a_thinker_alone_serves_text_and_refuses_audio_naming_the_stages():
    readiness = of("thinker")
    assert readiness.ready and readiness.serves == {"text": True, "audio": False}
    readiness.require(audio=False)
    with pytest.raises(Unavailable) as refused:
        readiness.require(audio=True)
    assert refused.value.message.startswith("no talker or code2wav replica is ready")


def test_a_missing_code2wav_is_named_alone():
    with pytest.raises(Unavailable, match=r"^no code2wav replica is ready"):
        of("thinker", "talker").require(audio=True)


def test_without_a_thinker_nothing_is_served():
    readiness = of("talker", "code2wav")
    assert not readiness.ready and readiness.serves == {"text": False, "audio": False}
    assert readiness.body() == {
        "ready": False,
        "serves": {"text": False, "audio": False},
        "missing": {"text": ["thinker"], "audio": ["thinker"]},
    }
    with pytest.raises(Unavailable, match=r"^no thinker replica is ready"):
        readiness.require(audio=False)


def test_a_gateway_may_be_configured_with_thinkers_only():
    GatewayConfig(thinker=["127.0.0.1:1"]).validate()
    with pytest.raises(ValueError, match="no thinker replica configured"):
        GatewayConfig(talker=["127.0.0.1:2"], code2wav=["127.0.0.1:3"]).validate()
    with pytest.raises(ValueError, match="no code2wav replica configured"):
        GatewayConfig(thinker=["127.0.0.1:1"], talker=["127.0.0.1:2"]).validate()
