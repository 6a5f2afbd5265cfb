"""POST /v1/audio/transcriptions on the real processes, through the official openai SDK: every
response_format and the stream carry the thinker's greedy transcription of the file (the same text
as the in-process pipeline makes of the same decoded audio), bad forms are 400s naming the field
that never reach the thinker, a client that leaves mid-stream ends the transcription, and a
transcription is background work that never shares a thinker step with a spoken answer. The tiny
model's words are noise: the protocol, the determinism and the priority are what is tested."""

from __future__ import annotations

import asyncio
import io
import itertools
import wave

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from gateway.api.openai.transcript_formats import srt, vtt
from gateway.config import GatewayConfig
from gateway.media.file_decode import Deadline, decode_audio
from gateway.media.limits import MediaLimits, Tally
from gateway.serving.transcription import transcription_request
from omnistream.pipeline import collect
from omnistream.request.defaults import ServingDefaults
from tests.speech import RATE, speech_pcm16

from .conftest import (
    configured_gateway,
    gateway_idle,
    gateway_url,
    metric,
    shared_thinker_steps,
    thinker_requests,
    wait_for,
)

SENTENCE = "The sea was calm tonight, and the boats came home."
ROUTE = "/v1/audio/transcriptions"
ANSWER_TOKENS = 128  # the spoken answer's words (within the tiny model's length)


def wav_of(pcm: bytes) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(pcm)
    return buffer.getvalue()


WAV = wav_of(speech_pcm16(SENTENCE))
# About 8 s: a transcript of over 120 words (tokens), for the priority test.
MORE = "The fishermen sang as they pulled in their nets, and the children waited for them on the shore."
LONG_WAV = wav_of(speech_pcm16(f"{SENTENCE} {MORE}"))
# About 94 s (under the gateway's 5 MiB of media): a budget of some 1,150 words, which the thinker
# takes over a second to make even on an idle machine, so a client that leaves after the first does
# not lose the race to the transcription's end (with LONG_WAV's 128 words, made in some 150 ms, it
# once did under CI load).
MINUTES_WAV = wav_of(speech_pcm16(" ".join([f"{SENTENCE} {MORE}"] * 12)))
MAX_TOKENS = 2048  # the module gateway's default_max_tokens: the file's budget fits


@pytest.fixture(scope="module")
def gateway(stages, tmp_path_factory):
    config = {"default_max_tokens": MAX_TOKENS}
    with configured_gateway(stages, tmp_path_factory.mktemp("transcriptions"), config) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def client(gateway) -> OpenAI:
    return OpenAI(base_url=f"{gateway_url(gateway)}/v1", api_key="unused", max_retries=0)


def transcribe(client: OpenAI, **kwargs):
    return client.audio.transcriptions.create(
        **{"model": "gpt-4o-transcribe", "file": ("speech.wav", WAV, "audio/wav"), "language": "en", **kwargs}
    )


@pytest.fixture(scope="module")
def expected(local_pipeline) -> tuple[str, float]:
    """The same file's transcription in process: decoded as the gateway decodes it, the request
    the gateway makes of it (greedy) run on the pipeline of the stages' checkpoint; and its seconds."""
    audio = decode_audio(WAV, "audio/wav", "file", Tally(MediaLimits()), Deadline(30))
    part = {"type": "audio", "audio": audio}
    request = transcription_request(part, audio.seconds, ServingDefaults.of(GatewayConfig()), "en")
    return asyncio.run(collect(local_pipeline, request)).text, audio.seconds


def test_json_is_the_greedy_transcription_whatever_the_temperature(client, gateway, stages, expected):
    text, _ = expected
    first = transcribe(client)
    assert first.text == text and text.strip()
    assert first.usage is not None
    # Deterministic: the same file again, with another temperature (accepted, not used) and model name.
    again = transcribe(client, model="whisper-1", temperature=0.9)
    assert again.text == text and again.usage == first.usage
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, stages), timeout=10))


def test_every_text_format_holds_the_same_transcript(client, expected):
    text, seconds = expected
    verbose = transcribe(client, response_format="verbose_json", timestamp_granularities=["segment"])
    assert verbose.text == text and verbose.language == "english"
    assert verbose.duration == round(seconds, 3)
    assert abs(verbose.duration - len(speech_pcm16(SENTENCE)) / 2 / RATE) < 0.01
    (segment,) = verbose.segments or []
    assert (segment.start, segment.end, segment.text) == (0.0, verbose.duration, text)
    assert transcribe(client, response_format="text") == text + "\n"
    assert transcribe(client, response_format="srt") == srt(text, seconds)
    assert transcribe(client, response_format="vtt") == vtt(text, seconds)


def test_the_stream_is_deltas_then_done_with_usage(client, gateway, stages, expected):
    text, _ = expected
    events = list(transcribe(client, stream=True))
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and set(kinds[:-1]) == {"transcript.text.delta"}
    assert len(kinds) >= 3
    done = events[-1]
    assert "".join(e.delta for e in events[:-1]) == done.text == text
    assert done.usage is not None and done.usage.output_tokens >= len(events) - 1
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, stages), timeout=10))


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"file": ("speech.wav", b"RIFF not really a wav file" * 20, "audio/wav")}, "file"),
        ({"file": ("speech.bin", bytes(range(256)) * 8)}, "file"),
        ({"response_format": "verbose_json", "timestamp_granularities": ["word"]}, "timestamp_granularities"),
        ({"include": ["logprobs"]}, "include"),
        ({"language": "English"}, "language"),
    ],
)
def test_bad_transcription_requests_get_400_naming_the_field(client, stages, kwargs, param):
    before = thinker_requests(stages)
    with pytest.raises(openai.BadRequestError) as refused:
        transcribe(client, **kwargs)
    assert refused.value.status_code == 400 and refused.value.param == param
    assert thinker_requests(stages) == before  # refused at the gateway


def test_a_form_without_a_file_gets_400_naming_it(gateway):
    reply = httpx.post(f"{gateway_url(gateway)}{ROUTE}", data={"model": "whisper-1"}, timeout=30)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "file"


def test_a_client_leaving_mid_stream_ends_the_transcription(gateway, stages):
    aborted = metric(stages["thinker"], "omnistream_stage_aborts_total")
    files = {"file": ("speech.wav", MINUTES_WAV, "audio/wav")}
    data = {"model": "whisper-1", "stream": "true"}
    with httpx.stream("POST", f"{gateway_url(gateway)}{ROUTE}", data=data, files=files, timeout=60) as reply:
        assert reply.status_code == 200
        assert next(line for line in reply.iter_lines() if line.startswith("data: "))  # one delta; then leave
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, stages), timeout=20))
    assert metric(stages["thinker"], "omnistream_stage_aborts_total") == aborted + 1  # ended, not finished


def test_a_transcription_waits_for_a_spoken_answer_s_words(gateway, stages):
    """Background work: a transcription never shares a thinker step with a spoken answer, because
    the thinker steps a background request only when no other request can (omnistream/engine/
    engine.py `_next_work`): while the answer's words are being made the transcription waits, and
    its text resumes once they are all made.

    The answer is asked for as soon as the transcription's first delta arrived: the transcription
    (8 s of speech, over 120 words) is then decoding with most of its words to come, and the
    answer's `ANSWER_TOKENS` words start a few milliseconds later, so the two are at the thinker
    together for dozens of steps whatever the machine's load (the other order, the transcription
    sent once the answer began, depends on its upload and decoding beating the answer's last word:
    on a loaded machine it often did not). Without the priority they are decoded in the same
    steps (checked by disabling it: 25 to 101 shared steps, in every run).

    The assertion is the thinker's own count of decode steps that held more than one request (its
    `omnistream_stage_batch_size` histogram): none while the two ran. The order the words reach the
    client is not asserted: the gateway hands each of a spoken answer's words to the talker before
    it reads the next (omnistream/chain/run.py `_run_thinker`), so on a loaded machine some
    of the answer's words reach the client after transcript deltas the thinker made later
    (measured: 30 answer deltas, 20 transcript deltas, 39 answer deltas). It is only reported."""
    url = f"{gateway_url(gateway)}/v1"
    arrivals: list[str] = []  # transcript / asked / answer, in the order they arrived
    answered: list[int] = []  # the answer's tokens, as the thinker counted them
    shared_before = shared_thinker_steps(stages)

    async def run() -> None:
        client = AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
        transcribing = asyncio.Event()

        async def transcription() -> None:
            stream = await client.audio.transcriptions.create(
                model="gpt-4o-mini-transcribe", file=("speech.wav", LONG_WAV, "audio/wav"), stream=True
            )
            async for event in stream:
                if event.type == "transcript.text.delta":
                    arrivals.append("transcript")
                    transcribing.set()

        async def answer() -> None:
            await transcribing.wait()
            arrivals.append("asked")
            stream = await client.chat.completions.create(
                model="qwen3-omni",
                messages=[{"role": "user", "content": "Tell me a long story about the sea."}],
                modalities=["text", "audio"],
                audio={"voice": "ethan", "format": "pcm16"},
                stream=True,
                stream_options={"include_usage": True},
                max_tokens=ANSWER_TOKENS,
                extra_body={
                    # all ANSWER_TOKENS words: a random thinker samples <|im_end|> 1 in 512 a token,
                    # and an answer that ended at its first word (seen once in CI) shares no step
                    "ignore_eos": True,
                    "talker_temperature": 0,
                    "max_audio_frames": 64,
                    "initial_codec_chunk_frames": 25,
                },
            )
            async for chunk in stream:
                delta = chunk.choices[0].delta if chunk.choices else None
                if delta and delta.audio and delta.audio.transcript:
                    arrivals.append("answer")
                if chunk.usage is not None:
                    answered.append(chunk.usage.completion_tokens)

        async with client:
            await asyncio.wait_for(asyncio.gather(transcription(), answer()), timeout=300)

    asyncio.run(run())
    order = " ".join(f"{kind}x{len(list(run))}" for kind, run in itertools.groupby(arrivals))
    # The check means something: the transcription still had words to make when the answer came.
    assert arrivals[arrivals.index("asked") :].count("transcript") >= 2, order
    # At least 10 of the answer's tokens were made beside the transcription: counted by the thinker
    # (its usage), not by the deltas a loaded gateway may join several tokens into.
    assert answered and answered[0] >= 10 and "answer" in arrivals, (answered, order)
    assert shared_thinker_steps(stages) == shared_before, f"shared thinker steps; arrivals: {order}"
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, stages), timeout=20))
