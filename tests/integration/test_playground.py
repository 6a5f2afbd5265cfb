"""The playground page in a real browser on the real stack.

Headless Chromium (Debian's package, driven by playwright through `executable_path`) loads the page
from a gateway with an API key, over real stage processes. Its microphone is Chromium's fake capture
device reading an espeak-ng recording (Chromium loops the file: speech, then a few seconds of
silence). The page connects to /v1/realtime with the key typed into its field, the server's VAD
hears the spoken turn, the answer's audio is played by the page's AudioWorklet (the test counts the
samples it rendered), both sides show in the transcript, and the next repetition of the speech,
arriving while the answer still plays, barges in: playback stops at once, the server cancels the
answer and truncates it. Before that, in push-to-talk mode, a typed message with an image and a turn
spoken while Space is held on the talk button get answers, each stopped with Escape. On the tiny
checkpoint `make run` serves, an answer ends by itself and the page is "Ready" again.
No console error may appear on the way. Screenshots of each state go to out/test-artifacts/playground/.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import wave
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from tests.integration.conftest import configured_gateway, gateway_url
from tests.integration.test_realtime_tools import WEATHER, WEATHER_SCHEMA

playwright_api = pytest.importorskip("playwright.sync_api")

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "out" / "test-artifacts" / "playground"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
API_KEY = "playground-test-key"
SPEECH = "Hello there. Please tell me a short story about the sea."
SILENCE_S = 5.0  # after the speech, before Chromium loops the file: the answer plays in this gap
# A long answer (the tiny model's words are noise; ignore_eos makes its length fixed), so that the
# next repetition of the speech arrives while it still plays.
SESSION_EXTRA = {
    "max_output_tokens": 200,
    "omnistream": {"ignore_eos": True, "max_audio_frames": 300, "seed": 3},
}
TIMEOUT_MS = 90_000

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists() or shutil.which("espeak-ng") is None,
    reason="needs Debian's chromium and espeak-ng (make sysdeps)",
)


def _speech_wav(path: Path) -> Path:
    """espeak-ng's recording of SPEECH, then SILENCE_S of silence: 16-bit PCM mono."""
    rendered = subprocess.run(["espeak-ng", "--stdout", SPEECH], check=True, capture_output=True).stdout
    with wave.open(io.BytesIO(rendered)) as source:
        rate = source.getframerate()
        speech = np.frombuffer(source.readframes(source.getnframes()), dtype="<i2")
    samples = np.concatenate([np.zeros(rate // 4, "<i2"), speech, np.zeros(int(rate * SILENCE_S), "<i2")])
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(samples.tobytes())
    return path


def _tiny_png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 60, 40)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def gateway(stages, tmp_path_factory):
    with configured_gateway(stages, tmp_path_factory.mktemp("playground"), {"api_key": API_KEY}) as service:
        yield service


@pytest.fixture(scope="module")
def ending_gateway(ending_stages, tmp_path_factory):
    """A gateway over the tiny checkpoint whose answers end (what `make run` serves)."""
    directory = tmp_path_factory.mktemp("playground-ending")
    with configured_gateway(ending_stages, directory, {"api_key": API_KEY}) as service:
        yield service


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    wav = _speech_wav(tmp_path_factory.mktemp("speech") / "speech.wav")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--use-fake-device-for-media-stream",
                "--use-fake-ui-for-media-stream",
                f"--use-file-for-fake-audio-capture={wav}",
                "--autoplay-policy=no-user-gesture-required",
            ],
        )
        try:
            yield browser
        finally:
            browser.close()


class Console:
    """Every console error and uncaught exception of a page."""

    def __init__(self, page) -> None:
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def _wait(page, expression: str, timeout: int = TIMEOUT_MS) -> None:
    page.wait_for_function(f"() => {expression}", timeout=timeout)


def _stopped_at_once(page) -> None:
    """The last stop flushed audio that was playing or queued, and nothing of that answer was
    rendered after the flush (its later deltas are dropped, the player's queue is empty)."""
    _wait(page, "window.playground.stats.lastFlush !== null")
    stats = page.evaluate("window.playground.stats")
    flush = stats["lastFlush"]
    assert flush["wasPlaying"] or flush["discarded"] > 0, flush
    assert stats["cutPlayed"] == 0, stats


def _connect_push_to_talk(page, gateway, extra: dict) -> None:
    """Open the page, type the key and the extra session settings, connect in push-to-talk mode."""
    page.goto(gateway_url(gateway) + "/")
    _wait(page, "window.playground !== undefined")
    page.fill("#api-key", API_KEY)
    page.click("summary")
    page.fill("#extra", json.dumps(extra))
    page.check("input[name=mode][value=ptt]")
    page.click("#connect")
    _wait(page, "window.playground.state === 'ready'")


def _state(page) -> str:
    return page.evaluate("window.playground.state")


def test_a_wrong_key_shows_the_gateways_message(gateway, browser):
    page = browser.new_page()
    try:
        console = Console(page)
        page.goto(gateway_url(gateway) + "/playground")
        page.fill("#api-key", "not-the-key")
        page.click("#connect")
        _wait(page, "window.playground.state === 'error'")
        assert "API key" in page.inner_text("#error")
        assert "API key" in page.inner_text("#status")
        _shot(page, "error")
        # the browser logs the refused request itself; nothing else may be logged
        assert all("401" in e for e in console.errors), console.errors
    finally:
        page.close()


def test_spoken_turn_is_played_transcribed_and_barged_in(gateway, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    try:
        console = Console(page)
        page.goto(gateway_url(gateway) + "/")
        _wait(page, "window.playground !== undefined")
        assert _state(page) == "disconnected"
        _shot(page, "disconnected")

        # The key is typed in, never part of the page; the answer is made long (see SESSION_EXTRA).
        assert API_KEY not in page.content()
        page.fill("#api-key", API_KEY)
        page.click("summary")
        page.fill("#extra", json.dumps(SESSION_EXTRA))
        page.check("input[name=mode][value=ptt]")

        # Hold GET /v1/models (the first thing Connect does) to see the connecting state.
        held = []
        page.route("**/v1/models", lambda route: held.append(route))
        page.click("#connect")
        _wait(page, "window.playground.state === 'connecting'")
        _shot(page, "connecting")
        while not held:
            page.wait_for_timeout(20)
        held[0].continue_()
        page.unroute("**/v1/models")

        # Push to talk first (the microphone does not feed the session): a typed message with an
        # image, answered, and stopped with Escape once it plays.
        _wait(page, "window.playground.state === 'ready'")
        assert page.locator("#voice option").count() > 1  # the voices came from /v1/models
        page.select_option("#voice", index=1)  # a session.update, which the gateway accepts
        _wait(page, "window.playground.eventCounts['session.updated'] >= 2")
        _shot(page, "ready")
        image = {"name": "red.png", "mimeType": "image/png", "buffer": _tiny_png()}
        page.set_input_files("#attach", files=[image])
        page.fill("#message", "What colour is this picture?")
        page.press("#message", "Enter")
        _wait(page, "window.playground.transcript().some(e => e.role === 'user' && /colour/.test(e.text))")
        _wait(page, "window.playground.state === 'speaking'")
        page.keyboard.press("Escape")
        _wait(page, "window.playground.metrics.length === 1")
        # cancelled while it was generated; on a fast machine it may be complete and only playing
        assert page.evaluate("window.playground.metrics[0].status") in ("cancelled", "completed")
        _stopped_at_once(page)
        _wait(page, "window.playground.eventCounts['conversation.item.truncated'] >= 1")
        _wait(page, "window.playground.state === 'ready'")

        # Push to talk from the keyboard: Space held on the focused button sends the microphone.
        page.focus("#talk")
        page.keyboard.down(" ")
        _wait(page, "window.playground.state === 'listening'")
        sent = page.evaluate("window.playground.stats.micPiecesSent")
        _wait(page, f"window.playground.stats.micPiecesSent >= {sent + 50}")  # a second of speech
        page.keyboard.up(" ")
        _wait(page, "window.playground.state === 'speaking'")
        page.keyboard.press("Escape")
        _wait(page, "window.playground.metrics.length === 2")
        _stopped_at_once(page)
        _wait(page, "window.playground.state === 'ready'")
        roles = [e["role"] for e in page.evaluate("window.playground.transcript()")]
        assert roles == ["user", "assistant", "user", "assistant"], roles

        # Hands-free: the server's VAD hears the speech, commits the turn, the answer comes.
        before = page.evaluate(
            """({played: window.playground.stats.samplesPlayed, bargeIns: window.playground.stats.bargeIns,
                truncated: window.playground.eventCounts['conversation.item.truncated'] ?? 0})"""
        )
        page.check("input[name=mode][value=vad]")
        _wait(page, "window.playground.state === 'listening'")
        _shot(page, "listening")
        _wait(page, "window.playground.eventCounts['input_audio_buffer.speech_stopped'] >= 1")
        _wait(page, "['thinking', 'speaking'].includes(window.playground.state)")
        if _state(page) == "thinking":
            _shot(page, "thinking")
        # rendered by the worklet: a tenth of a second of this answer at least
        _wait(page, f"window.playground.stats.samplesPlayed > {before['played'] + 2400}")
        _wait(page, "window.playground.state === 'speaking'")
        _wait(page, "window.playground.transcript().filter(e => e.role === 'assistant' && e.text).length > 2")
        _shot(page, "speaking")
        roles = [e["role"] for e in page.evaluate("window.playground.transcript()")]
        assert roles[:6] == ["user", "assistant"] * 3, roles
        assert page.locator("#transcript li.user").count() >= 3

        # The speech comes again while the answer plays: barge-in.
        _wait(page, f"window.playground.stats.bargeIns > {before['bargeIns']}")
        _stopped_at_once(page)
        # the server cut the answer (cancelled, or truncated to what was played when it was complete)
        _wait(page, f"window.playground.eventCounts['conversation.item.truncated'] > {before['truncated']}")
        _wait(page, "window.playground.metrics.length >= 3")
        marked = [e for e in page.evaluate("window.playground.transcript()") if e["status"]]
        assert len(marked) >= 3, "cut answers are marked in the transcript"
        _shot(page, "barge-in")

        # The metrics panel shows the server's per-turn numbers.
        row = page.evaluate("window.playground.metrics[0]")
        listener = {"stalls", "stall_ms", "underrun_ms", "continuity_ok"}  # omnistream/audio/listener.py
        assert {"ttft_ms", "ttfa_ms", "rtf", "replicas", *listener} <= set(row), row
        assert set(row["replicas"]) == {"thinker", "talker", "code2wav"}
        assert page.locator("#metrics tbody tr").count() >= 3

        errors = page.evaluate("window.playground.serverErrors")
        assert errors == [], json.dumps(errors)
        assert page.evaluate("window.playground.error") is None
        assert console.errors == []
    finally:
        page.close()


def test_an_answer_ends_by_itself_and_the_page_is_ready_again(ending_gateway, browser):
    """`make run`'s model: a typed question's spoken answer ends (seconds, not minutes), is played
    to its end, and the page goes back from speaking to ready (push to talk) / listening (VAD)."""
    page = browser.new_page()
    try:
        console = Console(page)
        _connect_push_to_talk(page, ending_gateway, {"omnistream": {"seed": 5}})
        page.fill("#message", "Tell me about the sea.")
        page.press("#message", "Enter")
        _wait(page, "window.playground.metrics.length === 1")  # response.done: generation ended
        assert page.evaluate("window.playground.metrics[0].status") == "completed"
        _wait(page, "window.playground.stats.samplesPlayed > 0")
        # Played to its end, then ready: no Escape, no barge-in.
        _wait(page, "window.playground.state === 'ready'", timeout=30_000)
        _shot(page, "answer-ended")
        played = page.evaluate("window.playground.stats.samplesPlayed") / 24000
        assert 0 < played < 10, played
        assert page.evaluate("window.playground.stats.bargeIns") == 0
        answer = [e for e in page.evaluate("window.playground.transcript()") if e["role"] == "assistant"]
        assert len(answer) == 1 and answer[0]["status"] in (None, "", "completed"), answer
        # Hands-free mode: the same page listens again.
        page.check("input[name=mode][value=vad]")
        _wait(page, "window.playground.state === 'listening'")
        assert page.evaluate("window.playground.serverErrors") == []
        assert console.errors == []
    finally:
        page.close()


def test_a_function_call_shows_as_a_card_with_its_name_and_arguments(gateway, browser):
    """A session given a tool and tool_choice "required" (through the page's session settings): a
    typed question's answer is a call, shown in the transcript as a card with the function's name
    and its arguments (whole JSON that validates against the tool's schema), and no audio."""
    page = browser.new_page()
    try:
        console = Console(page)
        extra = {"tools": [WEATHER], "tool_choice": "required", "max_output_tokens": 200}
        _connect_push_to_talk(page, gateway, extra)
        page.fill("#message", "What is the weather in Paris?")
        page.press("#message", "Enter")
        _wait(page, "window.playground.metrics.length === 1")  # response.done
        _wait(page, "document.querySelector('#transcript .call .call-name') !== null")
        _shot(page, "function-call")
        names = page.eval_on_selector_all(
            "#transcript .call .call-name", "els => els.map(e => e.textContent)"
        )
        bodies = page.eval_on_selector_all(
            "#transcript .call .call-args", "els => els.map(e => e.textContent)"
        )
        assert names and names == [WEATHER["name"]] * len(names)  # required: one call or more
        for body in bodies:
            jsonschema.validate(json.loads(body), WEATHER_SCHEMA)  # whole JSON, shown indented
        calls = [e for e in page.evaluate("window.playground.transcript()") if e["role"] == "call"]
        assert len(calls) == len(names) and all(c["text"].startswith(f"{WEATHER['name']}(") for c in calls)
        assert page.evaluate("window.playground.stats.samplesPlayed") == 0  # a call is not spoken
        assert page.evaluate("window.playground.serverErrors") == []
        assert console.errors == []
    finally:
        page.close()
