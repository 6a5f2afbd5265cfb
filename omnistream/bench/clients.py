"""The benchmark's clients: the in-process pipeline, and the gateway over gRPC or REST/SSE."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from omnistream.bench.stats import RequestResult
from omnistream.pipeline import AudioEvent, DoneEvent, GenerationRequest, Pipeline, TextEvent
from omnistream.request.defaults import DEFAULTS, RequestInput, resolve

if TYPE_CHECKING:
    from omnistream.proto.omni.v1 import common_pb2, gateway_pb2

REQUEST_TIMEOUT = 300.0  # a stuck request counts as a failure instead of stalling the run


@dataclass(frozen=True)
class Workload:
    output_len: int = 100
    audio_frames: int = 340
    ignore_eos: bool = True
    initial_codec_chunk_frames: int | None = None  # None: chosen from load
    audio_input_seconds: float = 0.0  # > 0: the spoken-input workload (bench/audio_input.py)
    codec_chunk_schedule: str | None = None  # None: the table's default ("grow")

    @property
    def label(self) -> str:
        """The suffix of this workload's target names in the report ("" for the text workload with
        the default schedule): `[fixed]`, `+audio-in-5s`, `[grow]+audio-in-5s`."""
        schedule = f"[{self.codec_chunk_schedule}]" if self.codec_chunk_schedule else ""
        spoken = f"+audio-in-{self.audio_input_seconds:g}s" if self.audio_input_seconds else ""
        return schedule + spoken

    def request_input(self, prompt_ids: list[int], async_chunk: bool, encoded: bool = False) -> RequestInput:
        """One benchmark request as given, for every target alike (each resolves it through the one
        table of defaults: in process here, behind the gateway for the services).

        Greedy text and voice with no repetition penalty, deliberately not the table's sampled
        defaults: every target and repeat then does the same work (the same codes, the same
        audio), so their latencies compare like for like.
        """
        messages = None
        ids: list[int] | None = prompt_ids
        if self.audio_input_seconds:  # the random prompt only sets the count; the turn is spoken
            from omnistream.bench.audio_input import audio_message

            messages, ids = [audio_message(self.audio_input_seconds, encoded)], None
        return RequestInput(
            messages=messages,
            prompt_ids=ids,
            max_tokens=self.output_len,
            ignore_eos=self.ignore_eos,
            temperature=0.0,
            max_audio_frames=self.audio_frames,
            talker_temperature=0.0,
            talker_repetition_penalty=1.0,
            initial_codec_chunk_frames=self.initial_codec_chunk_frames,
            codec_chunk_schedule=self.codec_chunk_schedule,
            async_chunk=async_chunk,
        )


def _sampling_proto(given: RequestInput, prefix: str) -> common_pb2.Sampling | None:
    """The `Sampling` message for the knobs given, None when none is: a set message is read as sent,
    so the knobs not given are filled from the same table the gateway would use."""
    from omnistream.proto.omni.v1 import common_pb2

    names = ("temperature", "top_p", "top_k", "repetition_penalty")
    values = {n: getattr(given, prefix + n) for n in names}
    seed = getattr(given, prefix + "seed")
    if all(v is None for v in values.values()) and seed is None:
        return None
    msg = common_pb2.Sampling(
        **{n: getattr(DEFAULTS, prefix + n) if v is None else v for n, v in values.items()}
    )
    if seed is not None:
        msg.seed = seed
    return msg


def grpc_request(given: RequestInput, timeout: float | None = None) -> gateway_pb2.GenerateRequest:
    """`given` as an omni.v1.Gateway request (the inverse of `gateway.api.grpc.to_request_input`)."""
    from omnistream.client.request import gateway_message
    from omnistream.proto.omni.v1 import gateway_pb2

    request = gateway_pb2.GenerateRequest(
        messages=[gateway_message(m) for m in given.messages or ()],
        prompt_ids=list(given.prompt_ids or ()),
        max_tokens=given.max_tokens or 0,
        ignore_eos=bool(given.ignore_eos),
        text_only=given.return_audio is False,
        speaker=given.voice or "",
        max_audio_frames=given.max_audio_frames or 0,
    )
    for field, prefix in (("sampling", ""), ("talker_sampling", "talker_")):
        msg = _sampling_proto(given, prefix)
        if msg is not None:
            getattr(request, field).CopyFrom(msg)
    if given.initial_codec_chunk_frames is not None:
        request.initial_codec_chunk_frames = given.initial_codec_chunk_frames
    if given.codec_chunk_schedule is not None:
        from omnistream.wire.convert import SCHEDULE_TO_PROTO

        request.codec_chunk_schedule = SCHEDULE_TO_PROTO[given.codec_chunk_schedule]
    if given.async_chunk is not None:
        request.async_chunk = given.async_chunk
    if timeout is not None:
        request.timeout_seconds = timeout
    return request


REST_FIELDS = (
    "max_tokens", "ignore_eos", "temperature", "top_p", "seed", "max_audio_frames", "talker_temperature",
    "talker_top_p", "talker_top_k", "talker_repetition_penalty", "talker_seed",
    "initial_codec_chunk_frames", "codec_chunk_schedule", "async_chunk",
)  # fmt: skip


def rest_body(given: RequestInput) -> dict[str, Any]:
    """`given` as a chat-completions body (the inverse of `gateway.api.openai.chat.to_request_input`); only
    the knobs given are sent. REST takes messages, not ids, and has no thinker top_k or penalty."""
    unsupported = [
        n for n in ("prompt_ids", "system", "top_k", "repetition_penalty") if getattr(given, n) is not None
    ]
    if unsupported:
        raise ValueError(f"REST has no field for {unsupported}")
    body: dict[str, Any] = {"messages": [dict(m) for m in given.messages or ()]}
    body |= {n: getattr(given, n) for n in REST_FIELDS if getattr(given, n) is not None}
    if given.return_audio is not None:
        body["modalities"] = ["text", "audio"] if given.return_audio else ["text"]
    if given.voice is not None:
        body["audio"] = {"voice": given.voice}
    return body


class InProcessClient:
    name = "in-process"

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    async def run(self, prompt_ids: list[int], workload: Workload, async_chunk: bool) -> RequestResult:
        result = RequestResult(start=time.perf_counter())
        request = resolve(workload.request_input(prompt_ids, async_chunk))
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                await self._consume(request, result)
                result.ok = True
        except Exception as exc:  # a failed request is counted, not fatal
            result.error = f"{type(exc).__name__}: {exc}"[:200]
        result.end = time.perf_counter()
        return result

    async def _consume(self, request: GenerationRequest, result: RequestResult) -> None:
        async for event in self.pipeline.generate(request):
            now = time.perf_counter()
            if isinstance(event, TextEvent):
                result.token_times.append(now)
                result.tokens += len(event.token_ids)
            elif isinstance(event, AudioEvent):
                result.add_audio(now, event.audio.size, event.sample_rate)
            elif isinstance(event, DoneEvent):
                return
        raise RuntimeError("the stream ended without its done event")


class GrpcGatewayClient:
    name = "services"

    def __init__(self, address: str) -> None:
        import grpc

        from omnistream.proto.omni.v1 import gateway_pb2_grpc

        self.channel = grpc.aio.insecure_channel(address)
        self.stub = gateway_pb2_grpc.GatewayStub(self.channel)  # type: ignore[no-untyped-call]  # grpc's stubs are untyped

    async def run(self, prompt_ids: list[int], workload: Workload, async_chunk: bool) -> RequestResult:
        import grpc

        from omnistream.wire.tensors import numpy_from_proto

        given = workload.request_input(prompt_ids, async_chunk, encoded=True)
        request = grpc_request(given, timeout=REQUEST_TIMEOUT)
        result = RequestResult(start=time.perf_counter())
        try:
            async for event in self.stub.Generate(request):
                now = time.perf_counter()
                kind = event.WhichOneof("event")
                if kind == "text":
                    result.token_times.append(now)
                    result.tokens += len(event.text.token_ids)
                elif kind == "audio":
                    samples = numpy_from_proto(event.audio.pcm).size
                    result.add_audio(now, samples, event.audio.sample_rate)
                elif kind == "end":
                    result.ok = True
        except grpc.aio.AioRpcError as exc:
            result.error = f"{exc.code().name}: {exc.details()}"[:200]
        result.end = time.perf_counter()
        return result

    async def close(self) -> None:
        await self.channel.close()


class RestGatewayClient:
    name = "services-rest"

    def __init__(self, base_url: str, tokenizer: Any, sample_rate: int) -> None:
        import httpx

        self.client = httpx.AsyncClient(base_url=base_url, timeout=600)
        self.tokenizer = tokenizer
        # pcm16 deltas carry no rate: the gateway's (its /v1/models card), read once; the model's
        # own (family.describe) until then or if the card has none.
        self.sample_rate = sample_rate
        self._rate_read = False

    async def _gateway_rate(self) -> int:
        import httpx

        if not self._rate_read:
            self._rate_read = True
            # A gateway that cannot say keeps the model's rate; its requests then fail on their own.
            with contextlib.suppress(httpx.HTTPError, ValueError):
                reply = await self.client.get("/v1/models")
                cards = (reply.json().get("data") or []) if reply.status_code == 200 else []
                reported = cards[0].get("omnistream", {}).get("sample_rate") if cards else None
                if reported:
                    self.sample_rate = int(reported)
        return self.sample_rate

    async def run(
        self,
        prompt_ids: list[int],
        workload: Workload,
        async_chunk: bool,
        headers: dict[str, str] | None = None,
    ) -> RequestResult:
        """`headers`: sent with the request (e.g. a `traceparent`: tools/tracing-cost --paired)."""
        if workload.audio_input_seconds:
            raise ValueError("the spoken-input workload runs over gRPC (--transport grpc)")
        # REST takes text: the random ids are decoded, so the prompt length is close to, not exactly, N.
        text = self.tokenizer.decode(prompt_ids[3:-5], skip_special_tokens=True)
        given = dataclasses.replace(
            workload.request_input(prompt_ids, async_chunk),
            prompt_ids=None,
            messages=[{"role": "user", "content": text}],
        )
        return await self.chat(given, headers)

    async def chat(self, given: RequestInput, headers: dict[str, str] | None = None) -> RequestResult:
        """One streamed chat completion of `given` (messages, not ids), pcm16 audio, usage included:
        every text and audio chunk's arrival, the answer's text, its usage (prompt and cached
        tokens)."""
        body = rest_body(given) | {"stream": True, "timeout": REQUEST_TIMEOUT}
        body["stream_options"] = {"include_usage": True}
        body["audio"] = {**body.get("audio", {}), "format": "pcm16"}
        rate = await self._gateway_rate()
        result = RequestResult(start=time.perf_counter())
        try:
            async with self.client.stream(
                "POST", "/v1/chat/completions", json=body, headers=headers
            ) as reply:
                if reply.status_code != 200:
                    result.error = f"HTTP {reply.status_code}"
                async for line in reply.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    now = time.perf_counter()
                    if line == "data: [DONE]":
                        result.ok = not result.error
                        break
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        result.error = chunk["error"]["message"][:200]
                        continue
                    delta = chunk["choices"][0]["delta"] if chunk.get("choices") else {}
                    audio = delta.get("audio") or {}
                    # With audio the text is the transcript (content null, as OpenAI sends it).
                    said = audio.get("transcript") or delta.get("content")
                    if said:
                        result.token_times.append(now)
                        result.tokens += 1
                        result.text += said
                    if audio.get("data"):
                        samples = len(base64.b64decode(audio["data"])) // 2  # pcm16 mono
                        result.add_audio(now, samples, rate)
                    usage = chunk.get("usage")
                    if usage:
                        result.tokens = usage["completion_tokens"]
                        result.prompt_tokens = usage.get("prompt_tokens")
                        result.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {exc}"[:200]
        result.end = time.perf_counter()
        return result

    async def close(self) -> None:
        await self.client.aclose()


class BenchClient(Protocol):
    """What the benchmark drives: `InProcessClient`, `GrpcGatewayClient` or `RestGatewayClient` (the
    gateway clients also have `close()`)."""

    name: str

    async def run(self, prompt_ids: list[int], workload: Workload, async_chunk: bool) -> RequestResult: ...


class Progress(Protocol):
    """A progress bar (tqdm's) that `run_cell` advances once a request."""

    def update(self, n: int = 1) -> object: ...


async def run_cell(
    client: BenchClient,
    prompts: list[list[int]],
    workload: Workload,
    async_chunk: bool,
    concurrency: int,
    request_rate: float,
    progress: Progress | None = None,
    seed: int = 0,
) -> tuple[list[RequestResult], float]:
    """Send every prompt with at most `concurrency` in flight, arrivals Poisson at `request_rate`/s."""
    import random

    rng = random.Random(seed)
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt: list[int]) -> RequestResult:
        async with gate:
            result = await client.run(prompt, workload, async_chunk)
        if progress is not None:
            progress.update(1)
        return result

    started = time.perf_counter()
    tasks = []
    for prompt in prompts:
        tasks.append(asyncio.create_task(one(prompt)))
        if request_rate != float("inf"):
            await asyncio.sleep(rng.expovariate(request_rate))
    results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - started
