"""The two thinker backends side by side through their real services: transformers and vLLM.

Both thinkers run as `omnistream serve thinker` processes (the vLLM one with the vLLM environment's
python) on the same checkpoint and dtype, and are driven over their gRPC ThinkerService exactly as
the gateway drives them (text prompts; the talker is not involved in a text answer, so it is left
out of the measure). Per backend, in turn, A B B A over `repeats`:

- waves at each concurrency (default 1 and 10): TTFT (open sent -> first token chunk), ITL (the gap
  between token chunks, divided over the tokens a chunk carries: a consumer that lags gets several
  per chunk, so its median can be ~0), TPOT (a request's decode time over its tokens after the
  first), output tokens/s of the wave;
- multi-turn conversations: each turn re-sends the whole history as chat messages (what a realtime
  session does), TTFT at each turn (the median over `conversations` of them, one after another);
  the answer of one turn is the next turn's assistant message. vLLM's prefix cache keeps the
  shared history; the transformers thinker prefills it again.

Timings, not assertions: on a shared CPU the numbers move with the other load. The tiny model is far
from the shape of the real one (a 30B MoE on a GPU): what this shows on CPU is the per-step overhead
of each engine and what prefix caching saves, not GPU throughput.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from omnistream.cli.launcher import ServiceProcess, start_services, stop_services
from omnistream.proto.omni.v1 import stage_pb2, stage_pb2_grpc
from omnistream.wire.chunk_key import ChunkKey, Stage
from omnistream.wire.messages import message_proto

BACKENDS = ("transformers", "vllm")


@dataclass
class Timing:
    ttft: float
    gaps: list[float] = field(default_factory=list)  # seconds per token after the first chunk
    tokens: int = 0
    decode: float = 0.0  # first token chunk -> last one

    @property
    def tpot(self) -> float:
        """Seconds per output token after the first (robust to how tokens group into chunks)."""
        return self.decode / max(1, self.tokens - 1)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def one(
    stub: stage_pb2_grpc.ThinkerServiceStub,
    rid: str,
    max_tokens: int,
    *,
    ids: Sequence[int] | None = None,
    messages: Sequence[Mapping[str, Any]] | None = None,
    ignore_eos: bool = True,
) -> tuple[Timing, str]:
    """One thinker stream; its timing and its text."""
    open_ = stage_pb2.ThinkerOpen(request_id=rid, max_tokens=max_tokens, ignore_eos=ignore_eos)
    if ids is not None:
        open_.prompt_ids.extend(ids)
    else:
        assert messages is not None, f"{rid}: ids or messages"
        open_.messages.extend(message_proto(m) for m in messages)
    call = stub.Stream(timeout=600)
    started = time.perf_counter()
    await call.write(stage_pb2.ThinkerRequest(key=ChunkKey(rid, Stage.GATEWAY, 0).to_proto(), open=open_))
    await call.done_writing()
    timing, last, text = None, started, []
    async for chunk in call:
        now = time.perf_counter()
        n = len(chunk.token_ids)
        text.append(chunk.text_delta)
        if not n:
            continue
        if timing is None:
            timing = Timing(now - started)
        else:
            timing.gaps.extend([(now - last) / n] * n)
        timing.tokens += n
        timing.decode = now - started - timing.ttft
        last = now
    assert timing is not None, f"{rid}: no token"
    return timing, "".join(text)


async def wave(
    address: str, prompts: list[list[int]], concurrency: int, max_tokens: int, tag: str
) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = stage_pb2_grpc.ThinkerServiceStub(channel)  # type: ignore[no-untyped-call]  # grpc's stubs are untyped
        gate = asyncio.Semaphore(concurrency)

        async def run(i: int, ids: list[int]) -> Timing:
            async with gate:
                return (await one(stub, f"{tag}-{i}", max_tokens, ids=ids))[0]

        started = time.perf_counter()
        timings = await asyncio.gather(*(run(i, p) for i, p in enumerate(prompts)))
        wall = time.perf_counter() - started
    ttft = [t.ttft for t in timings]
    itl = [g for t in timings for g in t.gaps]
    return {
        "concurrency": concurrency,
        "requests": len(prompts),
        "ttft_ms_p50": 1000 * statistics.median(ttft),
        "ttft_ms_p99": 1000 * percentile(ttft, 0.99),
        "itl_ms_p50": 1000 * statistics.median(itl),
        "itl_ms_p99": 1000 * percentile(itl, 0.99),
        "tpot_ms_p50": 1000 * statistics.median(t.tpot for t in timings),
        "output_tokens_per_s": sum(t.tokens for t in timings) / wall,
    }


async def conversation(
    address: str, turns: int, user_words: int, answer_tokens: int, tag: str, seed: int = 0
) -> list[float]:
    """TTFT per turn of one conversation whose every turn re-sends the whole history."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful voice assistant."}]
    ttfts = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = stage_pb2_grpc.ThinkerServiceStub(channel)  # type: ignore[no-untyped-call]  # grpc's stubs are untyped
        for turn in range(1, turns + 1):
            words = " ".join(f"w{(turn * 7919 + k * 104729 + seed * 31) % 997}" for k in range(user_words))
            history.append({"role": "user", "content": f"Turn {turn}: {words}"})
            timing, text = await one(stub, f"{tag}-turn{turn}", answer_tokens, messages=history)
            ttfts.append(timing.ttft)
            history.append({"role": "assistant", "content": text})
    return ttfts


def start_thinker(
    backend: str, model: str, dtype: str, max_batch: int, vllm_python: str | None
) -> ServiceProcess:
    args = ["serve", "thinker", "--model", model, "--dtype", dtype, "--max-batch", str(max_batch)]
    pythons = {}
    if backend == "vllm":
        from omnistream.cli.up import vllm_python as resolve

        args += ["--backend", "vllm"]
        pythons = {backend: resolve(vllm_python)}
    return start_services({backend: args}, timeout=300, pythons=pythons)[backend]


def measure(
    model: str,
    *,
    backends: tuple[str, ...] = BACKENDS,
    concurrencies: tuple[int, ...] = (1, 10),
    requests_per_wave: int = 20,
    input_len: int = 128,
    max_tokens: int = 64,
    turns: int = 10,
    user_words: int = 40,
    answer_tokens: int = 24,
    repeats: int = 1,
    conversations: int = 3,
    dtype: str = "float32",
    vllm_python: str | None = None,
) -> dict[str, Any]:
    """Every backend's waves and conversation, A B B A; both thinkers run for the whole measure."""
    from omnistream.models.family import family_for

    family = family_for(model)
    config, tokenizer = family.load_config(model), family.load_tokenizer(model)
    prompts = family.random_prompts(config, tokenizer, requests_per_wave, input_len, seed=0)
    max_batch = max(concurrencies)
    services = {b: start_thinker(b, model, dtype, max_batch, vllm_python) for b in backends}
    order = [b for r in range(repeats) for b in (backends if r % 2 == 0 else backends[::-1])]
    results: dict[str, dict[str, Any]] = {b: {"waves": [], "turn_ttft_ms": []} for b in backends}
    try:
        for run, backend in enumerate(order):
            address = services[backend].address
            for c in concurrencies:
                n = requests_per_wave if c > 1 else max(4, requests_per_wave // 4)
                row = asyncio.run(wave(address, prompts[:n], c, max_tokens, f"{backend}-{run}-c{c}"))
                results[backend]["waves"].append(row)
            # Several conversations (different words), the median per turn: one TTFT is one sample.
            runs = [
                asyncio.run(
                    conversation(address, turns, user_words, answer_tokens, f"{backend}-{run}-{k}", k)
                )
                for k in range(conversations)
            ]
            per_turn = [1000 * statistics.median(t) for t in zip(*runs, strict=True)]
            results[backend]["turn_ttft_ms"].append(per_turn)
    finally:
        stop_services(list(services.values()))
    return results


def table(results: dict[str, Any], turns_shown: tuple[int, ...] = (1, 5, 10)) -> str:
    lines = [
        "backend       conc  reqs  TTFT p50/p99 ms    ITL p50/p99 ms   TPOT p50 ms  out tok/s",
    ]
    for backend, result in results.items():
        for row in result["waves"]:
            lines.append(
                f"{backend:<12} {row['concurrency']:>5} {row['requests']:>5}  "
                f"{row['ttft_ms_p50']:>7.1f} /{row['ttft_ms_p99']:>7.1f}  "
                f"{row['itl_ms_p50']:>6.2f} /{row['itl_ms_p99']:>6.2f}  {row['tpot_ms_p50']:>11.2f}"
                f"  {row['output_tokens_per_s']:>9.1f}"
            )
    lines.append("")
    lines.append(
        "multi-turn TTFT ms, median of the conversations (each turn re-sends the history): "
        + ", ".join(f"turn {t}" for t in turns_shown)
    )
    for backend, result in results.items():
        for run in result["turn_ttft_ms"]:
            shown = [f"{run[t - 1]:.1f}" for t in turns_shown if t <= len(run)]
            lines.append(f"{backend:<12} " + "  ".join(shown))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=".cache/tiny-model")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--concurrency", default="1,10")
    p.add_argument("--requests", type=int, default=20, help="requests per wave at concurrency > 1")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--conversations", type=int, default=3, help="conversations per run (median per turn)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--vllm-python", default=None)
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    results = measure(
        args.model,
        backends=tuple(args.backends.split(",")),
        concurrencies=tuple(int(c) for c in args.concurrency.split(",")),
        requests_per_wave=args.requests,
        input_len=args.input_len,
        max_tokens=args.max_tokens,
        turns=args.turns,
        repeats=args.repeats,
        conversations=args.conversations,
        dtype=args.dtype,
        vllm_python=args.vllm_python,
    )
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0
