"""The `omnistream` command."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys

from omnistream.cli import services as cli_services
from omnistream.cli.common import add_model_args, ensure_default_model
from omnistream.cli.media import add_media_args


def _add_request_args(p: argparse.ArgumentParser) -> None:
    """The request's flags. Every default is None ("not given"), so the one table of defaults
    (omnistream/request/defaults.py, shared with the gateway) decides; the help names its value."""
    from omnistream.request.chunk_plan import SCHEDULES
    from omnistream.request.defaults import DEFAULTS as D

    p.add_argument(
        "--system",
        default=None,
        help='system prompt, sent as a system message (default: none; --system "" also means none)',
    )
    p.add_argument(
        "--mode",
        default=None,
        choices=["async", "sequential"],
        help=f"default: {'async' if D.async_chunk else 'sequential'}",
    )
    p.add_argument("--max-tokens", type=int, default=None, help=f"default: {D.max_tokens}")
    p.add_argument(
        "--max-audio-frames",
        type=int,
        default=None,
        help=f"at most this many codec frames (80 ms each; default: {D.max_audio_frames}); "
        "the reference's talker_max_new_tokens = this + 1",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help=f"thinker temperature (default: {D.temperature}); 0 = greedy",
    )
    p.add_argument("--top-p", type=float, default=None, help=f"default: {D.top_p}")
    p.add_argument("--top-k", type=int, default=None, help=f"default: {D.top_k} (off)")
    p.add_argument("--repetition-penalty", type=float, default=None, help=f"default: {D.repetition_penalty}")
    p.add_argument(
        "--seed", type=int, default=None, help="seeds the text and (unless --talker-seed) the voice"
    )
    p.add_argument(
        "--talker-temperature", type=float, default=None, help=f"default: {D.talker_temperature}; 0 = greedy"
    )
    p.add_argument("--talker-top-k", type=int, default=None, help=f"default: {D.talker_top_k}")
    p.add_argument("--talker-top-p", type=float, default=None, help=f"default: {D.talker_top_p}")
    p.add_argument(
        "--talker-repetition-penalty",
        type=float,
        default=None,
        help=f"default: {D.talker_repetition_penalty}",
    )
    p.add_argument("--talker-seed", type=int, default=None, help="default: --seed")
    p.add_argument("--speaker", default=None, help="default: the model's default voice (ethan on Qwen3-Omni)")
    p.add_argument("--ignore-eos", action="store_true", default=None)
    p.add_argument("--no-audio", action="store_true", default=None)
    p.add_argument("--initial-codec-chunk-frames", type=int, default=None, help="default: chosen from load")
    p.add_argument(
        "--codec-chunk-schedule",
        choices=SCHEDULES,
        default=None,
        help=f"how audio chunks after the first grow (default: {D.codec_chunk_schedule})",
    )


def cmd_make_tiny_model(args: argparse.Namespace) -> int:
    from omnistream.models.family import DEFAULT_FAMILY, family_named

    path = family_named(DEFAULT_FAMILY).make_tiny(
        args.dir,
        seed=args.seed,
        hidden_size=args.hidden_size,
        layers=args.layers,
        experts=args.experts,
        answers_end=args.answers_end,
    )
    print(path)
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from omnistream.cli.generate import run_generate

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
    p.add_argument(
        "--no-answers-end",
        dest="answers_end",
        action="store_false",
        help="keep the purely random weights, whose answers run to max_tokens / max_audio_frames",
    )
    p.set_defaults(func=cmd_make_tiny_model)

    p = sub.add_parser("generate", help="run one request through the in-process pipeline")
    add_model_args(p)
    p.add_argument("--prompt", required=True)
    add_media_args(p)  # the same files as `omnistream chat` takes (omnistream/cli/media.py)
    _add_request_args(p)
    p.add_argument("--output-dir", required=True)
    p.set_defaults(func=cmd_generate)

    cli_services.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # First, before the heavy imports: a service started by a launcher dies with it (lifeline.py).
    from omnistream.cli.lifeline import bind_to_parent

    bind_to_parent()
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from omnistream.request.errors import OmniError
    from omnistream.service.ports import BindError

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
