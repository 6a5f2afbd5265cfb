"""Sub-commands that run services; imported lazily so `generate` needs no gRPC stubs."""

from __future__ import annotations

import argparse


def _serve(args: argparse.Namespace) -> int:
    from omnistream.protogen import ensure_generated

    ensure_generated()
    from services import serve

    return serve.main(args)


def _serve_gateway(args: argparse.Namespace) -> int:
    from omnistream.protogen import ensure_generated

    ensure_generated()
    from gateway import main

    return main.main(args)


def add_commands(sub: argparse._SubParsersAction) -> None:
    from services import serve_args

    p = sub.add_parser("serve", help="run one stage service (gRPC) or the gateway")
    kinds = p.add_subparsers(dest="service", required=True)
    for stage in ("thinker", "talker", "code2wav"):
        sp = kinds.add_parser(stage, help=f"the {stage} stage service")
        serve_args.add_arguments(sp)
        sp.set_defaults(func=_serve, stage=stage)
    gp = kinds.add_parser("gateway", help="the gateway: REST/SSE + gRPC API, admission, fan-out")
    from gateway import main_args

    main_args.add_arguments(gp)
    gp.set_defaults(func=_serve_gateway)
    add_up_command(sub)


def _up(args: argparse.Namespace) -> int:
    from omnistream.protogen import ensure_generated

    ensure_generated()
    from omnistream.up import run_up

    return run_up(args)


def add_up_command(sub: argparse._SubParsersAction) -> None:
    from omnistream import up

    p = sub.add_parser("up", help="start the three stages and the gateway locally; Ctrl-C stops them")
    up.add_arguments(p)
    p.set_defaults(func=_up)
