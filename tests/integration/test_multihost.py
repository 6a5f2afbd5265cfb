"""The stack spread over five "hosts" (network namespaces on a bridge), and one talker's link cut.

thinker, talker-a, talker-b, code2wav and the gateway each run in their own namespace with their own
address; the test talks to the gateway from the root namespace. Cutting a talker's link mid-request
must move that request to the surviving talker once keepalive finds the link dead (no hang, no
error: gateway/serving/resume.py), send new requests to the surviving talker, and bring the cut
talker back into rotation once the link is restored.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from omnistream.cli.launcher import start_services
from omnistream.service.server import keepalive_ms
from tests.procs import wait_until

from .conftest import metric, stage_args
from .netns import Network, netns_unavailable, network_of

STAGE_PORT = 50051
METRICS_PORT = 9100
HTTP_PORT = 8000
# A dead peer must be found by gRPC keepalive (omnistream.service.server), at the latest a ping
# interval and a ping timeout after the cut (the deployment's own: 30 s), long before the request's
# own 90 s timeout; the rest is room for a loaded machine's timers, event loops and threads.
DETECTION_BOUND_S = sum(keepalive_ms()) / 1000 + 15.0

SHORT = {
    "messages": [{"role": "user", "content": "Hello across hosts"}],
    "max_tokens": 6,
    "modalities": ["text", "audio"],
    "max_audio_frames": 8,
    "talker_temperature": 0,
    # The same answer every time: its audio is asserted, and what the talker says follows the text.
    "seed": 11,
}
LONG = {
    "messages": [{"role": "user", "content": "Tell me a very long story."}],
    "max_tokens": 2000,
    "ignore_eos": True,
    "modalities": ["text", "audio"],
    "max_audio_frames": 2000,
    "talker_temperature": 0,
    "initial_codec_chunk_frames": 2,
    "stream": True,
    "timeout": 90,
}

_reason = netns_unavailable()
pytestmark = pytest.mark.skipif(_reason is not None, reason=f"network namespaces unavailable: {_reason}")


@pytest.fixture
def network():
    with network_of("thinker", "talker-a", "talker-b", "code2wav", "gateway") as net:
        yield net


@pytest.fixture
def stack(network, tiny_model_dir):
    nodes = network.nodes
    specs, wrappers = {}, {}
    for name in ("thinker", "talker-a", "talker-b", "code2wav"):
        host = nodes[name].address
        specs[name] = stage_args(
            name.split("-")[0],
            tiny_model_dir,
            *("--host", host, "--port", str(STAGE_PORT)),
            *("--metrics-host", host, "--metrics-port", str(METRICS_PORT)),
            *("--dtype", "float32"),
        )
        wrappers[name] = nodes[name].wrap()
    services = {}
    try:
        services.update(start_services(specs, wrappers=wrappers))
        gateway = ["serve", "gateway", "--host", nodes["gateway"].address]
        gateway += ["--http-port", str(HTTP_PORT), "--grpc-port", str(STAGE_PORT)]
        for name, service in services.items():
            gateway += [f"--{name.split('-')[0]}", service.address]
        services.update(start_services({"gateway": gateway}, wrappers={"gateway": nodes["gateway"].wrap()}))
        yield services
    finally:
        for service in services.values():
            service.kill()


def test_network_is_removed_even_after_a_failure():
    net = Network()
    with pytest.raises(RuntimeError, match="boom"):
        try:
            net.start()
            node = net.add_node("probe")
            assert node.netns in net.leftovers()
            raise RuntimeError("boom")
        finally:
            net.close()
    assert net.leftovers() == []


def _ready(base: str) -> tuple[int, dict]:
    try:
        reply = httpx.get(f"{base}/ready", timeout=30)
    except httpx.TransportError as exc:  # unreached or slow under load: `wait_until`'s "not yet"
        raise OSError(f"GET {base}/ready: {exc!r}") from exc
    return reply.status_code, reply.json()


def _talkers(base: str) -> dict[str, dict]:
    return {r["address"]: r for r in _ready(base)[1]["stages"]["talker"]}


def _requests(service) -> float:
    """The streams the stage admitted so far: one read, no poll to scrape again, so a busy stage on a
    loaded machine gets time to answer."""
    return metric(service, "omnistream_stage_requests_total", timeout=60)


def _resumed(base: str) -> float:
    """The gateway's talker requests moved to a sibling so far."""
    lines = httpx.get(f"{base}/metrics", timeout=30).text.splitlines()
    moved = [line for line in lines if line.startswith("omnistream_gateway_resumes_total{")]
    return sum(float(line.split()[-1]) for line in moved if 'outcome="resumed"' in line)


def _post_short(base: str) -> httpx.Response:
    return httpx.post(f"{base}/v1/chat/completions", json=SHORT, timeout=60)


class _Stream(threading.Thread):
    """A long SSE request read in the background: notes when audio flows and how the stream ends."""

    def __init__(self, base: str) -> None:
        super().__init__(daemon=True)
        self.base = base
        self.audio_started = threading.Event()
        self.events: list[dict] = []
        self.error: BaseException | None = None
        self.status = 0
        self.ended_at = 0.0
        self.audio_at: list[float] = []  # when each audio delta came (time.monotonic)
        self.leave = threading.Event()  # the client goes: the stream is closed at its next event

    def run(self) -> None:
        try:
            url = f"{self.base}/v1/chat/completions"
            with httpx.stream("POST", url, json=LONG, timeout=120) as reply:
                self.status = reply.status_code
                for line in reply.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    event = json.loads(line[6:])
                    self.events.append(event)
                    if "choices" in event and event["choices"][0]["delta"].get("audio", {}).get("data"):
                        self.audio_at.append(time.monotonic())
                        self.audio_started.set()
                    if self.leave.is_set():
                        break
        except BaseException as exc:  # a connection-level failure is an acceptable "clear error" too
            self.error = exc
        finally:
            self.ended_at = time.monotonic()
            self.audio_started.set()


@pytest.mark.timeout(300)
def test_requests_cross_hosts_and_survive_a_cut_link(network, stack):
    base = f"http://{network.nodes['gateway'].address}:{HTTP_PORT}"
    talker_a, talker_b = stack["talker-a"], stack["talker-b"]
    assert talker_a.address == f"{network.nodes['talker-a'].address}:{STAGE_PORT}"

    # (1) end to end across the hosts, both talkers used: once both are in rotation (a health check
    # the gateway's start saw time out on a loaded machine leaves one out until a later round), the
    # least-served one takes each request
    assert wait_until(lambda: all(r["in_rotation"] for r in _talkers(base).values()), 60), _talkers(base)
    for _ in range(4):
        reply = _post_short(base)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["audio"]["data"]
    assert all(r["served"] >= 1 for r in _talkers(base).values()), _talkers(base)

    # (2) a long stream is running on one talker; cut that talker's link
    stream = _Stream(base)
    stream.start()
    assert stream.audio_started.wait(60) and stream.error is None, (stream.error, stream.events[-1:])
    busy = [address for address, r in _talkers(base).items() if r["inflight"] == 1]
    assert len(busy) == 1, _talkers(base)
    cut, survivor = (talker_a, talker_b) if busy[0] == talker_a.address else (talker_b, talker_a)
    cut_node = "talker-a" if cut is talker_a else "talker-b"
    network.cut(cut_node)
    # Keepalive finds the link dead and the request goes on at the survivor, which makes its audio
    # again from the start (the gateway passes on only what comes after what the client has).
    assert wait_until(lambda: _resumed(base) == 1, DETECTION_BOUND_S), (
        f"the request was not moved within {DETECTION_BOUND_S:.0f}s of the cut"
    )
    moved_at = time.monotonic()
    assert wait_until(lambda: stream.audio_at[-1] > moved_at, 60), "no audio after the move"
    assert stream.is_alive() and stream.error is None, stream.error
    assert not [e for e in stream.events if "error" in e], stream.events[-1]
    stream.leave.set()
    stream.join(30)
    assert not stream.is_alive(), "the stream did not close"

    # (3) new requests go to the surviving talker while the link is down
    assert wait_until(lambda: not _talkers(base)[cut.address]["healthy"], 60), _talkers(base)
    assert _ready(base)[0] == 200
    before = _requests(survivor)
    served_cut = _talkers(base)[cut.address]["served"]
    for _ in range(3):
        reply = _post_short(base)
        assert reply.status_code == 200, reply.text
    assert _requests(survivor) >= before + 3
    assert _talkers(base)[cut.address]["served"] == served_cut

    # (4) the link comes back: the talker is in rotation again and gets requests again (in rotation,
    # not only healthy: it is healthy a moment before the round that read its Info accepts it, and a
    # request in that moment goes to the survivor)
    network.restore(cut_node)
    assert wait_until(lambda: _talkers(base)[cut.address]["in_rotation"], 60), _talkers(base)
    before = _requests(cut)
    for _ in range(2):
        reply = _post_short(base)
        assert reply.status_code == 200, reply.text
    assert _requests(cut) >= before + 1
