"""The transcript's function call card (call-card.js) under Node: the name, and the arguments
indented once they are whole JSON (as they came while they stream)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from gateway.playground.routes import STATIC_DIR

NODE = shutil.which("node")
pytestmark = [pytest.mark.unit, pytest.mark.skipif(NODE is None, reason="needs node")]

SCRIPT = """
const m = await import(%(url)s);
console.log(JSON.stringify({
  call: m.callCard({ type: "function_call", name: "get_weather", arguments: '{"city":"Paris"}' }),
  streaming: m.callCard({ type: "function_call", name: "get_weather", arguments: '{"ci' }),
  result: m.callCard({ type: "function_call_output", call_id: "call_1", output: '{"sky":"clear"}' }),
  message: m.callCard({ type: "message", role: "assistant", content: [] }),
}));
"""


def test_a_call_card_shows_the_name_and_the_arguments():
    url = json.dumps((STATIC_DIR / "call-card.js").as_uri())
    done = subprocess.run(
        [NODE, "--input-type=module", "-e", SCRIPT % {"url": url}], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["call"] == {
        "title": "Function call",
        "name": "get_weather",
        "body": '{\n  "city": "Paris"\n}',
        "plain": 'get_weather({"city":"Paris"})',
    }
    assert out["streaming"]["body"] == '{"ci'
    assert out["result"]["title"] == "Function result" and out["result"]["body"] == '{\n  "sky": "clear"\n}'
    assert out["message"] is None
