"""Sub-commands that run services. Their heavy imports (gRPC stubs, torch) happen when a command runs,
so `generate` needs no gRPC stubs and `--help` stays fast."""

from __future__ import annotations

import argparse

from omnistream.cli.common import ensure_default_model


def _serve(args: argparse.Namespace) -> int:
    from omnistream.wire.protogen import ensure_generated

    ensure_generated()
    from services import serve

    return serve.main(args)


def _serve_gateway(args: argparse.Namespace) -> int:
    from omnistream.wire.protogen import ensure_generated

    ensure_generated()
    from gateway import main

    return main.main(args)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from services import serve_args

    p = sub.add_parser("serve", help="run one stage service (gRPC) or the gateway")
    kinds = p.add_subparsers(dest="service", required=True)
    for stage in ("thinker", "talker", "code2wav"):
        sp = kinds.add_parser(stage, help=f"the {stage} stage service")
        serve_args.add_arguments(sp)
        if stage == "thinker":
            serve_args.add_thinker_arguments(sp)
        elif stage == "talker":
            serve_args.add_talker_arguments(sp)
        elif stage == "code2wav":
            serve_args.add_code2wav_arguments(sp)
        sp.set_defaults(func=_serve, stage=stage)
    gp = kinds.add_parser("gateway", help="the gateway: REST/SSE + gRPC API, admission, fan-out")
    from gateway import main_args

    main_args.add_arguments(gp)
    gp.set_defaults(func=_serve_gateway)
    add_up_command(sub)
    add_bench_command(sub)
    add_health_command(sub)
    from omnistream.cli.chat import add_chat_command

    add_chat_command(sub)


def _up(args: argparse.Namespace) -> int:
    from omnistream.wire.protogen import ensure_generated

    ensure_generated()
    from omnistream.cli.up import run_up

    return run_up(args)


def add_up_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from omnistream.cli import up

    p = sub.add_parser("up", help="start the three stages and the gateway locally; Ctrl-C stops them")
    up.add_arguments(p)
    p.set_defaults(func=_up)


HEALTH_ENV = "OMNISTREAM_HEALTH_"  # ..._TLS_CA, _TLS_CERT, _TLS_KEY, _TLS_SERVER_NAME: defaults of the flags


def _health(args: argparse.Namespace) -> int:
    import grpc

    from omnistream.cli.launcher import ClientTLS, check_health

    tls = None
    if args.tls_ca or args.tls_cert:
        tls = ClientTLS(args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name)
    try:
        status = check_health(args.address, tls, timeout=args.timeout)
    except grpc.RpcError as exc:
        print(f"{args.address}: {exc.code().name} {exc.details()}")
        return 1
    from grpc_health.v1 import health_pb2  # type: ignore[import-untyped]  # ships no stubs

    name = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
    print(f"{args.address}: {name}")
    return 0 if status == health_pb2.HealthCheckResponse.SERVING else 1


def add_health_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    import os

    p = sub.add_parser(
        "health",
        help="gRPC health check of a stage or the gateway: exit 0 when SERVING (container health checks)",
    )
    p.add_argument("address", nargs="?", default="127.0.0.1:50051", help="host:port (default %(default)s)")
    p.add_argument("--timeout", type=float, default=5.0)
    for flag, help_text in (
        ("tls-ca", "PEM CA of the server's certificate: connect over TLS"),
        ("tls-cert", "client certificate, for servers that require one (mTLS)"),
        ("tls-key", "private key of --tls-cert"),
        ("tls-server-name", "name on the server's certificate, if not the address's host"),
    ):
        env = HEALTH_ENV + flag.upper().replace("-", "_")
        p.add_argument(f"--{flag}", default=os.environ.get(env), help=f"{help_text} (default: ${env})")
    p.set_defaults(func=_health)


def _bench(args: argparse.Namespace) -> int:
    import asyncio

    from omnistream.wire.protogen import ensure_generated

    ensure_generated()
    from omnistream.bench.run import run_bench

    ensure_default_model(args.model)
    return asyncio.run(run_bench(args))


def add_bench_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from omnistream.bench import args as bench_args

    p = sub.add_parser("bench", help="benchmark: TTFT, TPOT, ITL, TTFP, RTF, E2E; services vs in-process")
    bench_args.add_arguments(p)
    p.set_defaults(func=_bench)
