"""The benchmark's outputs: the seed's table, JSON, CSV and PNG plots."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omnistream.bench.stats import METRIC_KEYS, STATS

SUMMARY_FIELDS = ("samples", *STATS, "run_spread")  # a metric's columns in the CSV

COLUMNS = [
    ("target", "target"),
    ("async", "async chunk"),
    ("concurrency", "conc"),
    ("completed", "ok"),
    ("failed", "fail"),
    ("refused", "429"),
    ("e2e_ms", "E2E ms"),
    ("ttft_ms", "TTFT ms"),
    ("tpot_ms", "TPOT ms"),
    ("ttfp_ms", "TTFP ms"),
    ("ttfp_p90", "TTFP p90 ms"),
    ("rtf", "RTF"),
    ("itl_ms", "ITL ms"),
]


def _cell(row: dict[str, Any], key: str) -> str:
    if key == "ttfp_p90":  # the tail a burst's last listeners wait (the worse run's)
        return _number(row["ttfp_ms"].get("p90"))
    value = row[key]
    if isinstance(value, dict):
        if value["mean"] is None:
            return "n/a"  # no sample in this cell (e.g. ITL when all text came in one chunk)
        spread = value.get("run_spread")
        fmt = "{:.3f}" if key == "rtf" else "{:.1f}"
        text = fmt.format(value["mean"])
        if spread:
            text += " ±" + fmt.format(spread / 2)
        return text
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


# What the listener heard (omnistream/audio/listener.py), over the requests with audio.
LISTENER_COLUMNS = ("stalled", "continuity", "underrun p50 ms", "underrun p99 ms", "stall ms")


def _percent(share: float | None) -> str:
    return "n/a" if share is None else f"{100 * share:.0f}%"


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def listener_cells(row: dict[str, Any]) -> list[str]:
    """Stalled share and continuity rate (pooled over the runs), the underrun's p50 and p99 (mean
    of the runs' medians, worst run's p99) and the mean total stall per request."""
    return [
        _percent(row["stalled_share"]),
        _percent(row["continuity_rate"]),
        _number(row["underrun_ms"]["median"]),
        _number(row["underrun_ms"]["p99"]),
        _cell(row, "stall_ms"),
    ]


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table in the seed's shape (means; ± half the spread between repeated runs), then
    the listener's columns."""
    titles = [title for _, title in COLUMNS] + ["req/s", "tok/s", "audio s/s", *LISTENER_COLUMNS]
    head = "| " + " | ".join(titles) + " |"
    sep = "|" + "---|" * len(titles)
    lines = [head, sep]
    for row in rows:
        cells = [_cell(row, key) for key, _ in COLUMNS]
        cells += [
            f"{row['request_throughput']:.2f}",
            f"{row['output_token_throughput']:.1f}",
            f"{row['audio_throughput']:.2f}",
        ]
        cells += listener_cells(row)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_json(path: Path, payload: dict[str, Any]) -> None:
    # allow_nan=False: a NaN reaching the results is a bug to surface, not a number to print.
    path.write_text(json.dumps(payload, indent=2, default=str, allow_nan=False))


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    fields = [
        "target",
        "async",
        "concurrency",
        "completed",
        "failed",
        "refused",
        "request_throughput",
        "output_token_throughput",
        "audio_throughput",
        "continuity_threshold_ms",
        "listened",
        "stalled_requests",
        "continuous_requests",
        "stalled_share",
        "continuity_rate",
        "audio_chunks_per_request",
    ]
    metric_fields = [f"{m}_{s}" for m in METRIC_KEYS for s in SUMMARY_FIELDS]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields + metric_fields)
        writer.writeheader()
        for row in rows:
            out = {k: "" if row[k] is None else row[k] for k in fields}  # empty: no request had audio
            for m in METRIC_KEYS:
                for s in SUMMARY_FIELDS:
                    value = row[m].get(s)
                    out[f"{m}_{s}"] = "" if value is None else value  # empty cell: no sample
            writer.writerow(out)


def _percent_of(key: str) -> Callable[[dict[str, Any]], float | None]:
    return lambda row: None if row[key] is None else 100 * row[key]


# (file suffix, y label, the value of a row; None: no sample, no point)
PLOTS: tuple[tuple[str, str, Callable[[dict[str, Any]], float | None]], ...] = (
    ("ttfp", "mean TTFP (ms)", lambda row: row["ttfp_ms"]["mean"]),
    ("rtf", "mean RTF", lambda row: row["rtf"]["mean"]),
    ("e2e", "mean E2E (ms)", lambda row: row["e2e_ms"]["mean"]),
    ("stalled", "requests that stalled (%)", _percent_of("stalled_share")),
    ("continuity", "continuity OK rate (%)", _percent_of("continuity_rate")),
    ("underrun", "underrun p99 (ms)", lambda row: row["underrun_ms"]["p99"]),
)


def plot(path_prefix: Path, rows: list[dict[str, Any]]) -> list[Path]:
    """TTFP, RTF and E2E against concurrency, one line per target and async setting (as the seed),
    and the listener's stalled share, continuity rate and underrun p99 the same way."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, label, value in PLOTS:
        fig, ax = plt.subplots(figsize=(6, 4))
        series: dict[tuple[str, bool], list[tuple[int, float]]] = {}
        for row in rows:
            y = value(row)
            if y is not None:
                series.setdefault((row["target"], row["async"]), []).append((row["concurrency"], y))
        for (target, async_chunk), points in sorted(series.items()):
            points.sort()
            ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                marker="o",
                label=f"{target}, async chunk {'on' if async_chunk else 'off'}",
            )
        ax.set_xlabel("max concurrency")
        ax.set_ylabel(label)
        ax.set_xticks(sorted({row["concurrency"] for row in rows}))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        out = path_prefix.parent / f"{path_prefix.name}_{name}.png"
        fig.savefig(out, dpi=110)
        plt.close(fig)
        written.append(out)
    return written
