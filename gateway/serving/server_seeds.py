"""Seeds the gateway chooses for sampled requests that bring none.

A sampled request without a seed used to draw from whatever its engine's generator was seeded with,
so nothing outside that process could say which answer it was on. With the seed chosen here and
written into the request, every stage's random stream is named by the request itself: it is
recorded (the span's `gen_ai.request.seed`), and a run replayed from the request continues the same
answer.

Unset, the gateway's `seed` setting leaves the choice to the OS: every request a fresh seed. Set,
the seed is derived from the setting and the request's content (its messages and media, tools and
knobs; not its cache scope, which is a session's secret), so the same request always gets the same
sampled answer, whatever else is running and in whatever order requests arrive: a deployment whose
sampled answers repeat (tests whose clients cannot send a seed, an operator reproducing a report).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from omnistream.request.generation import GenerationRequest
from omnistream.request.sampling_params import SamplingParams

SEED_LIMIT = 2**63  # SamplingParams.validate's range
# What says how a request travels, not what it asks: no part of the content its seed comes from.
_NOT_CONTENT = frozenset({"cache_scope", "refer_audio", "background", "mode"})


class ServerSeeds:
    def __init__(self, seed: int | None) -> None:
        self._setting = seed

    async def apply(self, request: GenerationRequest) -> GenerationRequest:
        """`request` with a chosen seed wherever it samples without one; the thinker's and the
        talker's streams take the same seed, as a client's lone `seed` gives both
        (omnistream/request/defaults.py). A new request, so the caller's stays as it was built (a
        realtime speculation compares the one it built with the response's)."""
        thinker, talker = request.sampling, request.talker_sampling
        if not _unseeded(thinker) and not (request.return_audio and _unseeded(talker)):
            return request
        if self._setting is None:
            seed = secrets.randbelow(SEED_LIMIT)
        else:  # hashing a request's media is not for the event loop
            seed = await asyncio.to_thread(content_seed, self._setting, request)
        return dataclasses.replace(
            request,
            sampling=dataclasses.replace(thinker, seed=seed) if _unseeded(thinker) else thinker,
            talker_sampling=dataclasses.replace(talker, seed=seed) if _unseeded(talker) else talker,
        )


def content_seed(setting: int, request: GenerationRequest) -> int:
    """The seed a gateway whose setting is `setting` gives `request` (its own seeds left out)."""
    digest = hashlib.sha256(b"omnistream-server-seed\0" + str(setting).encode())
    for f in dataclasses.fields(request):
        if f.name not in _NOT_CONTENT:
            _feed(digest, f.name)
            _feed(digest, _unseeded_copy(getattr(request, f.name)))
    return int.from_bytes(digest.digest()[:8], "little") % SEED_LIMIT


def _unseeded(params: SamplingParams) -> bool:
    return not params.greedy and params.seed is None


def _unseeded_copy(value: Any) -> Any:
    return dataclasses.replace(value, seed=None) if isinstance(value, SamplingParams) else value


def _feed(digest: Any, value: Any) -> None:
    """Every value with its type and its length, so no two different requests read the same."""
    if isinstance(value, np.ndarray):
        _tagged(digest, b"a", f"{value.dtype.str}{value.shape}".encode())
        _tagged(digest, b"d", value.tobytes())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        _tagged(digest, b"c", type(value).__name__.encode())
        for f in dataclasses.fields(value):
            _feed(digest, f.name)
            _feed(digest, getattr(value, f.name))
    elif isinstance(value, Mapping):
        _tagged(digest, b"m", str(len(value)).encode())
        for key in sorted(value, key=str):
            _feed(digest, key)
            _feed(digest, value[key])
    elif isinstance(value, (bytes, bytearray)):
        _tagged(digest, b"b", bytes(value))
    elif isinstance(value, str):
        _tagged(digest, b"s", value.encode())
    elif isinstance(value, Sequence):
        _tagged(digest, b"l", str(len(value)).encode())
        for item in value:
            _feed(digest, item)
    else:  # numbers, booleans, None, enums
        _tagged(digest, b"v", f"{type(value).__name__}:{value!r}".encode())


def _tagged(digest: Any, tag: bytes, data: bytes) -> None:
    digest.update(tag + len(data).to_bytes(8, "little"))
    digest.update(data)
