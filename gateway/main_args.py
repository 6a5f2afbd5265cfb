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
    p.add_argument(
        "--audio-hold",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="hold new audio requests while the measured talker/code2wav speed could not keep one more "
        "stream real time (default on; --no-audio-hold: admit as before)",
    )
    p.add_argument(
        "--audio-hold-margin",
        type=float,
        default=None,
        help="speed to spare: admit while capacity >= (1 + margin) x streams x 12.5 frames/s (0.2)",
    )
    p.add_argument(
        "--audio-start-guard",
        type=float,
        default=None,
        help="seconds: while a stream with a first chunk shorter than this has less audio than this in "
        "hand, new audio requests wait, then start together, each sized knowing the others (1.0; 0: off)",
    )
    p.add_argument(
        "--audio-start-jitter",
        type=float,
        default=None,
        help="seconds: a new stream's first chunk is sized as if its later windows came this much later "
        "than measured speed says, so the jitter of a shared machine finds audio in hand (0.1; 0: off)",
    )
    p.add_argument(
        "--audio-start-jitter-per-stream",
        type=float,
        default=None,
        help="seconds added to --audio-start-jitter for each other audio stream (0.0125; 0: off)",
    )
    p.add_argument(
        "--audio-hold-queue",
        type=int,
        default=None,
        help="audio requests held at most; more get 429 (default: --max-concurrency; 0: 429 at once)",
    )
    p.add_argument("--request-timeout", type=float, default=None)
    p.add_argument(
        "--max-request-bytes", type=int, default=None, help="REST bodies over this get 413 (default 8 MiB)"
    )
    p.add_argument(
        "--max-prompt-chars", type=int, default=None, help="longer prompts get 413 (default 1000000)"
    )
    media = p.add_argument_group("media limits (README: Audio, images and video)")
    media.add_argument(
        "--max-media-bytes", type=int, default=None, help="encoded media per request (default 5 MiB)"
    )
    media.add_argument(
        "--max-decoded-media-bytes",
        type=int,
        default=None,
        help="decoded media per request, must fit the stage message (default 12 MiB)",
    )
    media.add_argument(
        "--max-audio-seconds", type=float, default=None, help="audio per request, video sound included (180)"
    )
    media.add_argument(
        "--max-image-input-pixels", type=int, default=None, help="pixels of an image as sent (36000000)"
    )
    media.add_argument(
        "--image-max-pixels", type=int, default=None, help="pixels of an image after resizing (1310720)"
    )
    media.add_argument("--max-video-seconds", type=float, default=None, help="length of a video (120)")
    media.add_argument("--max-video-frames", type=int, default=None, help="frames sampled per video (16)")
    media.add_argument("--video-fps", type=float, default=None, help="frames sampled per second (2.0)")
    media.add_argument(
        "--media-decode-timeout", type=float, default=None, help="seconds to decode a request's media (30)"
    )
    media.add_argument(
        "--media-url-prefix",
        dest="media_url_prefixes",
        action="append",
        default=None,
        help="allow media URLs starting with this http(s):// or file:// prefix (repeatable; default none)",
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
    rt = p.add_argument_group("realtime (README: Realtime voice)")
    rt.add_argument("--realtime-max-sessions", type=int, default=None, help="open /v1/realtime sessions (16)")
    rt.add_argument(
        "--realtime-idle-timeout", type=float, default=None, help="idle seconds before a session closes (300)"
    )
    p.add_argument(
        "--api-key", default=None, help="require `Authorization: Bearer KEY` (default: $OMNISTREAM_API_KEY)"
    )
