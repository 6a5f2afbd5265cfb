"""What every model of a client event's contents shares (gateway/realtime/events.py,
settings.py, client_items.py): one place for the leniency and the bounds, so a session.update
and a created item refuse alike.

Unknown fields inside a session, a response or an item are ignored (OpenAI adds fields often:
tracing, include, noise_reduction...), but every field we use is strictly typed.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field

LENIENT = ConfigDict(extra="ignore", strict=True)
MAX_TEXT = 100_000  # characters of instructions or of one text part
Id = Annotated[str, Field(min_length=1, max_length=64)]
