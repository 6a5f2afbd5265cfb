"""Which audio each thinker replica holds for a cache scope: what the gateway may send as a digest.

A realtime turn's request carries the session's whole history (gateway/realtime/turn.py). The
thinker keeps the audio a scope sent it (omnistream/service/scope_audio.py), so once a replica
has admitted a request with an audio part, the scope's later requests to that replica send that
part as its digest instead of its samples (AudioPart.digest). Known only from the replica's
acceptance (`confirm`, after the request's first output), never assumed; a replica that no longer
has it refuses the open with `MediaExpired`, and the gateway `forget`s what it knew of that replica
and sends the samples again (GatewayCore.open). A scope's entries end with the scope (`release`:
the realtime session closed), and at most `max_entries` (scope, replica) pairs are known, least
recently used dropped first (then their audio is only sent whole again).

Only requests that ask for it refer (`GenerationRequest.refer_audio`: the realtime session's turns,
whose items keep one AudioInput each across turns, so each digest is computed once, here, on the
event loop: ~0.5 ms for a 4 s turn).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from omnistream.request.media import AudioInput, audio_digest, media_of
from omnistream.wire.messages import Referrer

MAX_ENTRIES = 4096


def message_audio(messages: Sequence[Mapping[str, Any]] | None) -> Iterator[AudioInput]:
    """The audio parts of the messages themselves (a video's sound always travels whole)."""
    return (media for media in media_of(messages) if isinstance(media, AudioInput))


class SentAudio:
    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._known: OrderedDict[tuple[bytes, str], set[bytes]] = OrderedDict()
        self._digests: weakref.WeakKeyDictionary[AudioInput, bytes] = weakref.WeakKeyDictionary()

    def digest(self, audio: AudioInput) -> bytes:
        found = self._digests.get(audio)
        if found is None:
            found = self._digests[audio] = audio_digest(audio)
        return found

    def referrer(self, scope: bytes, replica: str) -> Referrer | None:
        """The digest to send for an audio part `replica` holds for `scope`; None: send them all."""
        known = self._known.get((scope, replica)) if scope else None
        if not known:
            return None
        self._known.move_to_end((scope, replica))

        def refer(audio: AudioInput) -> bytes | None:
            digest = self.digest(audio)
            return digest if digest in known else None

        return refer

    def confirm(self, scope: bytes, replica: str, messages: Sequence[Mapping[str, Any]] | None) -> None:
        """`replica` admitted a request of `scope` with these messages: it holds their audio now."""
        if not scope:
            return
        digests = {self.digest(audio) for audio in message_audio(messages)}
        if not digests:
            return
        key = (scope, replica)
        self._known.setdefault(key, set()).update(digests)
        self._known.move_to_end(key)
        while len(self._known) > self.max_entries:
            self._known.popitem(last=False)

    def forget(self, scope: bytes, replica: str) -> None:
        """`replica` refused a digest (MediaExpired): nothing of `scope` is assumed there any more."""
        self._known.pop((scope, replica), None)

    def release(self, scope: bytes) -> None:
        """The scope ended: nothing of it is referred again."""
        for key in [k for k in self._known if k[0] == scope]:
            del self._known[key]
