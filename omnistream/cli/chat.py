"""`omnistream chat`: talk to a running gateway from a terminal.

One prompt from the argument, or a conversation read line by line from stdin (history kept, `/reset`
forgets it). Text streams as it arrives; each answer's speech goes to a WAV file (float32, the
samples exactly as received) and, with `--play` and the optional `sounddevice` package, to the
speakers as it streams. Each turn ends with the time to first token and to first audio as this
client saw them.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnistream.cli.media import add_media_args, media_parts, user_content

if TYPE_CHECKING:
    import numpy as np

    from omnistream.client import Result

DEFAULT_GATEWAY = "127.0.0.1:50051"


def add_chat_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("chat", help="chat with a running gateway (text streams, speech to a WAV)")
    p.add_argument("prompt", nargs="?", help="one prompt; without it, read turns from stdin")
    p.add_argument("--gateway", default=DEFAULT_GATEWAY, help="the gateway's gRPC host:port")
    p.add_argument("--api-key", default=None, help="default: $OMNISTREAM_API_KEY")
    p.add_argument("--tls", action="store_true", help="TLS with the system's CAs")
    p.add_argument("--ca", default=None, help="CA file to trust (implies TLS)")
    p.add_argument("--cert", default=None, help="client certificate (mTLS)")
    p.add_argument("--key", default=None, help="client key (mTLS)")
    p.add_argument("--system", default=None, help='a system prompt (default: none; --system "": none)')
    p.add_argument("--voice", default=None)
    p.add_argument("--no-audio", action="store_true", help="text only")
    p.add_argument("--output", default="answer.wav", help="WAV of the answer (turn N: <stem>-N.wav)")
    p.add_argument("--play", action="store_true", help="play as it streams (needs `sounddevice`)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--max-audio-frames", type=int, default=None)
    p.add_argument("--talker-temperature", type=float, default=None)
    p.add_argument("--initial-codec-chunk-frames", type=int, default=None)
    p.add_argument("--codec-chunk-schedule", choices=("grow", "fixed"), default=None, help="default: grow")
    add_media_args(p)
    p.set_defaults(func=run_chat)


class _Player:
    """Plays float32 chunks as they arrive when `sounddevice` and an output device exist."""

    def __init__(self) -> None:
        self._stream: Any = None

    def play(self, samples: np.ndarray, sample_rate: int) -> None:
        try:
            if self._stream is None:
                import sounddevice  # type: ignore[import-not-found]  # optional: not a dependency of omnistream

                self._stream = sounddevice.OutputStream(samplerate=sample_rate, channels=1, dtype="float32")
                self._stream.start()
            self._stream.write(samples.reshape(-1, 1))
        except Exception as exc:  # no library or no device: the WAV still has everything
            print(f"[no playback: {exc}]", file=sys.stderr)
            self._stream = False

    def close(self) -> None:
        if self._stream:
            self._stream.stop()
            self._stream.close()


def system_turns(system: str | None) -> list[dict[str, Any]]:
    """The conversation's start: the system message, or nothing when there is none or it is ""
    (`--system ""` means "no system prompt", as for `generate`, not an empty system turn)."""
    return [{"role": "system", "content": system}] if system else []


def _wav_path(args: argparse.Namespace, turn: int, single: bool) -> Path:
    path = Path(args.output)
    return path if single else path.with_name(f"{path.stem}-{turn}{path.suffix or '.wav'}")


def run_chat(args: argparse.Namespace) -> int:
    from omnistream.client import AudioChunk, Client, Result, TextDelta

    client = Client(
        args.gateway, api_key=args.api_key, tls=args.tls, ca=args.ca, cert=args.cert, key=args.key
    )
    options = {
        "audio": not args.no_audio,
        "voice": args.voice,
        "seed": args.seed,
        "temperature": args.temperature,
        "max_tokens": args.max_tokens,
        "max_audio_frames": args.max_audio_frames,
        "talker_temperature": args.talker_temperature,
        "initial_codec_chunk_frames": args.initial_codec_chunk_frames,
        "codec_chunk_schedule": args.codec_chunk_schedule,
    }
    history = system_turns(args.system)
    single = args.prompt is not None
    prompts = [args.prompt] if single else _lines()
    player = _Player() if args.play else None
    turn = 0
    try:
        for prompt in prompts:
            if prompt.strip() == "/reset":
                history = system_turns(args.system)
                continue
            turn += 1
            parts = media_parts(args) if turn == 1 else []  # the files go with the first turn
            history.append({"role": "user", "content": user_content(prompt, parts)})
            result, started = Result(), time.perf_counter()
            first_text = first_audio = None
            for event in client.generate(history, **options):
                result.add(event)
                if isinstance(event, TextDelta) and event.text:
                    first_text = first_text or time.perf_counter()
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
                elif isinstance(event, AudioChunk):
                    first_audio = first_audio or time.perf_counter()
                    if player is not None:
                        player.play(event.samples, event.sample_rate)
            sys.stdout.write("\n")
            sys.stdout.flush()
            history.append({"role": "assistant", "content": result.text})
            _report(
                result,
                started,
                first_text,
                first_audio,
                None if args.no_audio else _wav_path(args, turn, single),
            )
    finally:
        if player is not None:
            player.close()
        client.close()
    return 0


def _lines() -> Iterator[str]:
    while True:
        if sys.stdin.isatty():
            sys.stderr.write("you> ")
            sys.stderr.flush()
        line = sys.stdin.readline()
        if not line or not line.strip():
            return
        yield line.rstrip("\n")


def _report(
    result: Result, started: float, first_text: float | None, first_audio: float | None, wav: Path | None
) -> None:
    def ms(mark: float | None) -> str:
        return f"{(mark - started) * 1000:.0f} ms" if mark is not None else "n/a"

    where = ""
    if wav is not None:
        result.write_wav(wav)
        seconds = result.audio.size / (result.sample_rate or 24000)
        where = f", {seconds:.2f} s of audio -> {wav}"
    print(
        f"[first token {ms(first_text)}, first audio {ms(first_audio)}, {len(result.token_ids)} tokens "
        f"({result.finish_reason}){where}]",
        file=sys.stderr,
        flush=True,
    )
