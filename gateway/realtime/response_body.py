"""The `realtime.response` object response.created and response.done carry: a response's status and
why it ended, its output items, its usage, and omnistream's per-turn numbers.

Read from a running response (gateway/realtime/response.py) through `Described`, the state it
shows, so what the client is told of a response is found in one place, apart from how it runs.
"""

from __future__ import annotations

import typing
from typing import Any

from gateway.realtime.conversation import Item
from gateway.realtime.protocol import Protocol
from gateway.serving.session import Session
from omnistream.request.errors import OmniError
from omnistream.request.generation import DoneEvent

STAGES = ("thinker", "talker", "code2wav")
LISTENER_FIELDS = ("stalls", "stall_ms", "underrun_ms", "longest_stall_ms", "continuity_ok")


class Described(typing.Protocol):
    """What a response shows of itself (gateway/realtime/response.py's `ResponseRun`)."""

    id: str
    protocol: Protocol
    speaks: bool
    status: str
    reason: str | None
    error: OmniError | None
    metadata: dict[str, str] | None
    done: DoneEvent | None
    output_tokens: int
    tokens_at_first_text: int | None
    voice_to_voice_s: float | None
    session: Session | None
    replicas: dict[str, str]

    def outputs(self) -> list[Item]: ...


def _ms(start: float, end: float | None) -> float | None:
    return None if end is None else round((end - start) * 1000, 1)


def usage(run: Described) -> dict[str, Any]:
    """The tokens of the prompt and of the answer (as far as it came when it ended early)."""
    prompt = len(run.done.prompt_ids) if run.done else 0
    output = len(run.done.output_ids) if run.done else run.output_tokens
    cached = run.done.cached_tokens if run.done else 0
    return {
        "total_tokens": prompt + output,
        "input_tokens": prompt,
        "output_tokens": output,
        "input_token_details": {"cached_tokens": cached, "text_tokens": prompt, "audio_tokens": 0},
        "output_token_details": {"text_tokens": output, "audio_tokens": 0},
    }


def timings(run: Described) -> dict[str, Any]:
    """omnistream's per-turn numbers (the playground shows them; keep the names). The listener's
    (omnistream/audio/listener.py: stalls, total stall, underrun = vLLM-Omni's audio_underrun, the
    longest stall, continuity) are of the audio as the gateway handed it out, None without
    audio. `voice_to_voice_ms`: the end of the user's speech to the first audio delta, for a
    response to a user audio turn (gateway/realtime/voice_to_voice.py), else None. `first_chunk_ms`:
    the audio of the first chunk the audio planner chose (gateway/admission/audio_planner.py): no
    audio goes out before that much is made, so under load it is much of the wait for the first."""
    out: dict[str, Any] = {
        "ttft_ms": None,
        "tokens_at_first_text": run.tokens_at_first_text,  # ttft_ms: to the first token, text or not
        "ttfa_ms": None,
        "rtf": None,
        "voice_to_voice_ms": _ms(0.0, run.voice_to_voice_s),
        "first_chunk_ms": None,
        "replicas": {stage: run.replicas.get(stage) for stage in STAGES},
        **dict.fromkeys(LISTENER_FIELDS),
    }
    if run.session is not None:
        t = run.session.timings
        out["ttft_ms"] = _ms(t.started, t.first_text)
        out["ttfa_ms"] = _ms(t.started, t.first_audio)
        out["first_chunk_ms"] = _ms(0.0, run.session.first_chunk_s)
        if t.audio_seconds > 0 and t.last_audio is not None:
            out["rtf"] = round((t.last_audio - t.started) / t.audio_seconds, 4)
        heard = run.session.listening()
        if heard.heard:
            out["stalls"] = heard.stalls
            out["stall_ms"] = _ms(0.0, heard.stall_s)
            out["underrun_ms"] = _ms(0.0, heard.underrun_s)
            out["longest_stall_ms"] = _ms(0.0, heard.longest_stall_s)
            out["continuity_ok"] = heard.continuity_ok
    return out


def _status_details(run: Described) -> dict[str, Any] | None:
    """Why a response that did not complete ended (None while it runs or once it completed)."""
    if run.status == "cancelled":
        return {"type": "cancelled", "reason": run.reason or "client_cancelled"}
    if run.status == "incomplete":
        return {"type": "incomplete", "reason": run.reason}
    if run.status == "failed" and run.error is not None:
        return {
            "type": "failed",
            "error": {"type": run.error.kind, "code": run.error.kind, "message": run.error.message},
        }
    return None


def describe(run: Described) -> dict[str, Any]:
    """The response object, in the connection's scheme (beta names its modalities `modalities`)."""
    modalities = ["audio"] if run.speaks else ["text"]
    body: dict[str, Any] = {
        "id": run.id,
        "object": "realtime.response",
        "status": run.status,
        "status_details": _status_details(run),
        "output": [] if run.status == "in_progress" else [i.wire(run.protocol) for i in run.outputs()],
        "conversation_id": None,
        "metadata": run.metadata,
        "usage": None if run.status == "in_progress" else usage(run),
        "omnistream": timings(run),
    }
    body["modalities" if run.protocol.beta else "output_modalities"] = modalities
    return body
