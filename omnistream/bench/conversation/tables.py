"""The markdown of `omnistream bench --conversation` (conversation.md): per checkpoint and workload
the per-turn table and its ratios, the concurrency table, then every target."""

from __future__ import annotations

from collections.abc import Sequence

from omnistream.bench.conversation.summary import Target, growth, row_of_turn, window_growth
from omnistream.bench.conversation.workloads import Row

SHOWN_TURNS = (1, 2, 5, 10, 15, 20)


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def turn_table(on: Sequence[Row], off: Sequence[Row], shown: Sequence[int] = SHOWN_TURNS) -> str:
    """Markdown: the chosen turns (and the last), cache on beside cache off."""
    count = max([r["turn"] for r in [*on, *off]], default=0)
    turns = sorted({t for t in shown if t <= count} | ({count} if count else set()))
    # Realtime: the gateway's own TTFT (to the first token, text or not) and how many tokens had come
    # when the first text did (the client's TTFT waits for them).
    gateway = any(r.get("gateway_ttft_ms") is not None for r in on)
    lines = [
        "| turn | TTFT on ms | TTFT off ms | TTFP on ms | TTFP off ms | input tokens | cached on | "
        "cached share on | cached off |"
        + (" gateway TTFT on ms | tokens at first text on |" if gateway else ""),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if gateway else ""),
    ]
    for t in turns:
        a, b = row_of_turn(on, t) or {}, row_of_turn(off, t) or {}
        lines.append(
            f"| {t} | {_num(a.get('ttft_ms'))} | {_num(b.get('ttft_ms'))} | {_num(a.get('ttfp_ms'))} | "
            f"{_num(b.get('ttfp_ms'))} | {_num(a.get('input_tokens') or b.get('input_tokens'), '{:.0f}')} | "
            f"{_num(a.get('cached_tokens'), '{:.0f}')} | {_pct(a.get('cached_share'))} | "
            f"{_num(b.get('cached_tokens'), '{:.0f}')} |"
            + (
                f" {_num(a.get('gateway_ttft_ms'))} | {_num(a.get('tokens_at_first_text'), '{:g}')} |"
                if gateway
                else ""
            )
        )
    return "\n".join(lines)


def concurrent_table(on: Row | None, off: Row | None) -> str:
    lines = [
        "| cache | conversations x turns | failed | audio s/s | output tok/s | turns/s | TTFT mean ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in (("on", on), ("off", off)):
        if not row:
            continue
        runs = ", ".join(f"{v:.2f}" for v in row["audio_throughput_runs"])
        lines.append(
            f"| {name} | {row.get('concurrency', '?')} x {row.get('turns_each', '?')} | {row['failed']} | "
            f"{_num(row['audio_throughput'], '{:.2f}')} ({runs}) | "
            f"{_num(row['output_token_throughput'])} | {_num(row['turn_throughput'], '{:.2f}')} | "
            f"{_num(row['ttft_ms_mean'])} |"
        )
    return "\n".join(lines)


def report(summary: dict[str, Row], targets: Sequence[Target]) -> str:
    """The markdown report: per checkpoint and workload the per-turn table and its ratios, the
    concurrency table, then every target with pass/fail."""
    parts = []
    for label, settings in summary.items():
        on, off = settings.get("on", {}), settings.get("off", {})
        for workload in ("realtime", "rest"):
            if not (on.get(workload) or off.get(workload)):
                continue
            a, b = on.get(workload) or [], off.get(workload) or []
            last = max(r["turn"] for r in [*a, *b])
            parts.append(f"### {label}: {workload}, {last} turns (median of the runs per turn)\n")
            parts.append(turn_table(a, b))
            parts.append(
                f"\nTTFT turn {last} / turn 2: cache on {_num(growth(a), '{:.2f}')}x, "
                f"off {_num(growth(b), '{:.2f}')}x (last 3 turns / turns 2-4: on "
                f"{_num(window_growth(a), '{:.2f}')}x, off {_num(window_growth(b), '{:.2f}')}x); "
                f"cached share at turn {last}: on {_pct(a[-1]['cached_share'] if a else None)}, "
                f"off {_pct(b[-1]['cached_share'] if b else None)}\n"
            )
        if on.get("concurrent") or off.get("concurrent"):
            parts.append(
                f"### {label}: concurrent REST conversations (median of the runs; each run's audio s/s "
                "in brackets, in run order)\n"
            )
            parts.append(concurrent_table(on.get("concurrent"), off.get("concurrent")))
            parts.append("")
    parts.append("### Targets\n")
    parts.extend(f"- {t.line()}" for t in targets)
    return "\n".join(parts) + "\n"
