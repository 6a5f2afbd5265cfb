"""Diagnostics hook for tools/rss-probe (never loaded by the services on their own).

`tools/rss-probe --diagnose` starts the service with PYTHONPATH=tools/rss_probe_hook and
RSS_PROBE_REPORT=FILE, so Python imports this file as `sitecustomize` at startup. It only installs
a SIGUSR1 handler. Each SIGUSR1 appends one JSON line to $RSS_PROBE_REPORT with RSS and glibc's
heap counters (mallinfo2, all arenas: bytes malloc has handed out and still counts in use, bytes it
holds free; number of arenas). Words in the file $RSS_PROBE_REPORT.cmd ask for more:

  census  a census of live Python objects first (tensors and their bytes, engine requests,
          objects by type)
  trim    then malloc_trim(0) and RSS again: what the trim gives back was free memory the
          allocator kept, not state the service keeps
"""

from __future__ import annotations

import collections
import ctypes
import gc
import json
import os
import signal
import tempfile
import time
from xml.etree import ElementTree

_REPORT = os.environ.get("RSS_PROBE_REPORT")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost",
        )
    ]  # fmt: skip


def _libc():
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    return libc


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _heap(libc) -> dict[str, int]:
    m = libc.mallinfo2()
    with tempfile.NamedTemporaryFile("r", suffix=".xml") as tmp:
        fp = libc.fopen(tmp.name.encode(), b"w")
        libc.malloc_info(0, fp)
        libc.fclose(fp)
        root = ElementTree.fromstring(tmp.read())
    per_arena = []  # (bytes the arena holds from the OS, of which free), largest first
    for heap in root.findall("heap"):
        current = sum(int(e.get("size")) for e in heap.findall("system") if e.get("type") == "current")
        free = sum(int(e.get("size")) for e in heap.findall("total") if e.get("type") in ("fast", "rest"))
        per_arena.append((current, free))
    per_arena.sort(reverse=True)
    return {
        "heap_in_use": m.uordblks + m.hblkhd,  # malloc'd and not freed (mmapped chunks included)
        "heap_free": m.fordblks,  # free chunks malloc keeps in its arenas
        "heap_mmapped": m.hblkhd,
        "heap_top_pad": m.keepcost,
        "arenas": len(per_arena),
        "arena_bytes": [c for c, _ in per_arena[:4]],
        "arena_free": [f for _, f in per_arena[:4]],
    }


def _census() -> dict:
    import sys

    import numpy as np
    import torch

    engine_module = sys.modules.get("omnistream.engine.engine")
    engine_cls = engine_module.Engine if engine_module else ()

    by_type: collections.Counter = collections.Counter()
    storages: dict[int, int] = {}
    arrays = array_bytes = 0
    engines = []
    trimmers = []
    for obj in gc.get_objects():
        kind = type(obj)
        by_type[kind.__qualname__] += 1
        if issubclass(kind, torch.Tensor):  # type(), not isinstance(): no lazy module __getattr__
            try:
                s = obj.untyped_storage()
                storages[s.data_ptr()] = s.nbytes()
            except Exception:  # a tensor without storage (meta, sparse)
                pass
        elif issubclass(kind, np.ndarray) and obj.base is None:
            arrays += 1
            array_bytes += obj.nbytes
        elif engine_cls and issubclass(kind, engine_cls):
            engines.append(obj)
        elif kind.__name__ == "HeapTrimmer":
            trimmers.append({"trims": obj.trims, "seconds": round(obj.seconds, 3), "enabled": obj.enabled})
    return {
        "tensors": by_type.get("Tensor", 0) + by_type.get("Parameter", 0),
        "tensor_bytes": sum(storages.values()),
        "ndarrays": arrays,
        "ndarray_bytes": array_bytes,
        "engines": [
            {
                "name": getattr(e, "name", "?"),
                "requests": len(e._requests),
                "released": len(e._released),
                "suspects": len(getattr(e, "_suspects", ())),
            }
            for e in engines
        ],
        "heap_trimmers": trimmers,
        "objects": len(gc.get_objects()),
        "by_type": dict(by_type.most_common(60)),
    }


def _garbage() -> dict:
    """Collect, keeping what the cyclic GC finds unreachable, describe it, then free it for real."""
    import numpy as np
    import torch

    flags = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        garbage = list(gc.garbage)
        gc.garbage.clear()
    finally:
        gc.set_debug(flags)
    by_type: collections.Counter = collections.Counter()
    storages: dict[int, int] = {}
    for obj in garbage:
        kind = type(obj)
        by_type[f"{kind.__module__}.{kind.__qualname__}"] += 1
        if issubclass(kind, torch.Tensor):
            s = obj.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
        elif issubclass(kind, np.ndarray):
            base = obj
            while isinstance(getattr(base, "base", None), np.ndarray):
                base = base.base
            if isinstance(base.base, torch.Tensor):
                s = base.base.untyped_storage()
                storages[s.data_ptr()] = s.nbytes()
            elif base.base is None:
                storages[id(base)] = base.nbytes
    out = {
        "objects": len(garbage),
        "tensor_bytes": sum(storages.values()),  # tensors, and the tensors numpy views keep alive
        "by_type": dict(by_type.most_common(30)),
    }
    del garbage
    gc.collect()
    return out


def _write(record: dict) -> None:
    with open(_REPORT, "a") as f:
        f.write(json.dumps(record) + "\n")


def _on_usr1(signum, frame) -> None:
    libc = _libc()
    try:
        with open(_REPORT + ".cmd") as f:
            words = f.read().split()
    except FileNotFoundError:
        words = []
    record = {"t": time.time()}
    if "census" in words:
        record["before_gc"] = {**_status(), **_heap(libc)}
        record["garbage"] = _garbage()
    record.update({**_status(), **_heap(libc)})
    if "census" in words:
        record["census"] = _census()
    if "trim" in words:
        started = time.perf_counter()
        libc.malloc_trim(0)
        record["trim_seconds"] = time.perf_counter() - started
        record["after_trim"] = {**_status(), **_heap(libc)}
    _write(record)


if _REPORT:
    signal.signal(signal.SIGUSR1, _on_usr1)
