"""Sub-commands that run services; imported lazily so `generate` needs no gRPC stubs."""

from __future__ import annotations

import argparse


def _serve(args: argparse.Namespace) -> int:
    from omnistream.protogen import ensure_generated

    ensure_generated()
    from services import serve

    return serve.main(args)


def add_commands(sub: argparse._SubParsersAction) -> None:
    from services import serve_args

    p = sub.add_parser("serve", help="run one stage service (gRPC)")
    serve_args.add_arguments(p)
    p.set_defaults(func=_serve)
