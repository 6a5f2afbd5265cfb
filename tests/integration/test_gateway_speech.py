"""POST /v1/audio/speech on the real stage services, through the openai SDK: every format decoded
and compared with what the talker and code2wav make of the same text in process."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import av
import grpc
import httpx
import numpy as np
import pytest
import soundfile as sf
from openai import OpenAI

from gateway.api.openai.audio_encode import encode_whole
from omnistream.audio.wav import to_pcm16
from omnistream.pipeline import GenerationRequest, collect
from omnistream.proto.omni.v1 import stage_pb2, stage_pb2_grpc

from .conftest import configured_gateway, gateway_idle, gateway_process, wait_for

TEXT = "The sea was calm tonight, and the boats came home."
EXTRA = {
    "talker_temperature": 0,
    "talker_repetition_penalty": 1.0,
    "initial_codec_chunk_frames": 4,
    "max_audio_frames": 40,
}
RATE = 24000


@pytest.fixture(scope="module")
def gateway(stages):
    with gateway_process(stages) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def expected(local_pipeline):
    """The same text spoken in process (float64, greedy voice, as the stages run here); the unit
    tests show that this is the talker + code2wav output for the text's own tokens."""
    request = GenerationRequest(
        messages=[{"role": "user", "content": TEXT}],
        assistant_text=TEXT,
        max_tokens=4096,
        max_audio_frames=40,
        initial_codec_chunk_frames=4,
    )
    return asyncio.run(collect(local_pipeline, request))


@pytest.fixture(scope="module")
def client(gateway) -> OpenAI:
    return OpenAI(base_url=f"http://127.0.0.1:{gateway.http_port}/v1", api_key="unused")


def _pcm16(expected) -> np.ndarray:
    return np.frombuffer(to_pcm16(expected.audio), dtype="<i2")


def _decode_av(data: bytes) -> tuple[np.ndarray, int]:
    """Mono float samples and their rate, decoded by FFmpeg (PyAV)."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        frames = [f.to_ndarray() for f in container.decode(stream)]
        rate = stream.codec_context.sample_rate
    samples = np.concatenate([f.reshape(f.shape[0], -1)[0] for f in frames])
    if samples.dtype.kind == "i":  # full scale of the decoder's integer format (FLAC: s16 or s32)
        return samples.astype(np.float64) / 2.0 ** (8 * samples.dtype.itemsize - 1), rate
    return samples.astype(np.float64), rate


def _best_lag(decoded: np.ndarray, reference: np.ndarray, lags: int) -> int:
    """The lag d < `lags` whose `decoded[d:d + n]` has the largest dot product with `reference`
    (the first of equals). Every lag's product at once by FFT, then the few best products again
    exactly, one `np.dot` each as a loop over all lags would (which took tens of seconds at
    opus's 48 kHz): the same lag unless the FFT's rounding swapped the 1st and the 9th."""
    n, size = len(reference), 1 << (len(decoded) + len(reference)).bit_length()
    spectrum = np.fft.rfft(decoded, size) * np.conj(np.fft.rfft(reference, size))
    products = np.fft.irfft(spectrum, size)[:lags]  # zero past the end: no wrap-around
    best, lag = -np.inf, 0
    for d in sorted(int(i) for i in np.argsort(products)[-8:]):
        seg = decoded[d : d + n]
        score = float(np.dot(seg, reference[: len(seg)]))
        if score > best:
            best, lag = score, d
    return lag


def _snr_db(decoded: np.ndarray, rate: int, reference: np.ndarray) -> float:
    """SNR of a lossy decode against the reference, after undoing the codec's delay (the lag of
    best correlation) and, for opus (always decoded at 48 kHz), the rate."""
    if rate != RATE:  # band-limited resampling (zero-padded spectrum)
        n = len(reference) * rate // RATE
        spectrum = np.fft.rfft(reference)
        reference = np.fft.irfft(spectrum, n) * (n / len(reference))
    n = len(reference)
    lag = _best_lag(decoded, reference, min(4096, max(1, len(decoded) - n // 2)))
    seg = decoded[lag : lag + n]
    ref = reference[: len(seg)]
    assert len(seg) >= 0.95 * n, (len(seg), n)
    return float(10 * np.log10(np.sum(ref**2) / max(np.sum((seg - ref) ** 2), 1e-20)))


def test_pcm_and_wav_are_the_pipeline_samples_exactly(client, expected):
    pcm = client.audio.speech.create(
        model="qwen3-omni", voice="ethan", input=TEXT, response_format="pcm", extra_body=EXTRA
    ).content
    np.testing.assert_array_equal(np.frombuffer(pcm, dtype="<i2"), _pcm16(expected))
    wav = client.audio.speech.create(
        model="qwen3-omni", voice="ethan", input=TEXT, response_format="wav", extra_body=EXTRA
    ).content
    assert wav[:4] == b"RIFF" and wav[8:16] == b"WAVEfmt "
    assert wav[36:40] == b"data" and wav[44:] == pcm  # streamed: header first, sizes unknown


def test_flac_decodes_to_the_pcm_samples_exactly(client, expected):
    data = client.audio.speech.create(
        model="qwen3-omni", voice="ethan", input=TEXT, response_format="flac", extra_body=EXTRA
    ).content
    assert data[:4] == b"fLaC"
    samples, rate = _decode_av(data)
    assert rate == RATE
    np.testing.assert_array_equal(np.round(samples * 32768).astype(np.int64), _pcm16(expected))
    # Streamed, its header cannot hold the length (0: unknown, as FLAC allows), which libsndfile
    # does not read; the same samples as one file (gateway/audio_encode.encode_whole) it does.
    whole, rate = sf.read(io.BytesIO(encode_whole("flac", expected.audio, RATE)), dtype="int16")
    assert rate == RATE
    np.testing.assert_array_equal(whole, _pcm16(expected))


@pytest.mark.parametrize(("fmt", "magic"), [("mp3", b"ID3"), ("opus", b"OggS"), ("aac", b"\xff\xf1")])
def test_lossy_formats_decode_close_to_the_samples(client, expected, fmt, magic):
    data = client.audio.speech.create(
        model="qwen3-omni", voice="ethan", input=TEXT, response_format=fmt, extra_body=EXTRA
    ).content
    assert data.startswith(magic)
    samples, rate = _decode_av(data)
    assert rate == (48000 if fmt == "opus" else RATE)
    reference = expected.audio.astype(np.float64)
    snr = _snr_db(samples, rate, reference)
    assert snr > MIN_SNR_DB[fmt], snr
    # The bound means something: other audio (these samples reversed) scores about 0 dB.
    assert _snr_db(samples, rate, reference[::-1].copy()) < 1.0


# The tiny test model's audio is noise-like, the hardest case for a perceptual codec, so the bounds
# are low (measured: mp3 8.6 dB, opus 7.0 dB, aac 6.1 dB at their bit rates, the reversed audio about
# -3 dB); real speech does better.
MIN_SNR_DB = {"mp3": 6.0, "opus": 4.5, "aac": 4.0}


def test_streamed_audio_arrives_in_pieces_as_it_is_decoded(client, expected):
    with client.audio.speech.with_streaming_response.create(
        model="qwen3-omni", voice="ethan", input=TEXT, response_format="pcm", extra_body=EXTRA
    ) as response:
        assert response.headers["content-type"] == "audio/pcm"
        pieces = [p for p in response.iter_bytes() if p]
    assert len(pieces) >= 2
    np.testing.assert_array_equal(np.frombuffer(b"".join(pieces), dtype="<i2"), _pcm16(expected))


@pytest.mark.parametrize("fmt", ["pcm", "flac"])
def test_sse_stream_has_audio_deltas_then_done_with_usage(client, expected, fmt):
    with client.audio.speech.with_streaming_response.create(
        model="qwen3-omni",
        voice="ethan",
        input=TEXT,
        response_format=fmt,
        stream_format="sse",
        extra_body=EXTRA,
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "speech.audio.done" and set(kinds[:-1]) == {"speech.audio.delta"}
    assert len(kinds) >= 3
    data = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    if fmt == "pcm":
        np.testing.assert_array_equal(np.frombuffer(data, dtype="<i2"), _pcm16(expected))
    else:
        samples, _ = _decode_av(data)
        np.testing.assert_array_equal(np.round(samples * 32768).astype(np.int64), _pcm16(expected))
    usage = events[-1]["usage"]
    assert usage["input_tokens"] == len(expected.prompt_ids)
    assert usage["output_tokens"] == expected.codes.shape[1]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"speed": 2.0}, "speed"),
        ({"instructions": "whisper"}, "instructions"),
        ({"input": ""}, "input"),
        ({"input": "x" * 4097}, "input"),
        ({"voice": "nobody"}, "voice"),
        ({"response_format": "ogg"}, "response_format"),
        ({"stream_format": "chunks"}, "stream_format"),
        ({"no_such_field": 1}, "no_such_field"),
    ],
)
def test_bad_speech_requests_get_422_naming_the_field(gateway, body, param):
    full = {"model": "qwen3-omni", "input": TEXT, "voice": "ethan", **body}
    reply = httpx.post(f"http://127.0.0.1:{gateway.http_port}/v1/audio/speech", json=full, timeout=30)
    assert reply.status_code == 422, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["code"] == "invalid_request"


def test_a_text_over_the_model_length_is_refused_and_the_gateway_keeps_serving(client, gateway, stages):
    # Distinct words, so the prompt (the text as the user turn) and the answer are long in tokens.
    text = " ".join(f"w{i}" for i in range(780))
    assert len(text) <= 4096
    reply = httpx.post(
        f"http://127.0.0.1:{gateway.http_port}/v1/audio/speech",
        json={"model": "qwen3-omni", "input": text, "voice": "ethan", **EXTRA},
        timeout=60,
    )
    assert reply.status_code == 422, reply.text
    assert "text to speak" in reply.json()["error"]["message"]
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, stages), timeout=10))
    ok = client.audio.speech.create(
        model="qwen3-omni", voice="ethan", input="Hello.", response_format="pcm", extra_body=EXTRA
    )
    assert len(ok.content) > 0


def test_a_client_leaving_mid_speech_frees_everything(gateway, stages):
    body = {
        "model": "qwen3-omni",
        "input": TEXT,
        "voice": "ethan",
        "response_format": "mp3",
        **EXTRA,
        "max_audio_frames": 400,
    }
    url = f"http://127.0.0.1:{gateway.http_port}/v1/audio/speech"
    with httpx.stream("POST", url, json=body, timeout=60) as reply:
        assert reply.status_code == 200
        assert next(reply.iter_bytes())  # some audio arrived; then the client goes away
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, stages), timeout=20))


def _talker_info(stages) -> stage_pb2.StageInfo:
    with grpc.insecure_channel(stages["talker"].address) as channel:
        return stage_pb2_grpc.TalkerServiceStub(channel).Info(stage_pb2.InfoRequest(), timeout=10)


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
def test_a_speech_that_fails_before_any_audio_gets_its_http_error(stages, tmp_path, stream_format):
    """Issue 28: a stage that refuses the request after the thinker began (here the talker: the
    prompt and the frames asked for do not fit its length, which a gateway allowing more frames
    than the talker holds lets through) fails it before any audio. The client gets the error's
    status and JSON body, not a 200 whose body is cut off; after audio, an aborted body stays the
    signal (tests/unit/gateway/api/openai/test_speech.py)."""
    talker_length = _talker_info(stages).limits.max_frames
    with configured_gateway(stages, tmp_path, {"max_audio_frames": talker_length}) as gateway:
        body = {
            "model": "qwen3-omni",
            "input": TEXT,
            "voice": "ethan",
            "stream_format": stream_format,
            "max_audio_frames": talker_length - 6,  # opens, but cannot follow this prompt
        }
        reply = httpx.post(f"http://127.0.0.1:{gateway.http_port}/v1/audio/speech", json=body, timeout=60)
        assert reply.status_code == 422, reply.text[:300]
        assert reply.headers["content-type"] == "application/json"
        error = reply.json()["error"]
        assert error["code"] == "invalid_request" and error["type"] == "invalid_request_error"
        assert "max_frames" in error["message"] and "talker length" in error["message"], error
        assert asyncio.run(wait_for(lambda: gateway_idle(gateway, stages), timeout=20))
