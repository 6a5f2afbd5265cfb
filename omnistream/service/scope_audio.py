"""The audio a cache scope sent the thinker, kept for its later turns.

A realtime session's every turn carries its whole history, every earlier spoken turn's samples
included: at twenty turns of ~4 s that is 4.5 MB serialized, sent and parsed again for each
response, most of a turn's time to first text on the tiny checkpoint (traced: the thinker's open
grew from 11 to 79 ms over 20 turns while its prefill grew from 10 to 23 ms). So the thinker keeps
each scope's audio, keyed by (scope, digest of the samples, computed here), and the gateway sends
audio it sent this thinker before as its digest (gateway/serving/sent_audio.py). A digest the store
no longer has (evicted, its scope released, the process restarted) is `MediaExpired`, raised before
the request is admitted: the gateway sends the samples again.

The key holds the scope: one session's turns can name only the audio that session sent (a scope is
the gateway's random per-session id; a digest alone, of content someone else sent, finds nothing).
Bounded by bytes, least recently used first; a released scope (ReleaseCache: its session ended)
frees its audio at once. Called from the servicer's tokenizer threads: locked.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from omnistream.request.errors import InvalidRequest, MediaExpired
from omnistream.request.media import AudioInput, AudioRef, audio_digest, parts_of

DEFAULT_BUDGET_BYTES = 256 << 20  # ~70 minutes of 16 kHz float32 audio over all sessions


class ScopeAudio:
    """Audio parts by (scope, digest), LRU within `budget_bytes`."""

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self._kept: OrderedDict[tuple[bytes, bytes], AudioInput] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0  # parts resolved from the store
        self.misses = 0  # parts named by a digest the store did not have
        self.evictions = 0

    @property
    def kept_bytes(self) -> int:
        return self._bytes

    def resolve(self, messages: list[dict[str, Any]], scope: bytes) -> list[dict[str, Any]]:
        """`messages` with every `AudioRef` part replaced by the audio it names, and every audio part
        with samples kept for the scope's later turns (each once: a kept one is only touched).
        MediaExpired for a digest the scope does not hold; InvalidRequest for one without a scope."""
        out: list[dict[str, Any]] = []
        for message in messages:
            content = message["content"]
            if isinstance(content, str):
                out.append(message)
                continue
            parts = [self._part(part, scope) for part in parts_of(content)]
            out.append({**message, "content": parts})
        return out

    def _part(self, part: Mapping[str, Any], scope: bytes) -> Mapping[str, Any]:
        if part["type"] != "audio":
            return part
        audio = part["audio"]
        if isinstance(audio, AudioRef):
            if not scope:
                raise InvalidRequest("an audio digest needs the request's cache scope", field="messages")
            return {**part, "audio": self._take(scope, audio)}
        if scope and isinstance(audio, AudioInput):
            self._keep(scope, audio)
        return part

    def _take(self, scope: bytes, ref: AudioRef) -> AudioInput:
        with self._lock:
            audio = self._kept.get((scope, ref.digest))
            if audio is None or audio.sample_rate != ref.sample_rate:
                self.misses += 1
                raise MediaExpired("the thinker no longer holds that audio; send its samples")
            self._kept.move_to_end((scope, ref.digest))
            self.hits += 1
            return audio

    def _keep(self, scope: bytes, audio: AudioInput) -> None:
        digest = audio_digest(audio)  # outside the lock: it reads every sample
        size = int(audio.samples.nbytes)
        if size > self.budget_bytes:
            return
        key = (scope, digest)
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return
            self._kept[key] = audio
            self._bytes += size
            while self._bytes > self.budget_bytes:
                _, old = self._kept.popitem(last=False)
                self._bytes -= int(old.samples.nbytes)
                self.evictions += 1

    def release(self, scope: bytes) -> int:
        """Drop every part `scope` kept (its session ended); how many."""
        with self._lock:
            keys = [k for k in self._kept if k[0] == scope]
            for key in keys:
                self._bytes -= int(self._kept.pop(key).samples.nbytes)
            return len(keys)


class ScopeAudioCollector(Collector):
    """The store in Prometheus (read at scrape time, like the prefix cache's collector)."""

    def __init__(self, store: ScopeAudio) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        s = self.store
        for name, help_, value in (
            ("hits", "Audio parts sent as a digest and taken from the scope's kept audio", s.hits),
            ("misses", "Audio parts sent as a digest the thinker no longer held (refused: resent)", s.misses),
            ("evictions", "Kept audio parts dropped for the budget (least recently used first)", s.evictions),
        ):
            counter = CounterMetricFamily(f"omnistream_thinker_scope_audio_{name}", help_)
            counter.add_metric([], value)
            yield counter
        gauge = GaugeMetricFamily("omnistream_thinker_scope_audio_bytes", "Bytes of audio kept for scopes")
        gauge.add_metric([], s.kept_bytes)
        yield gauge
