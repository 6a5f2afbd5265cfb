"""The markdown table `tools/gpu-check --all` prints and writes: per checkpoint, ms per thinker token,
talker frame and Code2Wav chunk by batch size, RTF and TTFP through `omnistream up` by concurrency,
parity against transformers, and vLLM-Omni's published figures beside them.

It is rendered from the run's JSON alone, so a run cut short (or its JSON read back later) renders
the same way: a cell not measured says why (skipped, error) instead of leaving a hole.
"""

from __future__ import annotations

from typing import Any

from omnistream.bench.gpu_check.published import SOURCE, figures

# (row key, part, what the row measures); the key is the part's own key for its cells.
ROWS = (
    ("thinker_ms_per_token", "steps", "thinker ms/token (decode), batch"),
    ("talker_ms_per_frame", "steps", "talker ms/frame, batch"),
    ("code2wav_ms_per_chunk", "steps", "Code2Wav ms/chunk (25 frames), batch"),
    ("thinker_ms_per_token_grouped_mm", "experts", "thinker ms/token, experts grouped_mm, batch"),
    ("thinker_ms_per_token_fixed", "experts", "thinker ms/token, experts fixed, batch"),
    ("talker_ms_per_frame_grouped_mm", "experts", "talker ms/frame, experts grouped_mm, batch"),
    ("talker_ms_per_frame_fixed", "experts", "talker ms/frame, experts fixed, batch"),
    ("rtf", "served", "RTF via `omnistream up` (mean), concurrency"),
    ("ttfp_ms", "served", "TTFP ms via `omnistream up` (mean), concurrency"),
)


def number(value: float) -> str:
    """Three significant figures or whole numbers: what a step time or an RTF needs to compare."""
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def cell(value: Any) -> str:
    """One measurement as a table cell: a number, or why there is none."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return number(value)
    if isinstance(value, dict):
        if "skipped" in value:
            return "skipped"
        if "error" in value:
            return "error"
    return "n/a" if value is None else str(value)


def _served_cell(value: Any, key: str) -> str:
    """A served cell's `key` ("rtf", "ttfp_ms"), with its failed and refused requests where any."""
    if not isinstance(value, dict) or "rtf" not in value:
        return cell(value)
    text = cell(value[key])
    lost = [f"{value[n]} {n}" for n in ("failed", "refused") if value.get(n)]
    return f"{text} ({', '.join(lost)})" if lost else text


def _part_cells(part: dict[str, Any] | None, key: str, columns: list[int]) -> list[str]:
    """The row's cells from its part: each column's value, or the part's own fate for all."""
    if part is None:
        return ["" for _ in columns]
    if "skipped" in part:
        return ["skipped" for _ in columns]
    if not part.get("ok", False):
        return ["error" for _ in columns]
    if key in ("rtf", "ttfp_ms"):
        cells = part.get("cells", {})
        return [_served_cell(cells[str(c)], key) if str(c) in cells else "" for c in columns]
    values = part.get(key, {})
    return [cell(values[str(c)]) if str(c) in values else "" for c in columns]


def parity_cell(part: dict[str, Any] | None) -> str:
    """tokens and codes equal (of the prompts), the audio's largest difference, batch invariance."""
    if part is None:
        return ""
    if "skipped" in part:
        return "skipped"
    if not part.get("ok", False):
        return "error"
    diff = part["audio_max_abs_diff"]
    n = part["prompts"]
    calls = sum(row.get("codes_compared", "all") != "all" for row in part.get("per_prompt", []))
    return (
        f"tokens {part['tokens_equal']}/{n}, codes {part['codes_equal']}/{n} equal"
        f"{f' ({calls} up to a tool call, unspoken by design)' if calls else ''}; "
        f"audio max diff {'n/a' if diff is None else f'{diff:.1e}'}; "
        f"batched {'invariant' if part['batch_invariant'] else 'DIFFERS'}"
    )


def seconds(part: dict[str, Any] | None) -> str:
    return "" if part is None or "seconds" not in part else f"{part['seconds']:.1f}"


def render(results: dict[str, Any]) -> str:
    """The whole table, with a line above saying what ran where and the source of vLLM-Omni's column."""
    settings = results["settings"]
    columns = sorted({*settings["batches"], *settings["concurrencies"]})
    parts = results["parts"]
    header = ["checkpoint", "measure", *(str(c) for c in columns), "vLLM-Omni (published)", "part s"]
    sizes, served = settings["sizes"], settings["sizes"]["served"]
    lines = [
        f"device {results['device']}, torch {results['torch']}; step times and `omnistream up` in "
        f"{settings['dtype']}, the talker's CUDA graphs {results.get('cuda_graphs', 'default')}; "
        f"steps: median of {sizes['steps']} after {sizes['warmup']}, sampled requests; parity: greedy, "
        f"float32; `omnistream up`: {served['input_len']}-id prompts, {served['output_len']} tokens and "
        f"{served['audio_frames']} frames ({served['audio_frames'] * 0.08:g} s of audio) an answer, async "
        f"chunk, max(concurrency, {served['min_requests']}) requests a cell",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---", "---", *("---:" for _ in columns), "---", "---:"]) + "|",
    ]
    for label in settings["checkpoints"]:
        for key, part_name, measure in ROWS:
            part = parts.get(f"{label}/{part_name}")
            row = [label, measure, *_part_cells(part, key, columns), figures(key), seconds(part)]
            lines.append("| " + " | ".join(row) + " |")
        part = parts.get(f"{label}/parity")
        blank = ["" for _ in columns[1:]]
        row = [label, "parity vs transformers (float32)", parity_cell(part), *blank, "", seconds(part)]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", f"vLLM-Omni: {SOURCE}, its own workload; none is cited at the other sizes."]
    lines.append(
        f"elapsed {results.get('elapsed_s', 0):.1f} s of a {settings['budget_s']:g} s budget "
        "(part s: the wall time of the part the row comes from)"
    )
    return "\n".join(lines)
