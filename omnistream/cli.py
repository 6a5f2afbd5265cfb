"""The `omnistream` command."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys

from omnistream import cli_services
from omnistream.cli_common import add_model_args, ensure_default_model


def cmd_make_tiny_model(args: argparse.Namespace) -> int:
    from omnistream.family import DEFAULT_FAMILY, family_named

    path = family_named(DEFAULT_FAMILY).make_tiny(
        args.dir, seed=args.seed, hidden_size=args.hidden_size, layers=args.layers, experts=args.experts
    )
    print(path)
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from omnistream.generate import run_generate

    ensure_default_model(args.model)
    return asyncio.run(run_generate(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omnistream", description=__doc__)
    parser.add_argument("--log-level", default="WARNING")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("make-tiny-model", help="write the tiny random Qwen3-Omni checkpoint")
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--experts", type=int, default=4)
    p.set_defaults(func=cmd_make_tiny_model)

    p = sub.add_parser("generate", help="run one request through the in-process pipeline")
    add_model_args(p)
    p.add_argument("--prompt", required=True)
    p.add_argument("--system", default="You are a helpful assistant.")
    p.add_argument("--mode", default="async", choices=["async", "sequential"])
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument(
        "--max-audio-frames",
        type=int,
        default=200,
        help="at most this many codec frames (80 ms each); the reference's talker_max_new_tokens = this + 1",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="thinker temperature; 0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--talker-temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--talker-top-k", type=int, default=50)
    p.add_argument("--talker-top-p", type=float, default=1.0)
    p.add_argument("--talker-repetition-penalty", type=float, default=1.0)
    p.add_argument("--speaker", default="ethan")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--no-audio", action="store_true")
    p.add_argument("--initial-codec-chunk-frames", type=int, default=None)
    p.add_argument("--output-dir", required=True)
    p.set_defaults(func=cmd_generate)

    cli_services.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # First, before the heavy imports: a service started by a launcher dies with it (lifeline.py).
    from omnistream.lifeline import bind_to_parent

    bind_to_parent()
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from omnistream.errors import OmniError
    from omnistream.ports import BindError

    try:
        return int(args.func(args) or 0)
    except OmniError as exc:
        print(
            json.dumps({"error": {"type": exc.kind, "message": exc.message, "field": exc.field}}),
            file=sys.stderr,
        )
        return 2
    except BindError as exc:  # a taken port is the operator's to fix: one line, no stack trace
        command = " ".join(filter(None, (args.command, getattr(args, "service", None))))
        print(f"omnistream {command}: {exc}", file=sys.stderr, flush=True)
        # A server started before the failed bind (a stage's gRPC port, before its metrics port) is
        # collected after its event loop closed, and complains; that is noise after the line above.
        sys.unraisablehook = lambda _unraisable: None
        return 1


if __name__ == "__main__":
    sys.exit(main())
