"""vLLM-Omni's published figures that this repository's docs already cite, for the table's last
column: only those, each with where it comes from, so the comparison can be checked.

docs/benchmarks.md ("The seed's matrix"): "The anchor (vLLM-Omni, 30B, H800): async TTFP 523 / 786 /
1,629 ms, RTF 0.22 / 0.29 / 0.41" at concurrency 1 / 4 / 10 (seed 000's figures, Qwen3-Omni-30B-A3B
with async chunk on one H800). No per-step figure (ms per token, frame or chunk) is cited anywhere,
so those rows have none; nor is any at concurrency 16 or 64.
"""

from __future__ import annotations

SOURCE = "vLLM-Omni, Qwen3-Omni-30B-A3B, async chunk, one H800 (seed 000; docs/benchmarks.md)"
# measure (the table's row key) -> concurrency -> figure
VLLM_OMNI: dict[str, dict[int, float]] = {
    "rtf": {1: 0.22, 4: 0.29, 10: 0.41},
    "ttfp_ms": {1: 523.0, 4: 786.0, 10: 1629.0},
}


def figures(measure: str) -> str:
    """The published figures of `measure` as one table cell ("" when none is cited), e.g.
    "0.22 (c1), 0.29 (c4), 0.41 (c10)"."""
    cited = VLLM_OMNI.get(measure)
    if not cited:
        return ""
    return ", ".join(f"{value:,g} (c{conc})" for conc, value in cited.items())
