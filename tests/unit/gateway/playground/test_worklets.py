"""The two AudioWorklets run under Node with the few globals a worklet scope gives
(`AudioWorkletProcessor`, `registerProcessor`, `sampleRate`): the player's jitter buffer, rendered
count, end-of-answer drain and flush; the microphone's resampling to 24 kHz in 20 ms pcm16 pieces.
The browser test covers them in Chromium; these pin their arithmetic where it is cheap to check."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from gateway.playground.routes import STATIC_DIR

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node")

SCOPE = """
const posted = [];
globalThis.sampleRate = %(rate)d;
globalThis.AudioWorkletProcessor = class {
  constructor() { this.port = { postMessage: (m) => posted.push(m), onmessage: null }; }
};
let Processor;
globalThis.registerProcessor = (_name, ctor) => { Processor = ctor; };
await import(%(url)s);
const quantum = (node, outputs = [[new Float32Array(128)]], inputs = [[]]) => {
  node.process(inputs, outputs);
  return outputs[0][0];
};
"""


def _run(worklet: str, rate: int, body: str) -> dict:
    url = json.dumps((STATIC_DIR / worklet).as_uri())
    script = SCOPE % {"rate": rate, "url": url} + body
    done = subprocess.run(
        [NODE, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


PLAYER_JITTER = """
const node = new Processor({ processorOptions: { jitterMs: 80 } });  // 1920 samples at 24 kHz
node.port.onmessage({ data: { type: "push", pcm: new Int16Array(1000).fill(16384).buffer } });
let silent = 0;
for (let i = 0; i < 10; i++) silent += quantum(node).reduce((a, b) => a + Math.abs(b), 0);
const before = node.played;
node.port.onmessage({ data: { type: "push", pcm: new Int16Array(1000).fill(16384).buffer } });
const out = quantum(node);
const types = posted.map(m => m.type);
console.log(JSON.stringify({ silent, before, after: node.played, first: out[0], types }));
"""


def test_player_waits_for_its_jitter_buffer_then_plays_at_the_device_rate():
    result = _run("player-worklet.js", 48000, PLAYER_JITTER)
    assert result["silent"] == 0 and result["before"] == 0  # 1000 < 1920 samples: not yet
    assert result["after"] == 64  # 128 frames at 48 kHz = 64 samples at 24 kHz
    assert result["first"] == pytest.approx(0.5)
    assert result["types"] == ["started"]


PLAYER_END_AND_FLUSH = """
const node = new Processor({ processorOptions: { jitterMs: 80 } });
node.port.onmessage({ data: { type: "push", pcm: new Int16Array(100).fill(8192).buffer } });
node.port.onmessage({ data: { type: "end" } });  // under the jitter buffer, but the answer is over
for (let i = 0; i < 4; i++) quantum(node);
const drained = { played: node.played, types: posted.splice(0).map(m => m.type) };
node.port.onmessage({ data: { type: "push", pcm: new Int16Array(24000).fill(8192).buffer } });
for (let i = 0; i < 30; i++) quantum(node);
const playedBeforeFlush = node.played;
node.port.onmessage({ data: { type: "flush" } });
const flushed = posted.filter(m => m.type === "flushed")[0];
let after = 0;
for (let i = 0; i < 10; i++) after += quantum(node).reduce((a, b) => a + Math.abs(b), 0);
console.log(JSON.stringify({ drained, playedBeforeFlush, flushed, after, playedAfter: node.played }));
"""


def test_player_drains_an_ended_answer_and_a_flush_silences_it_at_once():
    result = _run("player-worklet.js", 48000, PLAYER_END_AND_FLUSH)
    assert result["drained"] == {"played": 100, "types": ["started", "drained"]}
    assert result["playedBeforeFlush"] == 100 + 30 * 64
    flushed = result["flushed"]
    assert flushed["played"] == result["playedBeforeFlush"]
    assert flushed["discarded"] == 100 + 24000 - result["playedBeforeFlush"]
    assert flushed["wasPlaying"] is True
    assert result["after"] == 0 and result["playedAfter"] == result["playedBeforeFlush"]


MIC = """
const node = new Processor();
const pieces = [];
node.port.postMessage = (m) => pieces.push(m);
const block = 128;
let t = 0;
for (let q = 0; q < Math.ceil(sampleRate / block); q++) {  // one second of a 440 Hz tone at 0.5
  const x = new Float32Array(block);
  for (let i = 0; i < block; i++, t++) x[i] = 0.5 * Math.sin((2 * Math.PI * 440 * t) / sampleRate);
  node.process([[x]], []);
}
const sizes = [...new Set(pieces.map(p => new Int16Array(p.pcm).length))];
const peaks = pieces.map(p => p.peak);
const [minPeak, maxPeak] = [Math.min(...peaks), Math.max(...peaks)];
console.log(JSON.stringify({ count: pieces.length, sizes, minPeak, maxPeak }));
"""


@pytest.mark.parametrize("rate", [48000, 44100, 16000])
def test_mic_resamples_to_24khz_in_20ms_pcm16_pieces(rate):
    result = _run("mic-worklet.js", rate, MIC)
    assert result["sizes"] == [480]
    assert 49 <= result["count"] <= 50  # one second at 24 kHz is 50 pieces (the last may be partial)
    assert 0.45 < result["minPeak"] <= result["maxPeak"] < 0.52


PLAYER_UNDERRUN = """
const node = new Processor({ processorOptions: { jitterMs: 80 } });
node.port.onmessage({ data: { type: "push", pcm: new Int16Array(2000).fill(8192).buffer } });
for (let i = 0; i < 40; i++) quantum(node);  // plays the 2000 samples, then waits for more
node.port.onmessage({ data: { type: "flush" } });
const types = posted.map(m => m.type);
console.log(JSON.stringify({ types, flushed: posted.at(-1), played: node.played }));
"""


def test_a_flush_during_an_underrun_still_reports_an_answer_in_progress():
    """More audio was due (no `end`): the answer was still being spoken, though nothing was queued."""
    result = _run("player-worklet.js", 48000, PLAYER_UNDERRUN)
    assert "underrun" in result["types"] and result["types"][-1] == "flushed"
    assert result["flushed"] == {"type": "flushed", "played": 2000, "discarded": 0, "wasPlaying": True}
