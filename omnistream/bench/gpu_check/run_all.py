"""`tools/gpu-check --all`: the one prepared device run. For each checkpoint (tiny, real-shaped) it
times the engines' steps, checks parity against transformers and measures RTF and TTFP through a
real `omnistream up`, then prints one markdown table beside vLLM-Omni's published figures.

Device time comes in short loans (minutes), so the run is built to be cut: every part records its
result or its error and the run goes on; the JSON and the table are rewritten after each part (a
run killed midway keeps what it did); and once `--budget-s` is spent the parts left are recorded
as skipped rather than started. Each part prints its elapsed time as it ends.
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path
from typing import Any

import torch

from omnistream.bench.device_smoke import record
from omnistream.bench.gpu_check.parts import FULL, PARTS, SMALL, Budget, Settings, prepare
from omnistream.bench.gpu_check.table import render

JSON_NAME = "gpu-check-all.json"
TABLE_NAME = "gpu-check-all.md"
REAL_SHAPED_DIR = ".cache/real-shaped-model"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags only `--all` reads (it also reads --model, --out, --device and --dtype)."""
    p.add_argument("--all", action="store_true", help="the one prepared device run (docs/gpu.md)")
    p.add_argument(
        "--real-shaped",
        default=REAL_SHAPED_DIR,
        help="--all: the real-shaped checkpoint's directory (built there by "
        "omnistream.bench.op_counts.real_shaped_model when missing)",
    )
    p.add_argument(
        "--checkpoints", default="tiny,real-shaped", help="--all: which of tiny (--model), real-shaped"
    )
    p.add_argument("--batches", default="1,16,64", help="--all: batch sizes of the step times")
    p.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="--all: seconds the run may take; parts that would start after are recorded as skipped",
    )
    p.add_argument(
        "--small", action="store_true", help="--all: few steps and short answers (the CPU test's sizes)"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="--all: torch threads of the step times and parity (default: 1 on the CPU, as `omnistream "
        "bench` runs, since threads spinning against other load swamp a step; torch's default elsewhere)",
    )


def _levels(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def settings_from(args: argparse.Namespace) -> Settings:
    """--all's settings from the tool's flags; --concurrency is a comma list here (default 1,16,64)
    and --dtype the speed parts' (default auto, as `omnistream up`'s: bfloat16 on CUDA, float32 on
    the CPU)."""
    from omnistream.engine.load_options import DeviceSettings

    chosen = [c.strip() for c in args.checkpoints.split(",") if c.strip()]
    known = {"tiny": args.model, "real-shaped": args.real_shaped}
    unknown = set(chosen) - set(known)
    if unknown:
        raise SystemExit(f"gpu-check: unknown --checkpoints {sorted(unknown)}; choose from {sorted(known)}")
    return Settings(
        checkpoints=tuple((label, known[label]) for label in chosen),
        device=args.device,
        dtype=DeviceSettings(args.device, args.dtype or "auto").dtype_name,
        batches=_levels(args.batches),
        concurrencies=_levels(args.concurrency or "1,16,64"),
        sizes=SMALL if args.small else FULL,
        out=Path(args.out),
        budget_s=args.budget_s,
    )


def _write(results: dict[str, Any], out: Path) -> str:
    table = render(results)
    results["table"] = table
    (out / JSON_NAME).write_text(json.dumps(results, indent=1, default=str))
    (out / TABLE_NAME).write_text(table + "\n")
    return table


def _skip(results: dict[str, Any], name: str, budget: Budget) -> None:
    results[name] = {"ok": False, "skipped": f"the {budget.total_s:g} s budget was spent", "seconds": 0.0}
    print(f"[{name}] skipped: budget spent ({budget.elapsed():.1f} s elapsed)", flush=True)


def run_all(settings: Settings) -> dict[str, Any]:
    """Every part for every checkpoint, in PARTS order, within the budget; the results (JSON-ready,
    with the table under "table") are also written to `settings.out` after each part."""
    from omnistream.engine.load_options import LoadOptions

    budget = Budget(settings.budget_s)
    settings.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu only",
        "cuda_graphs": "on" if LoadOptions(settings.device).graphs else "off (not CUDA)",
        "settings": settings.described(),
        "parts": {},
    }
    parts: dict[str, Any] = results["parts"]
    ready: dict[str, str] = {}
    for part_name, part in PARTS:
        for label, directory in settings.checkpoints:
            name = f"{label}/{part_name}"
            if budget.spent():
                _skip(parts, name, budget)
            else:

                def body(label: str = label, directory: str = directory, part: Any = part) -> dict[str, Any]:
                    if label not in ready:
                        ready[label] = prepare(label, directory)
                    result: dict[str, Any] = part(ready[label], settings, budget)
                    return result

                record(parts, name, body)
                gc.collect()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()  # the next part (or `omnistream up`) gets the memory
            results["elapsed_s"] = round(budget.elapsed(), 1)
            _write(results, settings.out)
    return results


def errors(value: Any, where: str = "") -> list[str]:
    """Where the results hold an error (a failed part, or a cell inside one), as "part/key/cell"."""
    if not isinstance(value, dict):
        return []
    found = [where] if "error" in value else []
    for key, inner in value.items():
        found += errors(inner, f"{where}/{key}" if where else str(key))
    return found


def main_all(args: argparse.Namespace) -> int:
    """Run --all, print the table; exit status 1 when a part or a cell failed (skipped ones do not)."""
    settings = settings_from(args)
    threads = args.threads if args.threads is not None else (1 if settings.device == "cpu" else 0)
    if threads:
        torch.set_num_threads(threads)
    results = run_all(settings)
    print(results["table"], flush=True)
    print(f"\nwrote {JSON_NAME} and {TABLE_NAME} to {settings.out}")
    failed = errors(results["parts"])
    if failed:
        print(f"errors in: {', '.join(failed)}")
    return 1 if failed else 0
