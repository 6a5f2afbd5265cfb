"""The benchmark's cell plan and its comparisons: which targets and settings run, in what order (A B
B A), and the ratios between the rows they produce (`omnistream bench` prints and writes them)."""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")


def chunk_schedules(given: str) -> list[str | None]:
    """`--codec-chunk-schedules` as the schedules to run, each its own target; [None] (the request table's
    default, no suffix on the target names) when none is given."""
    from omnistream.request.chunk_plan import SCHEDULES

    names = [s.strip() for s in given.split(",") if s.strip()]
    unknown = [n for n in names if n not in SCHEDULES]
    if unknown:
        raise ValueError(f"unknown chunk schedule {unknown}; choose from {', '.join(SCHEDULES)}")
    if len(set(names)) != len(names):
        raise ValueError(f"a chunk schedule is given twice: {given}")
    chosen: list[str | None] = list(names)
    return chosen or [None]


def audio_holds(given: str) -> list[bool]:
    """`--audio-hold` as the settings to run (True: the default hold), in the order given."""
    names = [s.strip() for s in given.split(",") if s.strip()]
    if not names or any(n not in ("on", "off") for n in names) or len(set(names)) != len(names):
        raise ValueError(f"--audio-hold takes on, off or both (comma list), got {given!r}")
    return [n == "on" for n in names]


def interleave(units: list[T], repeats: int) -> list[T]:
    """`repeats` passes over `units`, every other one reversed (A B B A ...): slow drift of the
    machine then weighs on each unit alike."""
    sequence: list[T] = []
    for i in range(repeats):
        sequence += units if i % 2 == 0 else units[::-1]
    return sequence


def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None (JSON null) where either side has no sample or b is 0."""
    return a / b if a is not None and b else None


def _mean(row: dict[str, Any], key: str) -> float | None:
    """A row's value of `key`: the mean of a described metric, or the number itself."""
    value = row.get(key)
    return value.get("mean") if isinstance(value, dict) else value


def ratios(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    def get(target: str, async_chunk: bool, conc: int) -> dict[str, Any] | None:
        for row in rows:
            if row["target"] == target and row["async"] == async_chunk and row["concurrency"] == conc:
                return row
        return None

    out: dict[str, float | None] = {}
    concs = sorted({row["concurrency"] for row in rows})
    for target in sorted({row["target"] for row in rows}):
        for conc in concs:
            a, s = get(target, True, conc), get(target, False, conc)
            if a and s:
                out[f"{target}: TTFP async/sequential @c{conc}"] = _ratio(
                    a["ttfp_ms"]["mean"], s["ttfp_ms"]["mean"]
                )
        lo, hi = concs[0], concs[-1]
        a_lo, a_hi = get(target, True, lo), get(target, True, hi)
        if a_lo and a_hi and lo != hi:
            out[f"{target}: RTF c{hi}/c{lo} (async)"] = _ratio(a_hi["rtf"]["mean"], a_lo["rtf"]["mean"])
    for conc in concs:
        svc, local = get("services", True, conc), get("in-process", True, conc)
        if svc and local:
            out[f"services/in-process TTFP @c{conc}"] = _ratio(
                svc["ttfp_ms"]["mean"], local["ttfp_ms"]["mean"]
            )
            out[f"services/in-process E2E @c{conc}"] = _ratio(svc["e2e_ms"]["mean"], local["e2e_ms"]["mean"])
            out[f"services/in-process throughput @c{conc}"] = _ratio(
                svc["request_throughput"], local["request_throughput"]
            )
        old = get("in-process-recompute", True, conc)
        if old and local:
            out[f"in-process stream/recompute Code2Wav TTFP @c{conc}"] = _ratio(
                local["ttfp_ms"]["mean"], old["ttfp_ms"]["mean"]
            )
    # The audio hold against none, where both ran (--audio-hold on,off).
    for target in sorted({row["target"] for row in rows}):
        if not target.startswith("services[no-hold]"):
            continue
        held_target = "services" + target[len("services[no-hold]") :]
        for conc in concs:
            held, free = get(held_target, True, conc), get(target, True, conc)
            if held and free:
                for key, name in (("audio_throughput", "audio s/s"), ("ttfp_ms", "TTFP")):
                    out[f"{held_target} hold/no-hold {name} @c{conc}"] = _ratio(
                        _mean(held, key), _mean(free, key)
                    )
    # The new chunk schedule against today's, where both ran (--codec-chunk-schedules fixed,grow).
    for target in sorted({row["target"] for row in rows}):
        if "[grow]" not in target:
            continue
        fixed_target = target.replace("[grow]", "[fixed]")
        for conc in concs:
            grow, fixed = get(target, True, conc), get(fixed_target, True, conc)
            if grow and fixed:
                for key, name in (("ttfp_ms", "TTFP"), ("e2e_ms", "E2E")):
                    out[f"{target} vs [fixed]: {name} grow/fixed @c{conc}"] = _ratio(
                        grow[key]["mean"], fixed[key]["mean"]
                    )
    return out
