"""Replica discovery: static addresses stay, DNS names are looked up periodically (a fake resolver
here, no real DNS and no RPC: health checks are stubbed)."""

from __future__ import annotations

import asyncio
import socket

import grpc
import pytest

from gateway.cluster import health
from gateway.cluster import replicas as replicas_module
from gateway.cluster.discovery import Target, resolve_addresses
from gateway.cluster.replicas import Replicas
from omnistream.proto.omni.v1 import stage_pb2
from omnistream.request.errors import Unavailable
from tests.unit.gateway.infos import stage_info


class FakeResolver:
    """Answers from a table that the test changes; counts look-ups."""

    def __init__(self, answers: dict[str, list[str] | BaseException]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append((host, port))
        answer = self.answers[host]
        if isinstance(answer, BaseException):
            raise answer
        return [f"{ip}:{port}" for ip in answer]


@pytest.fixture
def checked(monkeypatch):
    """Health checks succeed without any RPC; the list records which replicas were checked."""
    seen: list[str] = []

    async def check(replica, info_timeout) -> None:
        seen.append(replica.address)
        replica.healthy = True
        replica.info = stage_info(replica.stage)

    monkeypatch.setattr(health, "check", check)
    return seen


def addresses(replicas: Replicas, stage: str) -> set[str]:
    return {r["address"] for r in replicas.snapshot()[stage]}


@pytest.mark.parametrize(
    ("entry", "host", "port", "dynamic"),
    [
        ("10.0.0.7:50051", "10.0.0.7", 50051, False),
        ("[fd00::7]:50051", "fd00::7", 50051, False),
        ("talker:50051", "talker", 50051, True),
        ("localhost:7002", "localhost", 7002, True),
        (
            "dns:///talker.omnistream.svc.cluster.local:50051",
            "talker.omnistream.svc.cluster.local",
            50051,
            True,
        ),
        ("dns://10.96.0.10/talker:50051", "talker", 50051, True),
        ("unix:/run/talker.sock", "unix:/run/talker.sock", 0, False),
    ],
)
def test_entries_parse(entry, host, port, dynamic):
    target = Target.parse("talker", entry)
    assert (target.host, target.port, target.dynamic) == (host, port, dynamic)


@pytest.mark.parametrize("entry", ["talker", "talker:", "talker:http", "dns:///10.0.0.7:50051", ":50051"])
def test_bad_entries_are_refused(entry):
    with pytest.raises(ValueError):
        Target.parse("talker", entry)


async def test_static_entries_need_no_lookup(checked):
    resolver = FakeResolver({})
    replicas = Replicas(
        {"thinker": ["127.0.0.1:7001"], "talker": ["127.0.0.1:7002", "[::1]:7012"], "code2wav": []},
        1024,
        resolver=resolver,
    )
    await replicas.discover()
    assert resolver.calls == []
    assert addresses(replicas, "talker") == {"127.0.0.1:7002", "[::1]:7012"}
    await replicas.stop()


async def test_refresh_adds_new_and_removes_vanished_addresses(checked):
    resolver = FakeResolver({"talker.svc": ["127.0.0.11", "127.0.0.12"]})
    replicas = Replicas(
        {"thinker": ["127.0.0.1:7001"], "talker": ["127.0.0.1:7002", "dns:///talker.svc:50051"]},
        1024,
        resolver=resolver,
    )
    assert addresses(replicas, "talker") == {"127.0.0.1:7002"}  # DNS entries wait for discover()
    await replicas.discover()
    assert addresses(replicas, "talker") == {"127.0.0.1:7002", "127.0.0.11:50051", "127.0.0.12:50051"}
    assert sorted(checked) == ["127.0.0.11:50051", "127.0.0.12:50051"]  # new ones checked at once
    assert replicas.pick("talker").healthy

    # scale up: one more pod
    resolver.answers["talker.svc"] = ["127.0.0.11", "127.0.0.12", "127.0.0.13"]
    checked.clear()
    await replicas.discover()
    assert "127.0.0.13:50051" in addresses(replicas, "talker")
    assert checked == ["127.0.0.13:50051"]

    # scale down: a pod went away; the static replica is never touched
    resolver.answers["talker.svc"] = ["127.0.0.13"]
    await replicas.discover()
    assert addresses(replicas, "talker") == {"127.0.0.1:7002", "127.0.0.13:50051"}

    # a failed look-up keeps what is known
    resolver.answers["talker.svc"] = socket.gaierror(socket.EAI_AGAIN, "temporary failure")
    await replicas.discover()
    assert addresses(replicas, "talker") == {"127.0.0.1:7002", "127.0.0.13:50051"}

    # no pod left at all
    resolver.answers["talker.svc"] = []
    await replicas.discover()
    assert addresses(replicas, "talker") == {"127.0.0.1:7002"}
    await replicas.stop()


async def test_an_address_found_twice_is_one_replica(checked):
    resolver = FakeResolver({"a.svc": ["127.0.0.21"], "b.svc": ["127.0.0.21", "127.0.0.22"]})
    replicas = Replicas(
        {"code2wav": ["127.0.0.21:9000", "a.svc:9000", "b.svc:9000"]}, 1024, resolver=resolver
    )
    await replicas.discover()
    assert addresses(replicas, "code2wav") == {"127.0.0.21:9000", "127.0.0.22:9000"}
    resolver.answers["b.svc"] = []
    await replicas.discover()  # b.svc only owned .22; the static .21 stays
    assert addresses(replicas, "code2wav") == {"127.0.0.21:9000"}
    await replicas.stop()


async def test_no_address_means_unavailable_not_a_crash(checked):
    replicas = Replicas({"talker": ["talker.svc:50051"]}, 1024, resolver=FakeResolver({"talker.svc": []}))
    await replicas.start()
    assert not replicas.ready
    with pytest.raises(Unavailable):
        replicas.pick("talker")
    await replicas.stop()


async def test_scaling_is_seen_periodically_without_restart(checked):
    resolver = FakeResolver({"talker.svc": ["127.0.0.31"]})
    replicas = Replicas(
        {"thinker": ["127.0.0.1:7001"], "talker": ["talker.svc:50051"], "code2wav": ["127.0.0.1:7003"]},
        1024,
        check_interval=0.05,
        discovery_interval=0.05,
        resolver=resolver,
    )
    await replicas.start()
    try:
        assert replicas.ready and addresses(replicas, "talker") == {"127.0.0.31:50051"}
        resolver.answers["talker.svc"] = ["127.0.0.31", "127.0.0.32"]
        for _ in range(100):
            if len(addresses(replicas, "talker")) == 2:
                break
            await asyncio.sleep(0.02)
        assert addresses(replicas, "talker") == {"127.0.0.31:50051", "127.0.0.32:50051"}
        assert len(resolver.calls) >= 2
    finally:
        await replicas.stop()


async def test_tls_names_the_certificate_to_expect(checked, monkeypatch):
    opened: dict[str, str | None] = {}
    real_open = replicas_module.open_channel

    def spy(address, credentials, options=(), server_name=None):
        opened[address] = server_name
        return real_open(address, None, options)

    monkeypatch.setattr(replicas_module, "open_channel", spy)
    resolver = FakeResolver({"talker.omni.svc": ["127.0.0.41"]})
    replicas = Replicas(
        {"talker": ["127.0.0.1:7002", "dns:///talker.omni.svc:50051"]}, 1024, resolver=resolver
    )
    await replicas.discover()
    # a static IP is checked against its own address; a discovered one against the DNS name it came from
    assert opened == {"127.0.0.1:7002": None, "127.0.0.41:50051": "talker.omni.svc"}
    await replicas.stop()
    opened.clear()
    pinned = Replicas(
        {"talker": ["127.0.0.1:7002", "talker.omni.svc:50051"]}, 1024, server_name="stages", resolver=resolver
    )
    await pinned.discover()
    assert set(opened.values()) == {"stages"}
    await pinned.stop()


async def test_resolve_prefers_one_family_and_treats_unknown_names_as_empty(monkeypatch):
    loop = asyncio.get_running_loop()
    answers: dict[str, object] = {
        "dual": [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::1", 80, 0, 0)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.2", 80)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", 80)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", 80)),
        ],
        "v6": [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::1", 80, 0, 0))],
        "gone": socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
        "flaky": socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"),
    }

    async def fake_getaddrinfo(host, port, **kwargs):
        answer = answers[host]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    monkeypatch.setattr(loop, "getaddrinfo", fake_getaddrinfo)
    assert await resolve_addresses("dual", 80) == ["10.0.0.1:80", "10.0.0.2:80"]
    assert await resolve_addresses("v6", 80) == ["[fd00::1]:80"]
    assert await resolve_addresses("gone", 80) == []
    with pytest.raises(OSError):
        await resolve_addresses("flaky", 80)


async def test_a_replica_that_disagrees_stays_out_until_the_deployment_it_disagrees_with_is_gone(
    monkeypatch,
):
    """Infos are judged in pipeline and configuration order; a refusal shows in the snapshot, and
    once every accepted replica of the stage has gone the next one defines the stage again."""
    other_voices = {"127.0.0.12:50051"}

    async def check(replica, info_timeout) -> None:
        replica.healthy = True
        voices = ["vivian"] if replica.address in other_voices else ["aiden", "chelsie", "ethan"]
        replica.info = stage_info(replica.stage, **({"voices": voices} if replica.stage == "talker" else {}))

    monkeypatch.setattr(health, "check", check)
    resolver = FakeResolver({"talker.svc": ["127.0.0.11", "127.0.0.12"]})
    replicas = Replicas(
        {
            "thinker": ["127.0.0.1:7001"],
            "talker": ["dns:///talker.svc:50051"],
            "code2wav": ["127.0.0.1:7003"],
        },
        1024,
        resolver=resolver,
    )
    await replicas.start()
    try:
        talkers = {r["address"]: r for r in replicas.snapshot()["talker"]}
        assert talkers["127.0.0.11:50051"]["in_rotation"] and talkers["127.0.0.11:50051"]["refused"] is None
        refused = talkers["127.0.0.12:50051"]
        assert refused["healthy"] and not refused["in_rotation"] and "voices ['vivian']" in refused["refused"]
        assert replicas.ready
        assert {replicas.pick("talker").address for _ in range(4)} == {"127.0.0.11:50051"}

        resolver.answers["talker.svc"] = ["127.0.0.12"]  # the agreeing talker is gone
        await replicas.discover()
        assert replicas.deployment.voices is None
        await replicas.check_all()
        assert replicas.pick("talker").address == "127.0.0.12:50051"
        assert replicas.deployment.voices == ("vivian",)
    finally:
        await replicas.stop()


ALL_MEDIA = ["text", "audio", "image", "video"]


async def test_thinkers_taking_different_media_share_a_deployment_and_media_go_to_one_that_takes_them(
    monkeypatch,
):
    """A transformers thinker (text and media) beside a vLLM one (text only): both join, the
    deployment takes what they take between them, text goes to either (least loaded), media only
    to the one that takes it, and with it gone media gets 503 naming what is missing."""
    media_thinker = "127.0.0.1:7001"

    async def check(replica, info_timeout) -> None:
        replica.healthy = True
        taken = ALL_MEDIA if replica.address == media_thinker else ["text"]
        extra = {"input_modalities": taken} if replica.stage == "thinker" else {}
        replica.info = stage_info(replica.stage, **extra)

    monkeypatch.setattr(health, "check", check)
    replicas = Replicas(
        {
            "thinker": [media_thinker, "127.0.0.1:7011"],
            "talker": ["127.0.0.1:7002"],
            "code2wav": ["127.0.0.1:7003"],
        },
        1024,
    )
    await replicas.start()
    try:
        thinkers = {r["address"]: r for r in replicas.snapshot()["thinker"]}
        assert all(t["in_rotation"] and t["refused"] is None for t in thinkers.values())
        assert replicas.deployment.input_modalities == tuple(ALL_MEDIA)
        assert list(replicas.deployment.to_proto().input_modalities) == ALL_MEDIA

        texts = set()
        for _ in range(4):  # least loaded: text alternates between the two
            replica = replicas.pick("thinker")
            replica.served += 1
            texts.add(replica.address)
        assert texts == {media_thinker, "127.0.0.1:7011"}
        for kinds in ({"image"}, {"audio", "video"}):
            assert replicas.pick("thinker", frozenset(kinds)).address == media_thinker

        replicas.sets["thinker"].replicas[0].healthy = False  # the media thinker is down
        assert replicas.deployment.input_modalities == ("text",)
        assert replicas.pick("thinker").address == "127.0.0.1:7011"
        with pytest.raises(Unavailable, match="no healthy thinker replica takes image input now"):
            replicas.pick("thinker", frozenset({"image"}))
    finally:
        await replicas.stop()


async def test_the_deployments_context_is_the_smallest_thinker_in_rotation(monkeypatch):
    """A request may go to any thinker in rotation: a conversation fills the smallest context."""
    lengths = {"127.0.0.1:7001": 8192, "127.0.0.1:7011": 4096}

    async def check(replica, info_timeout) -> None:
        replica.healthy = True
        limits = stage_pb2.StageLimits(max_batch=8, max_model_len=lengths.get(replica.address, 0))
        replica.info = stage_info(replica.stage, limits=limits)

    monkeypatch.setattr(health, "check", check)
    replicas = Replicas({"thinker": list(lengths), "talker": ["127.0.0.1:7002"]}, 1024)
    await replicas.start()
    try:
        assert replicas.deployment.max_model_len == 4096
        replicas.sets["thinker"].replicas[1].healthy = False  # the shorter one is down
        assert replicas.deployment.max_model_len == 8192
    finally:
        await replicas.stop()


async def test_a_released_cache_scope_reaches_every_healthy_thinker_and_talker(checked):
    """Best effort: one replica that fails to answer neither stops the others nor raises."""
    replicas = Replicas(
        {
            "thinker": ["127.0.0.1:7001", "127.0.0.1:7011"],
            "talker": ["127.0.0.1:7002"],
            "code2wav": ["127.0.0.1:7003"],
        },
        1024,
    )
    await replicas.start()
    told: list[tuple[str, bytes]] = []

    class Stub:
        def __init__(self, address: str, fails: bool) -> None:
            self.address, self.fails = address, fails

        async def ReleaseCache(self, request, timeout):
            told.append((self.address, request.cache_scope))
            if self.fails:
                raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, "down")
            return stage_pb2.ReleaseCacheReply()

    try:
        for replica in (r for s in replicas.sets.values() for r in s.replicas):
            replica.stub = Stub(replica.address, fails=replica.address == "127.0.0.1:7001")
        replicas.sets["talker"].replicas[0].healthy = True
        await replicas.release_cache(b"session-secret")
        assert sorted(told) == [
            ("127.0.0.1:7001", b"session-secret"),
            ("127.0.0.1:7002", b"session-secret"),
            ("127.0.0.1:7011", b"session-secret"),
        ]  # not code2wav, which caches nothing
    finally:
        await replicas.stop()
