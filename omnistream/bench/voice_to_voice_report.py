"""The voice-to-voice bench's turns and cells, each cell as a row (median and p90 of each time) and
the rows as a markdown table (omnistream/bench/voice_to_voice.py measures them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from omnistream.bench.stats import _describe

if TYPE_CHECKING:
    from omnistream.bench.speech import Utterance

METRICS = ("v2v_ms", "detector_ms", "after_detector_ms", "detector_end_ms", "first_chunk_ms")


@dataclass
class Turn:
    mode: str
    session: int
    turn: int
    speech_s: float
    v2v_ms: float | None = None
    detector_ms: float | None = None
    after_detector_ms: float | None = None
    detector_end_ms: float | None = None
    continuity_ok: bool | None = None  # response.done's: None without audio
    first_chunk_ms: float | None = None  # response.done's: the first chunk the audio planner chose
    status: str = ""
    error: str = ""


@dataclass(frozen=True)
class Cell:
    mode: str
    seconds: float  # as asked
    sessions: int


def summarize(
    cell: Cell, speech: Utterance, window_ms: int, turns: list[Turn], speculations: dict[str, float] | None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "mode": cell.mode,
        "seconds": cell.seconds,
        "speech_s": speech.seconds,
        "text": speech.text,
        "sessions": cell.sessions,
        "window_ms": window_ms if cell.mode == "server_vad" else None,
        "turns": len(turns),
        "failed": sum(1 for t in turns if t.error or t.v2v_ms is None),
        "errors": sorted({t.error for t in turns if t.error})[:5],
    }
    for name in METRICS:
        out[name] = _describe([v for t in turns if (v := getattr(t, name)) is not None], 1.0)
    judged = [t.continuity_ok for t in turns if t.continuity_ok is not None]
    out["continuity"] = sum(judged) / len(judged) if judged else None
    out["speculations"] = speculations  # outcome -> count over the cell (None: not read)
    out["per_turn"] = [asdict(t) for t in turns]
    return out


def _pair(stats: dict[str, Any]) -> str:
    if not stats.get("samples"):
        return "-"
    return f"{stats['median']:.0f} / {stats['p90']:.0f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _outcomes(counts: dict[str, float] | None) -> str:
    if counts is None:
        return "-"
    return ", ".join(f"{k} {v:.0f}" for k, v in sorted(counts.items()) if v) or "none"


def table(rows: list[dict[str, Any]]) -> str:
    """The cells as a markdown table: median / p90 of each time (ms)."""
    lines = [
        "| mode | speech s | sessions | turns ok | v2v ms | detector ms | after detector ms "
        "| detector end ms | first chunk ms | continuity | speculations |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        mode = f"server_vad {r['window_ms']} ms" if r["mode"] == "server_vad" else r["mode"]
        lines.append(
            f"| {mode} | {r['speech_s']:.2f} | {r['sessions']} | {r['turns'] - r['failed']}/{r['turns']} | "
            + " | ".join(_pair(r[name]) for name in METRICS)
            + f" | {_share(r['continuity'])} | {_outcomes(r['speculations'])} |"
        )
    note = "median / p90 of the turns; times from the end of speech at the client"
    if any(r.get("interleaved") for r in rows):
        note += "; the lengths of a mode and session count took turns, and share its speculations"
    return "\n".join(lines) + f"\n\n({note})\n"
