"""Command-line arguments of `omnistream serve gateway` (no heavy imports)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML file (see deploy/gateway.example.yaml); flags override it")
    p.add_argument("--thinker", action="append", default=None, help="thinker replica address (repeatable)")
    p.add_argument("--talker", action="append", default=None, help="talker replica address (repeatable)")
    p.add_argument("--code2wav", action="append", default=None, help="code2wav replica address (repeatable)")
    p.add_argument("--host", default=None)
    p.add_argument("--http-port", type=int, default=None, help="0 picks a free port (printed on stdout)")
    p.add_argument("--grpc-port", type=int, default=None)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--max-queue", type=int, default=None)
    p.add_argument("--queue-timeout", type=float, default=None)
    p.add_argument("--request-timeout", type=float, default=None)
    p.add_argument(
        "--max-request-bytes", type=int, default=None, help="REST bodies over this get 413 (default 8 MiB)"
    )
    p.add_argument(
        "--max-prompt-chars", type=int, default=None, help="longer prompts get 413 (default 1000000)"
    )
    p.add_argument("--sequential", action="store_true", help="default to sequential mode (async chunk off)")
    p.add_argument(
        "--discovery-interval", type=float, default=None, help="seconds between DNS look-ups of stage names"
    )
    p.add_argument("--tls-cert", default=None, help="PEM certificate: serve REST and gRPC over TLS")
    p.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    p.add_argument("--tls-client-ca", default=None, help="PEM CA: require client certificates (mTLS)")
    p.add_argument("--stage-tls-ca", default=None, help="PEM CA that signed the stages' certificates")
    p.add_argument("--stage-tls-cert", default=None, help="client certificate for stages that require one")
    p.add_argument("--stage-tls-key", default=None, help="private key of --stage-tls-cert")
    p.add_argument("--stage-tls-server-name", default=None, help="name on the stages' certificates")
    p.add_argument(
        "--api-key", default=None, help="require `Authorization: Bearer KEY` (default: $OMNISTREAM_API_KEY)"
    )
