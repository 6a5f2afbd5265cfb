"""Runs of `omnistream bench --conversation` as their JSON rows, made up for the unit tests of
the summary and the tables."""

from __future__ import annotations

from omnistream.bench.conversation.summary import summarize_runs
from omnistream.bench.conversation.workloads import Turn


def turn_rows(ttfts: list[float], cached_share: float = 0.9, error_at: int | None = None) -> list[dict]:
    """A run's turns with these TTFTs (ms) and cached share; turn `error_at` failed."""
    rows = []
    for i, ttft in enumerate(ttfts, 1):
        tokens = 50 * i
        turn = Turn(i, ttft, ttft + 40.0, ttft + 200.0, tokens, round(cached_share * tokens), 16, 1.9)
        if i == error_at:
            turn.error = "boom"
        rows.append(turn.as_dict())
    return rows


def checkpoint_summary(on_ttfts, off_ttfts, on_share=0.9, on_audio=10.0, off_audio=10.0) -> dict:
    """One checkpoint's summary of a run a setting, every workload, the concurrency run included."""

    def run(cache, ttfts, share, audio):
        conc = {"concurrency": 10, "turns_each": 10, "audio_throughput": audio,
                "output_token_throughput": 8 * audio, "turn_throughput": audio / 2, "ttft_ms_mean": 30.0,
                "turns": 100, "failed": 0}  # fmt: skip
        rows = turn_rows(ttfts, share)
        return {"cache": cache, "realtime": rows, "rest": rows, "concurrent": conc}

    runs = [run("on", on_ttfts, on_share, on_audio), run("off", off_ttfts, 0.0, off_audio)]
    return summarize_runs(runs)
