"""What the thinker and talker engine tests of chunked prefill share: a prompt long enough to be
cut into many pieces, and a prefill budget set for a block of requests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from omnistream.engine.settings import EngineSettings

LONG_TEXT = "The sea is wide and deep, and the ships go out in the morning. " * 4


def long_prompt(thinker) -> list[int]:
    return thinker.encode_chat([{"role": "user", "content": LONG_TEXT}])


@contextlib.contextmanager
def prefill_chunk(engine, chunk: int) -> Iterator[None]:
    engine.prefill_chunk = chunk  # read by the scheduler each step; set between requests
    try:
        yield
    finally:
        engine.prefill_chunk = EngineSettings.prefill_chunk  # the default
