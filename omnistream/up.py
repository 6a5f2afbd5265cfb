"""`omnistream up`: the whole stack on one machine, each service its own process."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

from omnistream.launcher import ServiceProcess, start_services


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--grpc-port", type=int, default=50051)
    p.add_argument("--max-concurrency", type=int, default=16)
    p.add_argument("--talker-replicas", type=int, default=1)
    p.add_argument("--code2wav-replicas", type=int, default=1)


def wait_ready(http_port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/ready", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"gateway not ready after {timeout}s")


def usage_text(host: str, http_port: int, grpc_port: int) -> str:
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": "Tell me a story."}],
            "modalities": ["text", "audio"],
            "audio": {"voice": "ethan", "format": "wav"},
            "stream": True,
            "max_tokens": 32,
        }
    )
    return f"""
omnistream is serving: REST http://{host}:{http_port}  gRPC {host}:{grpc_port}

  curl -N http://{host}:{http_port}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{body}'

  python - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="http://{host}:{http_port}/v1", api_key="none")
stream = client.chat.completions.create(model="qwen3-omni", messages=[{{"role": "user", "content": "Hello"}}],
    modalities=["text", "audio"], audio={{"voice": "ethan", "format": "pcm16"}}, stream=True, max_tokens=32)
for chunk in stream:
    delta = chunk.choices[0].delta if chunk.choices else None
    if delta and delta.content:
        print(delta.content, end="", flush=True)
PY

Metrics: http://{host}:{http_port}/metrics   Ready: http://{host}:{http_port}/ready   Ctrl-C stops everything.
"""


def start_stack(
    model: str,
    services: dict[str, ServiceProcess],
    *,
    dtype: str = "float32",
    device: str = "cpu",
    host: str = "127.0.0.1",
    http_port: int = 0,
    grpc_port: int = 0,
    max_concurrency: int = 16,
    talker_replicas: int = 1,
    code2wav_replicas: int = 1,
) -> ServiceProcess:
    """Start the stages, then the gateway, into `services` (so a caller can stop whatever started)."""
    common = ["--model", model, "--dtype", dtype, "--device", device]
    specs = {"thinker": ["serve", "thinker", *common]}
    for i in range(talker_replicas):
        specs[f"talker-{i}"] = ["serve", "talker", *common]
    for i in range(code2wav_replicas):
        specs[f"code2wav-{i}"] = ["serve", "code2wav", *common]
    services.update(start_services(specs))
    gateway_args = [
        "serve",
        "gateway",
        "--model",
        model,
        "--host",
        host,
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--max-concurrency",
        str(max_concurrency),
    ]
    for name, service in list(services.items()):
        gateway_args += [f"--{name.split('-')[0]}", service.address]
    services.update(start_services({"gateway": gateway_args}))
    gateway = services["gateway"]
    wait_ready(gateway.http_port)
    return gateway


def run_up(args: argparse.Namespace) -> int:
    services: dict[str, ServiceProcess] = {}
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        gateway = start_stack(
            args.model,
            services,
            dtype=args.dtype,
            device=args.device,
            host=args.host,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            max_concurrency=args.max_concurrency,
            talker_replicas=args.talker_replicas,
            code2wav_replicas=args.code2wav_replicas,
        )
        print(usage_text(args.host, gateway.http_port, gateway.port), flush=True)
        while not stop.is_set():
            for name, service in services.items():
                if service.proc.poll() is not None:
                    print(f"{name} exited with {service.proc.returncode}; stopping", file=sys.stderr)
                    return 1
            stop.wait(0.5)
        return 0
    finally:
        for service in reversed(list(services.values())):
            service.stop()
