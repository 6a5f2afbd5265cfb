"""A checkpoint's conversation runs merged per turn (the median over runs), the ratios the issue
names, and its targets with pass or fail: pure functions of the runs' JSON rows."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from omnistream.bench.conversation.workloads import Row

# Targets: turn N's TTFT over turn 2's, with the cache, per checkpoint label (others: OTHER_GROWTH).
TTFT_GROWTH = {"tiny": 1.25, "real-shaped": 1.5}
OTHER_GROWTH = 1.5
MIN_CACHED_SHARE = 0.80


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def merge_turns(runs: Sequence[Sequence[Row]]) -> list[Row]:
    """Per turn over repeated runs of one setting: the median of each number (the runs' values are
    kept as `<key>_runs`); a turn that failed in a run counts in `errors`, not in the medians."""
    count = max((len(r) for r in runs), default=0)
    merged = []
    for i in range(count):
        rows = [r[i] for r in runs if i < len(r)]
        good = [row for row in rows if not row.get("error")]
        out: dict[str, Any] = {"turn": i + 1, "runs": len(rows), "errors": len(rows) - len(good)}
        for key in (
            "ttft_ms",
            "ttfp_ms",
            "e2e_ms",
            "gateway_ttft_ms",
            "tokens_at_first_text",
            "input_tokens",
            "cached_tokens",
            "cached_share",
        ):
            values = [row.get(key) for row in good]
            out[key] = _median(values)
            out[f"{key}_runs"] = values
        merged.append(out)
    return merged


def merge_concurrent(runs: Sequence[Row]) -> Row:
    """Repeated concurrency runs of one setting: the median of each throughput and of the mean
    TTFT (a run that a burst of the shared machine's other load slowed counts as one run, not as
    its share of a mean)."""
    out: dict[str, Any] = {"runs": len(runs)}
    for key in ("audio_throughput", "output_token_throughput", "turn_throughput", "ttft_ms_mean"):
        values = [r[key] for r in runs if r.get(key) is not None]
        out[key] = _median(values)
        out[f"{key}_runs"] = values
    out["turns"] = sum(r.get("turns", 0) for r in runs)
    out["failed"] = sum(r.get("failed", 0) for r in runs)
    return out


def row_of_turn(rows: Sequence[Row], number: int) -> Row | None:
    return next((row for row in rows if row["turn"] == number), None)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def growth(rows: Sequence[Row], last: int | None = None, first: int = 2) -> float | None:
    """Turn `last`'s TTFT (default: the last turn) over turn `first`'s."""
    if not rows:
        return None
    a, b = row_of_turn(rows, last or rows[-1]["turn"]), row_of_turn(rows, first)
    return ratio(a["ttft_ms"] if a else None, b["ttft_ms"] if b else None)


def window_growth(rows: Sequence[Row], width: int = 3) -> float | None:
    """The median TTFT of the last `width` turns over that of turns 2 .. 1 + width: the same
    comparison as `growth`, less at the mercy of one slow turn on a shared machine (not a target)."""
    if len(rows) < 1 + 2 * width:
        return None
    early = _median([r["ttft_ms"] for r in rows if 2 <= r["turn"] <= 1 + width])
    late = _median([r["ttft_ms"] for r in rows[-width:]])
    return ratio(late, early)


def ratios(summary: dict[str, Row]) -> dict[str, float | None]:
    """Every checkpoint's comparisons, by name (conversation.json's `ratios`)."""
    out: dict[str, float | None] = {}
    for label, settings in summary.items():
        on, off = settings.get("on", {}), settings.get("off", {})
        for workload in ("realtime", "rest"):
            for cache, merged in (("on", on), ("off", off)):
                rows = merged.get(workload)
                if not rows:
                    continue
                last = rows[-1]["turn"]
                out[f"{label} {workload} cache {cache}: TTFT turn {last} / turn 2"] = growth(rows)
                out[f"{label} {workload} cache {cache}: TTFT last 3 turns / turns 2-4"] = window_growth(rows)
                out[f"{label} {workload} cache {cache}: cached share at turn {last}"] = rows[-1][
                    "cached_share"
                ]
        if on.get("concurrent") and off.get("concurrent"):
            for key, name in (("audio_throughput", "audio s/s"), ("output_token_throughput", "tok/s")):
                out[f"{label} concurrent: {name} cache on / off"] = ratio(
                    on["concurrent"][key], off["concurrent"][key]
                )
    return out


@dataclass(frozen=True)
class Target:
    name: str
    checkpoint: str
    value: float | None
    limit: float
    at_most: bool  # value <= limit passes (else value >= limit)

    @property
    def passed(self) -> bool:
        if self.value is None:
            return False
        return self.value <= self.limit if self.at_most else self.value >= self.limit

    def line(self) -> str:
        shown = "n/a" if self.value is None else f"{self.value:.3f}"
        sign = "<=" if self.at_most else ">="
        verdict = "PASS" if self.passed else "FAIL"
        return f"{verdict}  [{self.checkpoint}] {self.name}: {shown} ({sign} {self.limit:g})"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"passed": self.passed}


def growth_limit(label: str) -> float:
    return TTFT_GROWTH.get(label, OTHER_GROWTH)


def check_targets(summary: dict[str, Row], tolerance: float = 0.05) -> list[Target]:
    """The issue's targets for each checkpoint's summary ({"on": ..., "off": ...}, each with the
    workloads it ran: per-turn rows for realtime and rest, a merged concurrency run)."""
    targets = []
    for label, settings in summary.items():
        on, off = settings.get("on", {}), settings.get("off", {})
        for workload in ("realtime", "rest"):
            rows = on.get(workload)
            if not rows:
                continue
            last = rows[-1]["turn"]
            targets.append(
                Target(
                    f"{workload}: TTFT turn {last} / turn 2, cache on",
                    label,
                    growth(rows),
                    growth_limit(label),
                    True,
                )
            )
            targets.append(
                Target(
                    f"{workload}: cached share of the input at turn {last}, cache on",
                    label,
                    rows[-1]["cached_share"],
                    MIN_CACHED_SHARE,
                    False,
                )
            )
        if on.get("concurrent") and off.get("concurrent"):
            conc = on["concurrent"].get("concurrency", "N")
            targets.append(
                Target(
                    f"concurrent (c{conc}): audio s/s cache on / off (tolerance {tolerance:g})",
                    label,
                    ratio(on["concurrent"]["audio_throughput"], off["concurrent"]["audio_throughput"]),
                    1.0 - tolerance,
                    False,
                )
            )
    return targets


def summarize_runs(runs: Sequence[Row]) -> dict[str, Row]:
    """{"on": {...}, "off": {...}} of one checkpoint's runs, each workload merged over its runs."""
    out: dict[str, Row] = {}
    for setting in ("on", "off"):
        mine = [r for r in runs if r["cache"] == setting]
        if not mine:
            continue
        merged: dict[str, Any] = {}
        for workload in ("realtime", "rest"):
            turn_runs = [r[workload] for r in mine if r.get(workload) is not None]
            if turn_runs:
                merged[workload] = merge_turns(turn_runs)
        concurrent = [r["concurrent"] for r in mine if r.get("concurrent") is not None]
        if concurrent:
            merged["concurrent"] = merge_concurrent(concurrent) | {
                "concurrency": concurrent[0].get("concurrency"),
                "turns_each": concurrent[0].get("turns_each"),
            }
        out[setting] = merged
    return out
