"""How much of the thinker's context a realtime conversation takes, and which items go when the
next turn would not fit.

A session keeps its whole history and re-sends it every turn: the thinker's prefix cache (keyed by
content) finds the previous turns' KV, so only what is new is prefilled. Dropping an item from the
front breaks that cached prefix, so items are dropped only when the next prompt would not fit:
before each response, when the history's tokens plus the answer's `max_output_tokens` would pass
the context (the thinker's max_model_len, the smallest its replicas in rotation report, capped by
the gateway's `realtime_context_tokens`), the oldest items go, one by one, until it fits; never the
newest user item nor what follows it, nor a system item (instructions). A dropped item is gone for
good (`conversation.item.deleted`, logged, counted). If even without every item that may go the
turn would not fit, nothing is dropped and the response is refused (`context_length_exceeded`).

Counting. The thinker counts every prompt exactly and says so in `response.done`
(`usage.input_tokens`): that count is shared out over the messages it was made of, so each item
carries the tokens its message took (a chat message's tokens do not depend on its neighbours).
Only what the thinker has not counted yet is estimated, with bounds meant to be high:
  * text: one token per UTF-8 byte at most (byte-level BPE), plus the message's template tokens;
  * audio: Qwen3-Omni's encoder makes 13 tokens of each 100 mel frames (1 s of 16 kHz audio at the
    10 ms hop), counted per started window, plus its two markers;
  * an image: one token per `vision_factor`² pixels of its decoded (resized) size, plus markers;
  * an answer: the tokens the thinker generated for it (its text re-tokenizes to about as many),
    at most its UTF-8 bytes.
When a measured prompt is shared out, what has a near-exact estimate (answers) gets it, the rest
goes to the others in proportion to their estimates. Deleting an item removes its tokens; a
truncated answer, or a system message whose text changed, is estimated again.

If the thinker still refuses a prompt as too long (an estimate was low, e.g. an image on a model
with a smaller vision patch), its refusal names the prompt's exact length: that count is taken as a
measurement, the oldest items are dropped to fit it, and the turn is sent once more; a second
refusal fails the response with the thinker's message.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from gateway.media.limits import VISION_FACTOR, MediaLimits
from gateway.realtime.conversation import Conversation, Item, utf8_len
from gateway.realtime.turn import message_of, system_text
from omnistream.request.errors import OmniError
from omnistream.request.media import AudioInput, ImageInput

# `omnistream serve thinker --max-model-len`'s default: the context of a thinker that reports none.
DEFAULT_CONTEXT_TOKENS = 4096
# ChatML: <|im_start|> role \n ... <|im_end|> \n around each message; the generation prompt
# <|im_start|> assistant \n after the last one (the roles are single tokens in Qwen's vocabulary).
MESSAGE_TOKENS = 5
REPLY_PROMPT_TOKENS = 3
MEDIA_MARKERS = 2  # <|audio_start|> ... <|audio_end|>, <|vision_start|> ... <|vision_end|>
# Qwen3-Omni's audio encoder (n_window 50): 13 tokens per window of 100 mel frames of 10 ms.
AUDIO_FRAMES_PER_SECOND = 100
AUDIO_WINDOW_FRAMES = 100
AUDIO_WINDOW_TOKENS = 13
# An answer's text re-tokenizes to about the tokens generated (its end-of-turn token among them).
ANSWER_SLACK = 2
# A function call's or result's markup around its text: `<tool_call>\n{"name": "", "arguments": }
# \n</tool_call>` (under 20 tokens), `<tool_response>\n\n</tool_response>` (a few).
CALL_MARKUP_TOKENS = 20
CONTEXT_EXCEEDED = "context_length_exceeded"


def audio_tokens(seconds: float) -> int:
    """At least the tokens `seconds` of audio take in a prompt (markers included)."""
    frames = math.ceil(seconds * AUDIO_FRAMES_PER_SECOND) + 1  # the feature extractor may add one
    return AUDIO_WINDOW_TOKENS * math.ceil(frames / AUDIO_WINDOW_FRAMES) + MEDIA_MARKERS


def image_tokens(height: int, width: int, factor: int = VISION_FACTOR) -> int:
    return math.ceil(height / factor) * math.ceil(width / factor) + MEDIA_MARKERS


def _part_tokens(part: dict[str, Any], item: Item) -> int:
    kind = part["type"]
    media = part.get(kind)
    if kind == "text":
        return utf8_len(part["text"])
    if kind == "audio":
        seconds = media.seconds if isinstance(media, AudioInput) else item.audio_seconds
        return audio_tokens(seconds)
    if kind == "image":
        if isinstance(media, ImageInput):
            return image_tokens(int(media.pixels.shape[0]), int(media.pixels.shape[1]))
        return MediaLimits().image_max_pixels // VISION_FACTOR**2 + MEDIA_MARKERS
    raise ValueError(f"a realtime item holds no {kind} part")


def estimate(item: Item) -> int:
    """The tokens `item`'s message takes in a prompt, estimated high (0: it is in no message)."""
    if message_of(item) is None:
        return 0
    if item.type != "message":  # a function call or its result (its own turn at most)
        return MESSAGE_TOKENS + CALL_MARKUP_TOKENS + utf8_len(item.call_text)
    if item.role == "assistant":
        text = utf8_len(item.text)
        if item.generated_tokens is not None:
            text = min(text, item.generated_tokens + ANSWER_SLACK)
        return MESSAGE_TOKENS + text
    return MESSAGE_TOKENS + sum(_part_tokens(p, item) for p in item.parts)


def item_tokens(item: Item) -> int:
    """What `item` takes in a prompt: as the thinker counted it, else the estimate."""
    if message_of(item) is None:
        return 0
    return item.tokens if item.tokens is not None else estimate(item)


def system_tokens(conversation: Conversation, text: str) -> int:
    if not text:
        return 0
    measured = conversation.system_tokens
    if measured is not None and measured[0] == text:
        return measured[1]
    return MESSAGE_TOKENS + utf8_len(text)


def prompt_tokens(conversation: Conversation, instructions: str | None) -> int:
    """The next prompt's tokens: counted where the thinker counted them, estimated (high) elsewhere."""
    system = system_tokens(conversation, system_text(conversation, instructions))
    return REPLY_PROMPT_TOKENS + system + sum(item_tokens(i) for i in conversation.items.values())


@dataclass(frozen=True)
class PromptShape:
    """What one turn's prompt was made of: the system message's text and each item in a message
    of its own with its revision then (to share out the thinker's count of that prompt)."""

    system: str
    items: tuple[tuple[Item, int], ...]


def shape_of(conversation: Conversation, instructions: str | None) -> PromptShape:
    items = tuple((i, i.revision) for i in conversation.items.values() if message_of(i) is not None)
    return PromptShape(system_text(conversation, instructions), items)


def measure(conversation: Conversation, shape: PromptShape, counted: int) -> bool:
    """Take `counted`, the thinker's count of the prompt `shape` describes, as exact: what the
    messages not counted before take is `counted` less those counted before, shared out. False
    (nothing learnt) when the history changed under it (an item of it deleted or truncated since)
    or the count contradicts what is known."""
    if any(conversation.items.get(i.id) is not i or i.revision != rev for i, rev in shape.items):
        return False
    rest = counted - REPLY_PROMPT_TOKENS
    close: list[tuple[Item | None, int]] = []  # near-exact estimates (answers)
    high: list[tuple[Item | None, int]] = []  # bounds
    if shape.system:
        known = conversation.system_tokens
        if known is not None and known[0] == shape.system:
            rest -= known[1]
        else:
            high.append((None, MESSAGE_TOKENS + utf8_len(shape.system)))
    for item, _ in shape.items:
        if item.tokens is not None:
            rest -= item.tokens
        elif item.role == "assistant" and item.generated_tokens is not None:
            close.append((item, estimate(item)))
        else:
            high.append((item, estimate(item)))
    unknown = close + high
    if not unknown:
        return rest == 0
    if rest < len(unknown):  # every message takes a token at least: the known counts are off
        return False
    shares: list[tuple[Item | None, int]] = []
    for owner, guess in close:
        share = min(guess, rest - (len(unknown) - len(shares) - 1))  # a token left for each after
        shares.append((owner, share))
        rest -= share
    if high:
        total = sum(guess for _, guess in high) or len(high)
        left, remaining = rest, len(high)
        for owner, guess in high:
            remaining -= 1  # each of those after this one keeps a token at least
            share = left if remaining == 0 else max(1, min(left - remaining, rest * guess // total))
            shares.append((owner, share))
            left -= share
    else:  # answers only: the last takes what is left (the sum stays exact)
        owner, share = shares[-1]
        shares[-1] = (owner, share + rest)
    for owner, share in shares:
        if owner is None:
            conversation.system_tokens = (shape.system, share)
        else:
            owner.tokens = share
    return True


class ContextFull(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Drop:
    item: Item
    reason: str  # "context", or the HistoryLimits bound ("message_size", "max_items", ...)


def fit(conversation: Conversation, instructions: str | None, context: int, reserve: int) -> list[Drop]:
    """The oldest items that must go for the next prompt plus `reserve` tokens (the answer's
    max_output_tokens) to fit `context` tokens, and the history to fit its limits (the
    instructions in the same stage message). Drops nothing itself; raises ContextFull when even
    without every item that may go it would not fit (then nothing should go)."""
    tokens = prompt_tokens(conversation, instructions) + reserve
    totals = conversation.totals(instructions or "")
    droppable = conversation.droppable()
    floor_tokens = tokens - sum(item_tokens(i) for i in droppable)
    floor = dataclasses.replace(totals)
    for item in droppable:
        floor.add(item, -1)
    if floor_tokens > context:
        raise ContextFull(
            f"the conversation's newest turn cannot fit the model's context: its prompt takes about "
            f"{floor_tokens - reserve} tokens with the instructions and the items that may not be "
            f"dropped, and the answer's max_output_tokens {reserve} more, over the {context} tokens "
            "of context; send a shorter turn or ask for fewer max_output_tokens"
        )
    reason = floor.over(conversation.limits, hard=True)  # the operator's caps give way to the newest turn
    if reason is not None:
        raise ContextFull(
            f"the conversation's newest turn and instructions cannot be carried to the model "
            f"(over its {reason.replace('_', ' ')} bound) even without the older items"
        )
    drops: list[Drop] = []
    for item in droppable:
        if tokens > context:
            why = "context"
        else:
            why = totals.over(conversation.limits) or ""
            if not why:
                break
        drops.append(Drop(item, why))
        tokens -= item_tokens(item)
        totals.add(item, -1)
    return drops


_PROMPT = re.compile(r"prompt \((\d+) tokens")
_LENGTH = re.compile(r"model length (\d+)")


def overflow_of(error: OmniError) -> tuple[int | None, int | None] | None:
    """(the prompt's tokens, the model length) the thinker named when it refused a prompt as too
    long for its context (either may be None if not named); None for any other error. The thinker's
    refusals read "prompt (N tokens) + max_tokens (M) exceeds the model length L" and "the prompt
    (N tokens with its media) exceeds the model length L" (omnistream/models/qwen3_omni/thinker)."""
    if error.kind != "invalid_request" or "model length" not in error.message:
        return None
    prompt, length = _PROMPT.search(error.message), _LENGTH.search(error.message)
    return (int(prompt[1]) if prompt else None, int(length[1]) if length else None)
