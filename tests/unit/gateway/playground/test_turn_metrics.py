"""The turn panel's cells (turn-metrics.js) under Node: the listener's stalls are rendered from
response.done's omnistream fields, an answer without audio shows "–"."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from gateway.playground.routes import STATIC_DIR

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node")

SCRIPT = """
const m = await import(%(url)s);
const stalled = { ttft_ms: 120.4, ttfa_ms: 480, rtf: 0.5, replicas: { thinker: "a:1" },
  stalls: 2, stall_ms: 212.6, underrun_ms: 212.6, longest_stall_ms: 150, continuity_ok: false };
const smooth = { ...stalled, stalls: 0, stall_ms: 0, underrun_ms: 0, longest_stall_ms: 0,
  continuity_ok: true };
const textOnly = { ttft_ms: 90, ttfa_ms: null, rtf: null, replicas: {}, stalls: null, stall_ms: null,
  underrun_ms: null, longest_stall_ms: null, continuity_ok: null };
console.log(JSON.stringify({
  stalled: m.turnCells(3, "completed", stalled), stalledTitle: m.stallTitle(stalled),
  smooth: m.turnCells(4, "completed", smooth), smoothTitle: m.stallTitle(smooth),
  textOnly: m.turnCells(5, "completed", textOnly), textOnlyTitle: m.stallTitle(textOnly),
  old: m.turnCells(6, "cancelled", {}),
}));
"""


def test_the_stall_cell_shows_what_the_listener_heard():
    url = json.dumps((STATIC_DIR / "turn-metrics.js").as_uri())
    done = subprocess.run(
        [NODE, "--input-type=module", "-e", SCRIPT % {"url": url}], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["stalled"] == ["3", "completed", "120 ms", "480 ms", "0.50", "2 · 213 ms", ["thinker a:1"]]
    assert out["stalledTitle"] == "underrun 213 ms, longest stall 150 ms: continuity lost"
    assert out["smooth"][5] == "none" and out["smoothTitle"].endswith("continuity kept")
    assert out["textOnly"] == ["5", "completed", "90 ms", "–", "–", "–", []]
    assert out["textOnlyTitle"] == ""
    assert out["old"][5] == "–"  # a gateway without the listener fields
