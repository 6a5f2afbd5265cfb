"""The REST face's input guards against a fake core: size limits, Unicode, error bodies, config.

The same cases through the real gateway and stages are in tests/integration/test_gateway_faults.py;
here each mechanism is pinned down on its own, without processes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace

import grpc
import pytest
from fastapi.testclient import TestClient

from gateway.api.app import build_app
from gateway.api.openai.request_guards import first_invalid_unicode, is_valid_unicode, printable
from gateway.cluster.deployment import Deployment
from gateway.cluster.readiness import Readiness
from gateway.config import STAGE_MESSAGE_HEADROOM, GatewayConfig
from gateway.serving.core import GatewayCore
from gateway.serving.metrics import GatewayMetrics
from gateway.serving.request_checks import check_prompt_size
from omnistream.pipeline import GenerationRequest
from omnistream.request.errors import STATUS_TABLE, TooLarge, Unavailable
from tests.unit.gateway.infos import deployment

STAGES = {"thinker": ["a:1"], "talker": ["b:1"], "code2wav": ["c:1"]}
MESSAGES = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"
JSON = {"Content-Type": "application/json"}


class FakeCore(GatewayCore):
    """The real `validate` (limits, prompt size) without replicas: `open` records what passed
    validation and then answers 503, so a test sees whether a request would have reached a stage."""

    def __init__(self, config: GatewayConfig, ready: bool | set[str] = True) -> None:
        self.config = config
        self.deployment = deployment()
        self.metrics = GatewayMetrics()
        self.replicas = SimpleNamespace(snapshot=lambda: {})
        self.opened: list[GenerationRequest] = []
        self._ready = ready

    @property
    def readiness(self) -> Readiness:
        """`ready`: every stage up (True), none (False), or the set of stages that are up."""
        up = self._ready
        return Readiness.of(lambda stage: up if isinstance(up, bool) else stage in up)

    async def open(self, request, request_id=None, timeout=None, trace=None):
        self.validate(request)
        self.opened.append(request)
        raise Unavailable("no stages in this test")


def make_client(ready: bool | set[str] = True, **limits) -> tuple[TestClient, FakeCore]:
    core = FakeCore(GatewayConfig(**STAGES, **limits), ready=ready)
    return TestClient(build_app(core), raise_server_exceptions=False), core


def error_of(reply) -> dict:
    error = reply.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    return error


# --- Unicode -----------------------------------------------------------------------------------------
def test_first_invalid_unicode_finds_values_and_keys_at_any_depth():
    assert first_invalid_unicode({"a": ["ok", {"b": "é 中 🎵"}]}) is None
    assert first_invalid_unicode({"a": ["ok", {"b": "x\ud800"}]}) == ("a", 1, "b")
    assert first_invalid_unicode({"a": {"k\udc00": 1}}) == ("a", "k\udc00")
    assert first_invalid_unicode("\ud83d") == ()


def test_first_invalid_unicode_walks_deep_nesting_without_recursion():
    deep: list = ["\ud800"]
    for _ in range(100_000):
        deep = [deep]
    assert first_invalid_unicode(deep) == (0,) * 100_001


def test_printable_escapes_only_what_utf8_cannot_carry():
    assert printable("é 🎵") == "é 🎵" and is_valid_unicode("é 🎵")
    assert printable("a\ud800b") == "a\\ud800b" and not is_valid_unicode("a\ud800b")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "a\ud800"}]}, "messages.0.content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
            "messages.0.content.0.text",
        ),
        ({"messages": MESSAGES, "model": "\ud800", "stream": True}, "model"),
        ({"messages": MESSAGES, "\ud800": 1}, "\\ud800"),
    ],
)
def test_lone_surrogates_are_422_with_an_encodable_body(body, param):
    client, core = make_client()
    reply = client.post(CHAT, content=json.dumps(body).encode(), headers=JSON)
    assert reply.status_code == 422
    reply.content.decode("utf-8")  # strict: the body itself is valid UTF-8
    assert error_of(reply)["param"] == param
    assert core.opened == []


# --- size limits -------------------------------------------------------------------------------------
def test_body_over_the_limit_is_413_by_content_length():
    client, core = make_client(max_request_bytes=1000)
    reply = client.post(CHAT, content=json.dumps({"messages": [{"role": "user", "content": "x" * 2000}]}))
    assert reply.status_code == 413
    assert error_of(reply)["code"] == "request_too_large"
    assert core.opened == []


def test_chunked_body_is_counted_and_cut_at_the_limit():
    client, core = make_client(max_request_bytes=1000)
    read: list[int] = []

    def chunks() -> Iterator[bytes]:
        yield b'{"messages": [{"role": "user", "content": "'
        for i in range(100):
            read.append(i)
            yield b"x" * 100

    reply = client.post(CHAT, content=chunks(), headers=JSON)
    assert reply.status_code == 413 and error_of(reply)["code"] == "request_too_large"
    assert core.opened == []


def test_body_at_the_limit_passes():
    body = json.dumps({"messages": MESSAGES, "modalities": ["text"]}).encode()
    client, core = make_client(max_request_bytes=len(body))
    assert client.post(CHAT, content=body, headers=JSON).status_code == 503  # reached the core
    assert len(core.opened) == 1


def test_prompt_over_max_prompt_chars_is_413_naming_messages():
    client, core = make_client(max_prompt_chars=10)
    messages = [
        {"role": "system", "content": "x" * 6},
        {"role": "user", "content": [{"type": "text", "text": "y" * 5}]},
    ]
    reply = client.post(CHAT, json={"messages": messages, "modalities": ["text"]})
    assert reply.status_code == 413
    error = error_of(reply)
    assert error["param"] == "messages" and error["code"] == "request_too_large"
    assert core.opened == []
    reply = client.post(
        CHAT, json={"messages": [{"role": "user", "content": "x" * 10}], "modalities": ["text"]}
    )
    assert reply.status_code == 503 and len(core.opened) == 1  # exactly at the limit: accepted


def test_prompt_ids_count_against_max_prompt_chars():
    with pytest.raises(TooLarge) as info:
        check_prompt_size(GenerationRequest(prompt_ids=[1, 2, 3, 4]), 3)
    assert info.value.field == "prompt_ids"
    check_prompt_size(GenerationRequest(prompt_ids=[1, 2, 3]), 3)


def test_too_large_is_413_and_invalid_argument():
    status = STATUS_TABLE[TooLarge.kind]
    assert (status.http_status, status.grpc_code) == (413, grpc.StatusCode.INVALID_ARGUMENT)
    assert isinstance(TooLarge("x"), Exception) and TooLarge.kind == "request_too_large"


@pytest.mark.parametrize(
    "limits",
    [
        {"max_request_bytes": 0},
        {"max_prompt_chars": -1},
        {"max_request_bytes": 16 * 1024 * 1024},  # no room left for the rest of the stage message
        {"max_request_bytes": 1024 * 1024, "max_message_bytes": 1024 * 1024 + STAGE_MESSAGE_HEADROOM - 1},
        {"max_prompt_chars": 4_000_000},  # 5 bytes a unit: over 16 MiB
    ],
)
def test_config_refuses_limits_a_stage_message_cannot_carry(limits):
    with pytest.raises(ValueError):
        GatewayConfig(**STAGES, **limits).validate()


def test_default_limits_are_valid():
    GatewayConfig(**STAGES).validate()


# --- every error is JSON -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [("GET", "/nothing", 404, "not_found"), ("PUT", CHAT, 405, "method_not_allowed")],
)
def test_router_errors_are_openai_json(method, path, status, code):
    client, _ = make_client()
    reply = client.request(method, path)
    assert reply.status_code == status and error_of(reply)["code"] == code


def test_an_unexpected_exception_is_a_json_500_without_internals():
    client, _ = make_client()

    @client.app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret internals")

    reply = client.get("/boom")
    assert reply.status_code == 500
    error = error_of(reply)
    assert error["type"] == "server_error" and "secret" not in error["message"]


@pytest.mark.parametrize(
    ("content", "headers", "message"),
    [
        (b"{bad", JSON, "the request body is not valid JSON"),
        (b'{"messages": "\xff"}', JSON, "the request body is not valid UTF-8"),
        (b"[" * 100_000, JSON, "the request body is nested too deeply"),
        (b'{"seed": 1' + b"0" * 5000 + b"}", JSON, "the request body is not valid JSON: Exceeds the limit"),
        (b"[]", JSON, "the request body must be a JSON object"),
        (
            json.dumps({"messages": MESSAGES}).encode(),
            {"Content-Type": "text/plain"},
            "the request body must",
        ),
    ],
)
def test_unparsable_bodies_are_422_json(content, headers, message):
    client, core = make_client()
    reply = client.post(CHAT, content=content, headers=headers)
    assert reply.status_code == 422
    error = error_of(reply)
    assert error["message"].startswith(message) and error["param"] is None, error
    assert core.opened == []


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "messages.0.content.0.text",
        ),
        ({"stream": "yes"}, "stream"),
        ({"max_tokens": "12"}, "max_tokens"),
        ({"model": "m" * 257}, "model"),
        ({"codec_chunk_schedule": "doubling"}, "codec_chunk_schedule"),
        ({"codec_chunk_schedule": 2}, "codec_chunk_schedule"),
    ],
)
def test_wrong_types_name_the_field_without_union_tags(fields, param):
    client, _ = make_client()
    reply = client.post(CHAT, json={"messages": MESSAGES, **fields})
    assert reply.status_code == 422 and error_of(reply)["param"] == param


@pytest.mark.parametrize(("fields", "schedule"), [({}, "grow"), ({"codec_chunk_schedule": "fixed"}, "fixed")])
def test_the_codec_chunk_schedule_reaches_the_request(fields, schedule):
    client, core = make_client()
    reply = client.post(CHAT, json={"messages": MESSAGES, **fields})
    assert reply.status_code == 503  # the fake core's answer, after validation
    assert [r.codec_chunk_schedule for r in core.opened] == [schedule]


def test_not_ready_is_503_json_on_ready_and_on_the_api():
    client, _ = make_client(ready=False)
    ready = client.get("/ready")
    assert ready.status_code == 503 and ready.json()["ready"] is False
    assert error_of(ready)["code"] == "unavailable"
    reply = client.post(CHAT, json={"messages": MESSAGES})
    assert reply.status_code == 503 and error_of(reply)["type"] == "service_unavailable"


def test_ready_reports_what_each_kind_of_request_needs():
    client, _ = make_client(ready={"thinker"})
    ready = client.get("/ready")
    assert ready.status_code == 200  # text can be served
    assert ready.json()["serves"] == {"text": True, "audio": False}
    assert ready.json()["missing"] == {"audio": ["talker", "code2wav"]}
    client, _ = make_client(ready={"talker", "code2wav"})
    ready = client.get("/ready")
    assert ready.status_code == 503 and ready.json()["serves"] == {"text": False, "audio": False}
    assert ready.json()["missing"] == {"text": ["thinker"], "audio": ["thinker"]}
    assert "thinker" in error_of(ready)["message"]


def test_models_lists_what_the_stages_said_and_nothing_before():
    client, core = make_client()
    (model,) = client.get("/v1/models").json()["data"]
    assert {k: model[k] for k in ("id", "object", "created", "owned_by")} == {
        "id": "qwen3-omni",
        "object": "model",
        "created": 0,
        "owned_by": "omnistream",
    }
    assert model["omnistream"]["voices"] == ["aiden", "chelsie", "ethan"]
    core.deployment = Deployment()
    assert client.get("/v1/models").json() == {"object": "list", "data": []}
