"""The benchmark's clients: the in-process pipeline, and the gateway over gRPC or REST/SSE."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import dataclass

from omnistream.bench.stats import RequestResult
from omnistream.pipeline import AudioEvent, DoneEvent, GenerationRequest, Pipeline, TextEvent
from omnistream.sampling import SamplingParams

REQUEST_TIMEOUT = 300.0  # a stuck request counts as a failure instead of stalling the run


@dataclass(frozen=True)
class Workload:
    output_len: int = 100
    audio_frames: int = 340
    ignore_eos: bool = True
    initial_codec_chunk_frames: int | None = None  # None: chosen from load


class InProcessClient:
    name = "in-process"

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    async def run(self, prompt_ids: list[int], workload: Workload, async_chunk: bool) -> RequestResult:
        result = RequestResult(start=time.perf_counter())
        request = GenerationRequest(
            prompt_ids=prompt_ids,
            max_tokens=workload.output_len,
            ignore_eos=workload.ignore_eos,
            max_audio_frames=workload.audio_frames,
            initial_codec_chunk_frames=workload.initial_codec_chunk_frames,
            mode="async" if async_chunk else "sequential",
            sampling=SamplingParams(),
            talker_sampling=SamplingParams(),
        )
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
                result.first_audio = result.first_audio or now
                result.last_audio = now
                result.audio_seconds += event.audio.size / event.sample_rate
            elif isinstance(event, DoneEvent):
                return
        raise RuntimeError("the stream ended without its done event")


class GrpcGatewayClient:
    name = "services"

    def __init__(self, address: str) -> None:
        import grpc

        from omnistream.proto.omni.v1 import gateway_pb2_grpc

        self.channel = grpc.aio.insecure_channel(address)
        self.stub = gateway_pb2_grpc.GatewayStub(self.channel)

    async def run(self, prompt_ids: list[int], workload: Workload, async_chunk: bool) -> RequestResult:
        import grpc

        from omnistream.proto.omni.v1 import common_pb2, gateway_pb2
        from omnistream.tensors import numpy_from_proto

        request = gateway_pb2.GenerateRequest(
            prompt_ids=prompt_ids,
            max_tokens=workload.output_len,
            ignore_eos=workload.ignore_eos,
            max_audio_frames=workload.audio_frames,
            async_chunk=async_chunk,
            sampling=common_pb2.Sampling(temperature=0),
            talker_sampling=common_pb2.Sampling(temperature=0),
            timeout_seconds=REQUEST_TIMEOUT,
        )
        if workload.initial_codec_chunk_frames is not None:
            request.initial_codec_chunk_frames = workload.initial_codec_chunk_frames
        result = RequestResult(start=time.perf_counter())
        try:
            async for event in self.stub.Generate(request):
                now = time.perf_counter()
                kind = event.WhichOneof("event")
                if kind == "text":
                    result.token_times.append(now)
                    result.tokens += len(event.text.token_ids)
                elif kind == "audio":
                    result.first_audio = result.first_audio or now
                    result.last_audio = now
                    result.audio_seconds += numpy_from_proto(event.audio.pcm).size / event.audio.sample_rate
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

    def __init__(self, base_url: str, tokenizer, sample_rate: int) -> None:
        import httpx

        self.client = httpx.AsyncClient(base_url=base_url, timeout=600)
        self.tokenizer = tokenizer
        self.sample_rate = sample_rate  # pcm16 deltas carry no rate: the model's own (family.describe)

    async def run(self, prompt_ids: list[int], workload: Workload, async_chunk: bool) -> RequestResult:
        # REST takes text: the random ids are decoded, so the prompt length is close to, not exactly, N.
        text = self.tokenizer.decode(prompt_ids[3:-5], skip_special_tokens=True)
        body = {
            "messages": [{"role": "user", "content": text}],
            "modalities": ["text", "audio"],
            "stream": True,
            "max_tokens": workload.output_len,
            "ignore_eos": workload.ignore_eos,
            "temperature": 0,
            "talker_temperature": 0,
            "talker_repetition_penalty": 1.0,
            "max_audio_frames": workload.audio_frames,
            "audio": {"format": "pcm16"},
            "timeout": REQUEST_TIMEOUT,
            "async_chunk": async_chunk,
        }
        if workload.initial_codec_chunk_frames is not None:
            body["initial_codec_chunk_frames"] = workload.initial_codec_chunk_frames
        result = RequestResult(start=time.perf_counter())
        try:
            async with self.client.stream("POST", "/v1/chat/completions", json=body) as reply:
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
                    if delta.get("content"):
                        result.token_times.append(now)
                        result.tokens += 1
                    if delta.get("audio"):
                        result.first_audio = result.first_audio or now
                        result.last_audio = now
                        result.audio_seconds += (
                            len(base64.b64decode(delta["audio"]["data"])) / 2 / self.sample_rate
                        )
                    if chunk.get("usage"):
                        result.tokens = chunk["usage"]["completion_tokens"]
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {exc}"[:200]
        result.end = time.perf_counter()
        return result

    async def close(self) -> None:
        await self.client.aclose()


async def run_cell(
    client,
    prompts: list[list[int]],
    workload: Workload,
    async_chunk: bool,
    concurrency: int,
    request_rate: float,
    progress=None,
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
