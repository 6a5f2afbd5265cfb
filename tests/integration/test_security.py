"""TLS everywhere: stages that require client certificates (mTLS), a gateway that reaches them with
its own certificate, and public ports (REST and gRPC) with mTLS and an API key."""

from __future__ import annotations

import asyncio
import base64
import ssl

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2
from openai import OpenAI

from omnistream.cli import main as cli
from omnistream.cli.launcher import ClientTLS, check_health, start_services
from omnistream.client import Client, Unauthenticated, Unavailable
from omnistream.proto.omni.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from omnistream.service.security import channel_credentials
from tests.certs import make_pki

from .conftest import STAGES

API_KEY = "test-key-0123456789"
BODY = {
    "messages": [{"role": "user", "content": "Hello, securely"}],
    "max_tokens": 6,
    "modalities": ["text", "audio"],
    "max_audio_frames": 8,
    "talker_temperature": 0,
}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure_stack(pki, tiny_model_dir):
    client_tls = ClientTLS(pki.ca, pki.client_cert, pki.client_key)
    tls_server = ["--tls-cert", pki.server_cert, "--tls-key", pki.server_key, "--tls-client-ca", pki.ca]
    specs = {
        s: ["serve", s, "--model", tiny_model_dir, "--dtype", "float32", "--max-batch", "4", *tls_server]
        for s in STAGES
    }
    services = {}
    try:
        services.update(start_services(specs, tls=client_tls))
        gateway = ["serve", "gateway", "--http-port", "0", "--grpc-port", "0"]
        for stage in STAGES:
            gateway += [f"--{stage}", services[stage].address]
        gateway += ["--stage-tls-ca", pki.ca, "--stage-tls-cert", pki.client_cert]
        gateway += ["--stage-tls-key", pki.client_key, *tls_server]
        services.update(
            start_services({"gateway": gateway}, tls=client_tls, env={"OMNISTREAM_API_KEY": API_KEY})
        )
        yield services
    finally:
        for service in services.values():
            service.kill()


def _https(secure_stack) -> str:
    return f"https://127.0.0.1:{secure_stack['gateway'].http_port}"


def _tls(pki, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki.ca)
    if cert:
        context.load_cert_chain(cert, key)
    return context


def _client(pki) -> httpx.Client:
    return httpx.Client(verify=_tls(pki, pki.client_cert, pki.client_key), timeout=60)


def test_rest_over_mtls_needs_the_api_key(secure_stack, pki):
    url = f"{_https(secure_stack)}/v1/chat/completions"
    with _client(pki) as client:
        ok = client.post(url, json=BODY, headers={"Authorization": f"Bearer {API_KEY}"})
        assert ok.status_code == 200, ok.text
        assert base64.b64decode(ok.json()["choices"][0]["message"]["audio"]["data"])[:4] == b"RIFF"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
            refused = client.post(url, json=BODY, headers=headers)
            assert refused.status_code == 401, refused.text
            assert refused.headers["WWW-Authenticate"] == "Bearer"
            error = refused.json()["error"]
            assert error["code"] == "unauthenticated" and error["type"] == "authentication_error"
            assert set(error) == {"message", "type", "param", "code"}
        assert client.get(f"{_https(secure_stack)}/v1/models").status_code == 401
        # probes and metrics need no key
        for path in ("/health", "/ready", "/metrics"):
            assert client.get(f"{_https(secure_stack)}{path}").status_code == 200, path


def test_openai_sdk_streams_with_the_api_key(secure_stack, pki):
    with _client(pki) as http_client:
        sdk = OpenAI(base_url=f"{_https(secure_stack)}/v1", api_key=API_KEY, http_client=http_client)
        stream = sdk.chat.completions.create(
            model="qwen3-omni",
            messages=BODY["messages"],
            modalities=["text", "audio"],
            audio={"voice": "ethan", "format": "pcm16"},
            max_tokens=6,
            stream=True,
            extra_body={"max_audio_frames": 8, "talker_temperature": 0},
        )
        finish = [c.choices[0].finish_reason for c in stream if c.choices and c.choices[0].finish_reason]
    assert finish in (["stop"], ["length"])


def test_public_rest_port_refuses_plaintext_and_clients_without_a_certificate(secure_stack, pki):
    port = secure_stack["gateway"].http_port
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
    with pytest.raises(httpx.HTTPError):  # TLS, but no client certificate (mTLS)
        httpx.get(f"https://127.0.0.1:{port}/health", verify=_tls(pki), timeout=10)
    with pytest.raises(httpx.HTTPError):  # a client certificate from another CA
        other = _tls(pki, pki.other_client_cert, pki.other_client_key)
        httpx.get(f"https://127.0.0.1:{port}/health", verify=other, timeout=10)


def _generate(address: str, pki, metadata) -> tuple[grpc.StatusCode, list[str]]:
    async def run():
        credentials = channel_credentials(pki.ca, pki.client_cert, pki.client_key)
        async with grpc.aio.secure_channel(address, credentials) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            request = gateway_pb2.GenerateRequest(
                messages=[common_pb2.Message(**BODY["messages"][0])],
                max_tokens=6,
                max_audio_frames=8,
                talker_sampling=common_pb2.Sampling(temperature=0),
            )
            kinds = []
            try:
                async for event in stub.Generate(request, metadata=metadata, timeout=60):
                    kinds.append(event.WhichOneof("event"))
            except grpc.aio.AioRpcError as exc:
                return exc.code(), kinds
            return grpc.StatusCode.OK, kinds

    return asyncio.run(run())


def test_grpc_over_mtls_needs_the_api_key(secure_stack, pki):
    address = secure_stack["gateway"].address
    code, kinds = _generate(address, pki, (("authorization", f"Bearer {API_KEY}"),))
    assert code == grpc.StatusCode.OK and "audio" in kinds and kinds[-1] == "end"
    for metadata in ((), (("authorization", "Bearer nope"),)):
        code, kinds = _generate(address, pki, metadata)
        assert code == grpc.StatusCode.UNAUTHENTICATED and kinds == []
    # gRPC health stays open (probes carry no key), but only over mTLS
    tls = ClientTLS(pki.ca, pki.client_cert, pki.client_key)
    assert check_health(address, tls) == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError):
        check_health(address)


def test_stages_refuse_plaintext_and_unknown_clients(secure_stack, pki):
    for stage in STAGES:
        address = secure_stack[stage].address
        tls = ClientTLS(pki.ca, pki.client_cert, pki.client_key)
        assert check_health(address, tls) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as plaintext:
            check_health(address, timeout=5)
        assert plaintext.value.code() == grpc.StatusCode.UNAVAILABLE
        for tls in (ClientTLS(pki.ca), ClientTLS(pki.ca, pki.other_client_cert, pki.other_client_key)):
            with pytest.raises(grpc.RpcError):
                check_health(address, tls, timeout=5)


def test_health_command_speaks_tls(secure_stack, pki):
    address = secure_stack["thinker"].address
    flags = ["--tls-ca", pki.ca, "--tls-cert", pki.client_cert, "--tls-key", pki.client_key]
    assert cli.main(["health", address, *flags]) == 0
    assert cli.main(["health", address, "--timeout", "3"]) == 1


def test_python_client_over_mtls_needs_the_api_key(secure_stack, pki):
    address = secure_stack["gateway"].address
    tls = {"ca": pki.ca, "cert": pki.client_cert, "key": pki.client_key}
    with Client(address, api_key=API_KEY, **tls) as client:
        result = client.complete("Hello, securely", max_tokens=6, max_audio_frames=8)
        assert client.info().model_id == "qwen3-omni"
    assert result.text and result.audio.size and result.finish_reason
    with Client(address, api_key="wrong", **tls) as client, pytest.raises(Unauthenticated):
        client.complete("Hello", max_tokens=2, audio=False)
    # No client certificate: the TLS handshake fails (mTLS), which gRPC reports as UNAVAILABLE.
    no_cert = Client(address, api_key=API_KEY, ca=pki.ca, retries=0)
    with no_cert, pytest.raises(Unavailable):
        no_cert.complete("Hello", max_tokens=2, audio=False, deadline=10)
