"""Command-line arguments of `omnistream bench` (no heavy imports)."""

from __future__ import annotations

import argparse

from omnistream.cli.common import DEFAULT_TINY_DIR


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `omnistream bench`, in the order --help lists them."""
    _add_target_arguments(p)
    _add_workload_arguments(p)
    _add_extra_measurement_arguments(p)
    _add_stack_arguments(p)
    _add_conversation_arguments(p)
    _add_voice_to_voice_arguments(p)
    p.add_argument("--output-dir", default="bench-results")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--seed", type=int, default=0)


def _add_target_arguments(p: argparse.ArgumentParser) -> None:
    """The model and what is measured: in process, the services (started here or a running gateway)."""
    p.add_argument("--model", default=str(DEFAULT_TINY_DIR))
    p.add_argument(
        "--targets",
        default="in-process,services",
        help="comma list of in-process, in-process-recompute (the previous Code2Wav decode), services",
    )
    p.add_argument(
        "--transport", default="grpc", choices=["grpc", "rest"], help="how the services target is called"
    )
    p.add_argument(
        "--gateway", default=None, help="host:port of a running gateway (gRPC) instead of starting one"
    )


def _add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """The requests, the cells they run in (modes, concurrency, schedules) and how they are judged."""
    p.add_argument("--modes", default="async,sequential")
    p.add_argument("--max-concurrency", default="1,4,10", help="comma list: a sweep")
    p.add_argument("--num-prompts", type=int, default=None, help="per run (default: max(3, concurrency))")
    p.add_argument("--input-len", type=int, default=100)
    p.add_argument("--output-len", type=int, default=100)
    p.add_argument("--audio-frames", type=int, default=340, help="codec frames per request (80 ms each)")
    p.add_argument("--no-ignore-eos", action="store_true")
    p.add_argument(
        "--audio-input-seconds",
        type=float,
        default=0.0,
        help="also run a spoken-input workload: this many seconds of speech-like audio in, text and "
        "audio out (targets in-process and services over gRPC); rows are named <target>+audio-in-Ns",
    )
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--initial-codec-chunk-frames", type=int, default=None)
    p.add_argument(
        "--codec-chunk-schedules",
        default="",
        help="comma list of codec chunk schedules (grow, fixed), each run as its own target, "
        "interleaved A B B A with the others: rows <target>[grow], <target>[fixed] (default: none "
        "given, the request table's, grow)",
    )
    p.add_argument(
        "--continuity-threshold-ms",
        type=float,
        default=100.0,
        help="a request keeps continuity when its underrun (omnistream/audio/listener.py) is at most this",
    )
    p.add_argument("--warmup", type=int, default=2, help="warm-up requests per target (not measured)")
    p.add_argument("--repeats", type=int, default=2, help="runs per target and cell, in A B B A order")


def _add_extra_measurement_arguments(p: argparse.ArgumentParser) -> None:
    """Measurements beside the latency table: chunk cost, stage timings, huge and long prompts."""
    p.add_argument("--chunk-cost", action="store_true", help="also measure CPU time per inter-stage chunk")
    p.add_argument("--chunk-cost-prompts", default="16,2508")
    p.add_argument(
        "--stage-timings", action="store_true", help="also time each engine's step at batch 1 and 8"
    )
    p.add_argument(
        "--big-prompt",
        default="",
        help="comma list of prompt sizes in bytes (e.g. 10000000,4000000): small-request latency and "
        "/ready while prompts of these sizes are refused (services target, started here)",
    )
    p.add_argument(
        "--long-prompt-tokens",
        type=int,
        default=0,
        help="also measure the running requests' inter-token latency (thinker) and inter-frame latency "
        "(talker) while a prompt of this many tokens prefills (e.g. 4000), in-process "
        "(omnistream/bench/long_prompt.py)",
    )
    p.add_argument(
        "--long-prompt-baseline",
        default=None,
        help="a checkout to run the --long-prompt-tokens measurement with as well (e.g. /work/main): "
        "before vs after, same run",
    )


def _add_stack_arguments(p: argparse.ArgumentParser) -> None:
    """Settings of the engines and of the services target's stack (the stages and gateways)."""
    p.add_argument(
        "--prefill-chunk",
        type=int,
        default=None,
        help="the engines' prompt positions prefilled per step (default: theirs)",
    )
    p.add_argument(
        "--thinker-nice",
        type=int,
        default=None,
        help="the services target's thinker CPU priority (serve --nice; default: omnistream up's, 5)",
    )
    p.add_argument(
        "--audio-hold",
        default="on",
        help="comma list of the services target's audio hold settings (on, off): with on,off a second "
        "gateway over the same stage processes runs with --no-audio-hold, its rows named "
        "services[no-hold], interleaved A B B A with the default",
    )
    p.add_argument(
        "--gateway-args",
        default="",
        help="more `serve gateway` flags for the services target's gateways, one string "
        '(e.g. "--audio-start-jitter 0.2")',
    )


def _add_conversation_arguments(p: argparse.ArgumentParser) -> None:
    """--conversation (instead of the latency table) and its settings."""
    p.add_argument(
        "--conversation",
        action="store_true",
        help="instead of the latency table: conversation memory (issue 37), the prefix cache on against "
        "off, A B B A over --repeats, a fresh stack each run: a realtime conversation of spoken turns "
        "and a REST chat (TTFT, TTFP and cached share per turn), and concurrent REST conversations "
        "(throughput); writes conversation.json and conversation.md (omnistream/bench/conversation/)",
    )
    p.add_argument(
        "--conversation-models",
        default="",
        help="comma list of checkpoints for --conversation: tiny, real-shaped (the tiny build with the "
        "real code predictor's depth, built under .cache), or directories (default: --model)",
    )
    p.add_argument(
        "--conversation-workloads",
        default="realtime,rest,concurrent",
        help="comma list of the --conversation workloads to run: realtime, rest, concurrent",
    )
    p.add_argument("--conversation-turns", type=int, default=20, help="turns of the realtime and REST chats")
    p.add_argument(
        "--conversation-turn-seconds",
        type=float,
        default=0.0,
        help="each spoken realtime turn ends in silence up to this length, as a turn that voice activity "
        "detection commits does, so every turn brings the same new audio (e.g. 4.5: 65 audio tokens "
        "each); 0 (default): the speech alone, 2.9-4.3 s",
    )
    p.add_argument(
        "--conversation-concurrency", type=int, default=10, help="REST conversations at once (concurrent)"
    )
    p.add_argument(
        "--conversation-concurrent-turns", type=int, default=10, help="turns of each concurrent conversation"
    )
    p.add_argument(
        "--conversation-max-tokens", type=int, default=16, help="text tokens of each answer (ignore EOS)"
    )
    p.add_argument(
        "--conversation-audio-frames", type=int, default=24, help="at most this many codec frames an answer"
    )
    p.add_argument(
        "--conversation-throughput-tolerance",
        type=float,
        default=0.05,
        help="the concurrency target passes when the cache's audio s/s is at least (1 - this) x without it",
    )


def _add_voice_to_voice_arguments(p: argparse.ArgumentParser) -> None:
    """--voice-to-voice (instead of the latency table) and its settings."""
    p.add_argument(
        "--voice-to-voice",
        action="store_true",
        help="instead of the latency table: voice-to-voice latency (issue 61), from the end of the "
        "user's speech to the first audio of the answer, at realtime clients streaming espeak-ng "
        "speech in real time, with server_vad and with client commits; on a stack started on --model, "
        "or with --gateway the HTTP URL of a running one; writes voice_to_voice.json and "
        "voice_to_voice.md (omnistream/bench/voice_to_voice.py)",
    )
    p.add_argument("--v2v-seconds", default="1,4,9", help="comma list: seconds of speech of the utterances")
    p.add_argument("--v2v-sessions", default="1,8", help="comma list: realtime sessions at once")
    p.add_argument(
        "--v2v-modes",
        default="server_vad,commit",
        help="comma list of server_vad (the server's turn detection ends the turn) and commit (the "
        "client commits and asks for the answer at the end of its speech)",
    )
    p.add_argument(
        "--v2v-turns", type=int, default=3, help="turns of each session, each on a fresh realtime session"
    )
    p.add_argument(
        "--v2v-interleave",
        action="store_true",
        help="the utterance lengths of one mode and session count take turns (A B, B A) instead of "
        "running one after another, so that a difference between lengths is not the machine's drift",
    )
    p.add_argument(
        "--v2v-window-ms",
        type=int,
        default=500,
        help="server_vad's silence_duration_ms: the silence that ends a turn",
    )
    p.add_argument(
        "--v2v-gap-ms",
        type=int,
        default=0,
        help="ms of silence in the middle of each utterance: a pause the speaker goes on after (with "
        "server_vad, one that wastes a speculation when it outlasts the window less the lead)",
    )
