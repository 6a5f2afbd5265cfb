"""The checks a request passes before admission that need no stage: its prompt's size, the kinds of
media the deployment takes, and whether its text and decoded media fit one stage message. Each
is a 4xx that never takes a permit (`GatewayCore.prepare`, gateway/serving/core.py)."""

from __future__ import annotations

from gateway.config import STAGE_MESSAGE_HEADROOM
from gateway.media.parts import pending
from omnistream.request.errors import InvalidRequest, TooLarge
from omnistream.request.generation import GenerationRequest
from omnistream.request.media import text_of


def check_prompt_size(request: GenerationRequest, limit: int) -> None:
    """413 for a prompt over `max_prompt_chars`, before any stage sees it: past that it could not
    run anyway, and it is what keeps every prompt inside one stage message (see GatewayConfig)."""
    if request.prompt_ids is not None:
        size, field, unit = len(request.prompt_ids), "prompt_ids", "token ids"
    else:
        size = sum(len(text_of(m["content"])) for m in request.messages or ())
        field, unit = "messages", "characters of message text"
    if size > limit:
        raise TooLarge(f"the prompt has {size} {unit}; at most {limit} are accepted", field=field)


def unsupported_media(
    request: GenerationRequest, modalities: tuple[str, ...] | None
) -> InvalidRequest | None:
    """The 422 for the first media part of a kind the deployment's thinker does not take (its Info's
    input_modalities), naming the part; call it while the parts are still encoded (they carry their
    field). None when all are taken, or when no thinker was heard from (no request runs then)."""
    if modalities is None:
        return None
    for part, item in pending(request.messages):
        if part["type"] not in modalities:
            return InvalidRequest(
                f"this deployment's model takes no {part['type']} input "
                f"(its thinker accepts: {', '.join(modalities)})",
                field=item.field,
            )
    return None


def check_message_size(request: GenerationRequest, media_bytes: int, max_message_bytes: int) -> None:
    """413 when the prompt's text and its decoded media together cannot fit the one stage message
    that carries them to the thinker (each fits alone: GatewayConfig checks the limits)."""
    if not media_bytes:
        return
    text = sum(len(text_of(m["content"]).encode("utf-8", "surrogatepass")) for m in request.messages or ())
    room = max_message_bytes - STAGE_MESSAGE_HEADROOM
    if text + media_bytes > room:
        raise TooLarge(
            f"the prompt's text ({text} bytes) and decoded media ({media_bytes} bytes) do not fit one "
            f"stage message ({room} bytes)",
            field="messages",
        )
