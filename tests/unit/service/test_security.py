"""TLS credential helpers, the API key on both public faces, and the config that carries them
(no processes: the REST app runs in-process, the gRPC check on a loopback grpc.aio server)."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import grpc
import pytest
from fastapi.testclient import TestClient
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.api.app import build_app
from gateway.cluster.readiness import Readiness
from gateway.config import GatewayConfig
from gateway.main import config_from_args
from gateway.main_args import add_arguments
from gateway.serving.metrics import GatewayMetrics
from omnistream.request.errors import STATUS_TABLE, Unauthenticated, from_grpc, status_of
from omnistream.service.security import (
    ApiKeyInterceptor,
    bearer_matches,
    channel_credentials,
    server_credentials,
)
from omnistream.service.server import (
    ERROR_KIND_METADATA_KEY,
    add_health_and_reflection,
    build_server,
    set_serving,
)
from tests.certs import make_pki
from tests.unit.gateway.infos import deployment

KEY = "s3cret-key"


def test_unauthenticated_is_401_and_unauthenticated():
    status = status_of(Unauthenticated("no key"))
    assert (status.grpc_code, status.http_status) == (grpc.StatusCode.UNAUTHENTICATED, 401)
    assert STATUS_TABLE["unauthenticated"] == status
    assert isinstance(from_grpc(grpc.StatusCode.UNAUTHENTICATED, "x"), Unauthenticated)


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        (f"Bearer {KEY}", True),
        (f"bearer {KEY}", True),
        (f"  Bearer   {KEY} ", True),
        (KEY, False),
        (f"Basic {KEY}", False),
        ("Bearer", False),
        (f"Bearer {KEY}x", False),
        (None, False),
        ("", False),
    ],
)
def test_bearer_matches(header, ok):
    assert bearer_matches(header, KEY) is ok


def test_plaintext_unless_certificates_are_given(tmp_path):
    assert server_credentials(None, None) is None
    assert channel_credentials() is None
    with pytest.raises(ValueError):
        server_credentials("cert.pem", None)
    with pytest.raises(ValueError):
        server_credentials(None, None, "ca.pem")  # mTLS without a server certificate
    with pytest.raises(ValueError):
        channel_credentials("ca.pem", "cert.pem", None)
    pki = make_pki(tmp_path)
    assert isinstance(server_credentials(pki.server_cert, pki.server_key, pki.ca), grpc.ServerCredentials)
    assert isinstance(channel_credentials(pki.ca, pki.client_cert, pki.client_key), grpc.ChannelCredentials)


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_gateway_flags_env_and_yaml(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNISTREAM_API_KEY", "from-env")
    args = _parse("--thinker", "t:1", "--talker", "dns:///k:2", "--code2wav", "c:3", "--tls-cert", "c.pem")
    config = config_from_args(args)
    assert config.api_key == "from-env" and config.tls_cert == "c.pem"
    assert "from-env" not in repr(config)  # the key stays out of logs
    assert config_from_args(_parse("--api-key", "flag")).api_key == "flag"
    monkeypatch.setenv("OMNISTREAM_API_KEY", "")
    assert config_from_args(_parse()).api_key is None

    path = tmp_path / "gateway.yaml"
    path.write_text(
        "stages: {thinker: [t:1], talker: ['dns:///talker:50051'], code2wav: [c:3]}\n"
        "discovery_interval: 2.5\ntls_cert: s.pem\ntls_key: s.key\ntls_client_ca: ca.pem\n"
        "stage_tls_ca: ca.pem\nstage_tls_cert: g.pem\nstage_tls_key: g.key\nstage_tls_server_name: stages\n"
        "api_key: from-yaml\n"
    )
    config = GatewayConfig.from_yaml(path)
    config.validate()
    assert config.discovery_interval == 2.5 and config.api_key == "from-yaml"
    assert (config.stage_tls_ca, config.stage_tls_server_name, config.tls_client_ca) == (
        "ca.pem",
        "stages",
        "ca.pem",
    )
    for bad in ({"tls_cert": "c.pem"}, {"tls_client_ca": "ca.pem"}, {"stage_tls_key": "k"}):
        with pytest.raises(ValueError):
            GatewayConfig(thinker=["a:1"], talker=["b:1"], code2wav=["c:1"], **bad).validate()


def _app(api_key: str | None) -> TestClient:
    config = GatewayConfig(thinker=["a:1"], talker=["b:1"], code2wav=["c:1"], api_key=api_key)
    core = SimpleNamespace(
        config=config,
        ready=True,
        readiness=Readiness.of(lambda stage: True),
        replicas=SimpleNamespace(snapshot=lambda: {}),
        metrics=GatewayMetrics(),
        deployment=deployment(),
    )
    return TestClient(build_app(core))


def test_rest_api_key_guards_v1_only():
    client = _app(KEY)
    refused = client.get("/v1/models")
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert refused.json() == {
        "error": {
            "message": refused.json()["error"]["message"],
            "type": "authentication_error",
            "param": None,
            "code": "unauthenticated",
        }
    }
    assert client.post("/v1/chat/completions", json={}).status_code == 401  # before validation
    assert client.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    for path in ("/health", "/ready", "/metrics"):
        assert client.get(path).status_code == 200, path
    assert _app(None).get("/v1/models").status_code == 200  # no key configured: open


async def test_grpc_api_key_guards_the_given_service_only():
    async def echo_handler(request: bytes, context) -> bytes:
        return request

    service = "omni.v1.Echo"
    server = build_server(1 << 20, 4, interceptors=[ApiKeyInterceptor(KEY, [f"/{service}/"])])
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                service, {"Say": grpc.unary_unary_rpc_method_handler(echo_handler)}
            ),
        )
    )
    health = add_health_and_reflection(server, [service])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await set_serving(health, True)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            say = channel.unary_unary(f"/{service}/Say")
            assert await say(b"hi", metadata=(("authorization", f"Bearer {KEY}"),)) == b"hi"
            for metadata in ((), (("authorization", "Bearer nope"),)):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await say(b"hi", metadata=metadata)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert (ERROR_KIND_METADATA_KEY, "unauthenticated") in tuple(
                    refused.value.trailing_metadata()
                )
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert reply.status == health_pb2.HealthCheckResponse.SERVING  # probes need no key
    finally:
        await server.stop(None)
