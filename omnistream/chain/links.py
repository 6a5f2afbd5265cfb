"""The three links a chain runs through: what `ChainRun` asks of a stage, whatever carries it.

A link is one request's connection to one stage: over gRPC (the gateway) or to an engine in this
process (the pipeline). It names its own failures (an OmniError with its stage), and a write that
became moot because its stage already ended is its own business: the stage's output says how it
ended. Structural, like omnistream/engine/api.py: a link conforms by having the members.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from omnistream.request.stage_outputs import AudioOut, CodecOut, ThinkerOut


class ThinkerLink(Protocol):
    async def open(self) -> None:
        """Send the request (its prompt is the whole input: nothing follows)."""
        ...

    def outputs(self) -> AsyncIterator[ThinkerOut]: ...

    def close(self) -> None:
        """Abandon the request at the stage (idempotent; a finished one is already gone)."""
        ...


class TalkerLink(Protocol):
    async def open(self) -> None:
        """Send the open message; returns once the stage accepted it, raises its refusal."""
        ...

    async def feed(self, piece: ThinkerOut) -> None: ...

    async def end_input(self) -> None: ...

    def outputs(self) -> AsyncIterator[CodecOut]: ...

    def close(self) -> None: ...


class Code2WavLink(Protocol):
    async def open(self) -> None:
        """Send the open message; returns once the stage accepted it, raises its refusal."""
        ...

    async def feed(self, piece: CodecOut) -> None: ...

    async def end_input(self) -> None: ...

    def outputs(self) -> AsyncIterator[AudioOut]: ...

    def close(self) -> None: ...
