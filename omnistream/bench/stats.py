"""Per-request measurements and their summary, as `vllm bench serve` defines the metrics."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnistream.audio.listener import CONTINUITY_THRESHOLD_S, AudioArrival, Listening, listen

METRICS = ("ttft", "tpot", "itl", "ttfp", "e2e", "rtf")
# underrun_ms: vLLM-Omni's audio_underrun per request (= total stall); stall_ms the same per-request
# numbers, reported by their mean; longest_stall_ms: each request's longest single wait.
LISTENER_KEYS = ("underrun_ms", "stall_ms", "longest_stall_ms")
METRIC_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "ttfp_ms", "e2e_ms", "rtf", *LISTENER_KEYS)


@dataclass
class RequestResult:
    ok: bool = False
    error: str = ""
    start: float = 0.0
    token_times: list[float] = field(default_factory=list)  # arrival time of each text chunk
    tokens: int = 0
    first_audio: float | None = None
    last_audio: float | None = None
    audio_seconds: float = 0.0
    audio_chunks: list[AudioArrival] = field(default_factory=list)  # every non-empty audio chunk
    end: float = 0.0
    # What the answer said and the usage the server reported with it (REST: its last chunk), where
    # the client reads them: the text a conversation sends back as the assistant's turn, the prompt
    # tokens and how many of them came from the prefix cache.
    text: str = ""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None

    def add_audio(self, now: float, samples: int, sample_rate: int) -> None:
        """One audio chunk arrived at `now`: TTFP, RTF and the listener all read from here. An empty
        chunk is not audio (the listener's rule), so it neither starts TTFP nor counts."""
        if samples <= 0:
            return
        self.first_audio = self.first_audio if self.first_audio is not None else now
        self.last_audio = now
        self.audio_seconds += samples / sample_rate
        self.audio_chunks.append(AudioArrival(now, samples, sample_rate))

    def listening(self, threshold_s: float = CONTINUITY_THRESHOLD_S) -> Listening:
        return listen(self.audio_chunks, threshold_s)

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.start if self.token_times else None

    @property
    def tpot(self) -> float | None:
        if self.tokens < 2 or not self.token_times:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (self.tokens - 1)

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False)]

    @property
    def ttfp(self) -> float | None:
        return self.first_audio - self.start if self.first_audio is not None else None

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def rtf(self) -> float | None:
        if self.last_audio is None or self.audio_seconds <= 0:
            return None
        return (self.last_audio - self.start) / self.audio_seconds


STATS = ("mean", "median", "p90", "p99", "std")


def _describe(values: list[float], scale: float) -> dict[str, float | int | None]:
    """Summary of one metric's samples. No sample (e.g. no inter-token gap because every request's
    text arrived in one chunk) is said explicitly: `samples` 0 and None (JSON null) for each
    statistic, never NaN dressed up as a number."""
    if not values:
        return {"samples": 0, **dict.fromkeys(STATS)}
    arr = np.asarray(values) * scale
    return {
        "samples": len(values),
        "mean": float(arr.mean()),
        "median": float(np.median(arr)),
        "p90": float(np.percentile(arr, 90)),
        "p99": float(np.percentile(arr, 99)),
        "std": float(arr.std()),
    }


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def listener_summary(heard: list[Listening]) -> dict[str, Any]:
    """The cell's listener numbers over the requests that had audio: how many stalled at least once,
    how many kept continuity (vLLM-Omni's "streaming continuity OK rate"), and the per-request
    underrun, total and longest stall distributions (ms). Counts are kept so runs pool exactly."""
    ms = 1000.0
    stalled = sum(1 for h in heard if h.stalls)
    continuous = sum(1 for h in heard if h.continuity_ok)
    return {
        "listened": len(heard),
        "stalled_requests": stalled,
        "continuous_requests": continuous,
        "stalled_share": _share(stalled, len(heard)),
        "continuity_rate": _share(continuous, len(heard)),
        # how the audio was cut (the chunk schedule's effect): non-empty chunks per request
        "audio_chunks_per_request": statistics.mean([h.chunks for h in heard]) if heard else None,
        "underrun_ms": _describe([h.underrun_s for h in heard], ms),
        "stall_ms": _describe([h.stall_s for h in heard], ms),
        "longest_stall_ms": _describe([h.longest_stall_s for h in heard], ms),
    }


def refused(error: str) -> bool:
    """Did admission turn the request away (429 / RESOURCE_EXHAUSTED), as opposed to a failure?"""
    return error.startswith(("HTTP 429", "RESOURCE_EXHAUSTED"))


def summarize(
    results: list[RequestResult], duration: float, threshold_s: float = CONTINUITY_THRESHOLD_S
) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    ms = 1000.0
    heard = [h for h in (r.listening(threshold_s) for r in ok) if h.heard]
    summary = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "refused": sum(1 for r in results if not r.ok and refused(r.error)),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "output_token_throughput": sum(r.tokens for r in ok) / duration if duration else 0.0,
        "audio_throughput": sum(r.audio_seconds for r in ok) / duration if duration else 0.0,
        "ttft_ms": _describe([r.ttft for r in ok if r.ttft is not None], ms),
        "tpot_ms": _describe([r.tpot for r in ok if r.tpot is not None], ms),
        "itl_ms": _describe([g for r in ok for g in r.itls], ms),
        "ttfp_ms": _describe([r.ttfp for r in ok if r.ttfp is not None], ms),
        "e2e_ms": _describe([r.e2e for r in ok], ms),
        "rtf": _describe([r.rtf for r in ok if r.rtf is not None], 1.0),
        "audio_seconds_per_request": statistics.mean([r.audio_seconds for r in ok]) if ok else 0.0,
        "continuity_threshold_ms": threshold_s * ms,
        **listener_summary(heard),
    }
    return summary


def merge_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Combine repeated runs of one cell: means of the per-run means, plus their spread."""
    merged = dict(runs[0])
    for key in METRIC_KEYS:
        # ITL, like vLLM's, pools what exists: runs without a sample do not count as zeros.
        measured = [r[key] for r in runs if r[key].get("samples", 0)]
        if not measured:
            merged[key] = {"samples": 0, **dict.fromkeys(STATS), "run_means": [], "run_spread": None}
            continue
        means = [m["mean"] for m in measured]
        merged[key] = {
            "samples": sum(m["samples"] for m in measured),
            "mean": float(np.mean(means)),
            "median": float(np.mean([m["median"] for m in measured])),
            # the tails: the worse run's (a run from before p90 was kept has none)
            "p90": max((m["p90"] for m in measured if m.get("p90") is not None), default=None),
            "p99": float(np.max([m["p99"] for m in measured])),
            "std": float(np.mean([m["std"] for m in measured])),
            "run_means": means,
            "run_spread": float(np.max(means) - np.min(means)) if len(means) > 1 else 0.0,
        }
    for key in ("request_throughput", "output_token_throughput", "audio_throughput"):
        merged[key] = float(np.mean([r[key] for r in runs]))
    # The shares pool the runs' requests (a run with fewer requests with audio weighs less).
    for count in ("listened", "stalled_requests", "continuous_requests"):
        merged[count] = sum(r[count] for r in runs)
    merged["stalled_share"] = _share(merged["stalled_requests"], merged["listened"])
    merged["continuity_rate"] = _share(merged["continuous_requests"], merged["listened"])
    chunks = [(r["audio_chunks_per_request"], r["listened"]) for r in runs if r["listened"]]
    merged["audio_chunks_per_request"] = (
        sum(c * n for c, n in chunks) / sum(n for _, n in chunks) if chunks else None
    )
    merged["completed"] = sum(r["completed"] for r in runs)
    merged["failed"] = sum(r["failed"] for r in runs)
    merged["refused"] = sum(r.get("refused", 0) for r in runs)
    merged["errors"] = sorted({e for r in runs for e in r["errors"]})[:5]
    merged["runs"] = len(runs)
    return merged
