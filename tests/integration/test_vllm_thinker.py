"""A thinker on vLLM (`serve thinker --backend vllm`, run by the vLLM environment's python) beside a
transformers thinker, both real processes sharing one talker and one code2wav.

The two thinkers must be indistinguishable to everything after them for text prompts: the same
token ids (greedy, alone and batched inside vLLM), hence the same codes and audio; a cancelled or
timed-out stream must end its request inside vLLM (vLLM's own `vllm:num_requests_*` gauges on the
thinker's /metrics, not only ours); a given answer (speech) is spoken the same; and the vLLM thinker
says in its Info that it takes text only, refusing media with INVALID_ARGUMENT.
One stack per module: vLLM's engine takes ~20-40 s to start here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from omnistream.cli.launcher import start_services
from omnistream.models.family import read_config
from omnistream.proto.omni.v1 import stage_pb2, stage_pb2_grpc
from omnistream.wire.chunk_key import ChunkKey, Stage
from omnistream.wire.convert import message_proto
from tests.media_samples import image
from tests.vllm_env import VLLM_PYTHON, requires_vllm

from .conftest import gateway_process, metric, wait_for
from .stage_calls import collect_services, make_request, raw_stream

pytestmark = requires_vllm

PROMPTS = [
    [{"role": "user", "content": "Tell me a story about the sea."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, how are you?"}],
]
SPEECH = "The sea was calm tonight, and the boats came home."
SPEECH_EXTRA = {"talker_temperature": 0, "initial_codec_chunk_frames": 4, "max_audio_frames": 40}
# Tokens of a request that is still running when the test cancels it: as many as the tiny model's
# positions allow (8192; both thinkers serve MAX_MODEL_LEN), since this machine's vLLM made 3000 in
# under 5 s, before a cancel from a client starved by make test's other worker reached it.
MAX_MODEL_LEN = 8192
LONG = MAX_MODEL_LEN - 16
GENERATED = "vllm:generation_tokens_total"


def args(stage: str, model: str, *extra: str) -> list[str]:
    return ["serve", stage, "--model", model, "--dtype", "float32", "--max-batch", "8", *extra]


@pytest.fixture(scope="module")
def stack(tiny_model_dir):
    """thinker-vllm, thinker (transformers), talker, code2wav."""
    specs = {
        "thinker-vllm": args(
            "thinker", tiny_model_dir, "--backend", "vllm", "--max-model-len", str(MAX_MODEL_LEN)
        ),
        "thinker": args("thinker", tiny_model_dir, "--max-model-len", str(MAX_MODEL_LEN)),
        "talker": args("talker", tiny_model_dir),
        "code2wav": args("code2wav", tiny_model_dir),
    }
    services = start_services(specs, timeout=300, pythons={"thinker-vllm": VLLM_PYTHON})
    try:
        yield services
    finally:
        for service in services.values():
            service.stop()


def chain(stack, thinker: str) -> dict:
    return {"thinker": stack[thinker], "talker": stack["talker"], "code2wav": stack["code2wav"]}


def thinker_open(rid: str, ids: list[int], max_tokens: int = 24, **kw) -> stage_pb2.ThinkerRequest:
    open_ = stage_pb2.ThinkerOpen(
        request_id=rid, prompt_ids=ids, max_tokens=max_tokens, ignore_eos=True, **kw
    )
    return stage_pb2.ThinkerRequest(key=ChunkKey(rid, Stage.GATEWAY, 0).to_proto(), open=open_)


async def thinker_tokens(service, rid: str, ids: list[int]) -> tuple[list[int], list[int], str]:
    """(generated ids, the first chunk's prompt ids, finish reason) of one raw thinker stream."""
    async with grpc.aio.insecure_channel(service.address) as channel:
        call = stage_pb2_grpc.ThinkerServiceStub(channel).Stream(timeout=60)
        await call.write(thinker_open(rid, ids))
        await call.done_writing()
        tokens, prompt, reason = [], None, ""
        async for chunk in call:
            tokens.extend(chunk.token_ids)
            if prompt is None:
                prompt = list(chunk.prompt_ids)
            reason = chunk.finish_reason or reason
        return tokens, prompt, reason


def vllm_idle(service) -> bool:
    """vLLM's scheduler holds no request, and neither does our side of the thinker."""
    return (
        metric(service, "vllm:num_requests_running") == 0
        and metric(service, "vllm:num_requests_waiting") == 0
        and metric(service, "omnistream_stage_engine_requests") == 0
        and metric(service, "omnistream_stage_open_streams") == 0
    )


def test_info_says_text_only(stack):
    async def info(name):
        async with grpc.aio.insecure_channel(stack[name].address) as channel:
            return await stage_pb2_grpc.ThinkerServiceStub(channel).Info(stage_pb2.InfoRequest())

    vllm, ours = asyncio.run(info("thinker-vllm")), asyncio.run(info("thinker"))
    assert list(vllm.input_modalities) == ["text"]
    assert set(ours.input_modalities) == {"text", "audio", "image", "video"}
    assert vllm.family == ours.family and vllm.limits.max_model_len == ours.limits.max_model_len


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_text_codes_and_audio_equal_the_transformers_thinkers(stack, index):
    """The whole chain, greedy, once with each thinker: the same ids, text, codec frames, samples."""
    want = asyncio.run(collect_services(chain(stack, "thinker"), make_request(PROMPTS[index]), f"tf-{index}"))
    got = asyncio.run(
        collect_services(chain(stack, "thinker-vllm"), make_request(PROMPTS[index]), f"v-{index}")
    )
    assert got[3].output_ids == want[3].output_ids and len(want[3].output_ids) > 0
    assert got[0] == want[0]
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])


def test_concurrent_prompts_batched_in_vllm_match_alone(stack):
    """Six prompts of different lengths at once (vLLM batches them into shared steps) against the
    transformers thinker's tokens for each alone; the first chunk carries the prompt ids."""
    prompts = [[(i * 31 + k * 7) % 400 + 10 for i in range(n)] for k, n in enumerate((3, 9, 17, 40, 75, 130))]

    async def run():
        want = [await thinker_tokens(stack["thinker"], f"alone-{k}", p) for k, p in enumerate(prompts)]
        vllm = stack["thinker-vllm"]
        got = await asyncio.gather(*(thinker_tokens(vllm, f"batch-{k}", p) for k, p in enumerate(prompts)))
        return want, got

    want, got = asyncio.run(run())
    assert got == want
    assert [g[1] for g in got] == prompts and {g[2] for g in got} == {"length"}


@pytest.mark.parametrize("how", ["cancel", "deadline"])
def test_an_ended_stream_ends_its_request_inside_vllm(stack, how):
    service = stack["thinker-vllm"]

    async def run(attempt: int):
        async with grpc.aio.insecure_channel(service.address) as channel:
            stub = stage_pb2_grpc.ThinkerServiceStub(channel)
            # The deadline must fall while the request runs: well after its 8th token, however
            # loaded the machine (make test's other worker; a probe of 8 tokens says how fast it is
            # now), and long before its LONG tokens.
            started = time.monotonic()
            probe = stub.Stream(timeout=60)
            await probe.write(thinker_open(f"probe-{how}-{attempt}", [5, 6, 7], max_tokens=8))
            await probe.done_writing()
            assert sum([len(c.token_ids) async for c in probe]) == 8
            deadline = max(3.0, 10 * (time.monotonic() - started))
            # What vLLM itself generated, from its own counter: its running gauge is not a reliable
            # witness on a loaded machine (read late by a starved client, it missed the request).
            before = metric(service, GENERATED)
            call = stub.Stream(timeout=60 if how == "cancel" else deadline)
            got = 0
            try:
                # In the try: on a starved machine the deadline can fall before the open is written.
                await call.write(thinker_open(f"end-{how}-{attempt}", [5, 6, 7], max_tokens=LONG))
                await call.done_writing()
                async for chunk in call:
                    got += len(chunk.token_ids)
                    if got >= 8 and how == "cancel":
                        call.cancel()
                        break
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else await call.code()
                assert how == "deadline" and code == grpc.StatusCode.DEADLINE_EXCEEDED
            # All LONG made before it ended (a fast machine outran the deadline): the loop below
            # tries again, and asserts that one attempt ended early.
            idle = await wait_for(lambda: vllm_idle(service), timeout=10.0)
            return metric(service, GENERATED) - before, idle

    # The test needs the request still running when its stream ends. A client starved by a loaded
    # machine (make test's other worker) may read its 8th token only after vLLM made all LONG, a
    # fast one may make all LONG before a deadline of 3 s, and a starved service may let the
    # deadline pass before the request starts: such an attempt proves nothing either way, and
    # another one is made (a cancel or deadline that never reached vLLM would let every attempt
    # run to LONG).
    for attempt in range(3):
        generated, idle = asyncio.run(run(attempt))
        assert idle  # nothing of it is left inside vLLM
        if 8 <= generated < LONG:
            break
    # vLLM ran it (its 8 tokens at least) and stopped it early: it never made its LONG tokens.
    assert 8 <= generated < LONG, generated


def test_a_given_answer_is_spoken_the_same(stack):
    """POST /v1/audio/speech through a gateway over each thinker: the same wav, byte for byte."""
    wavs = []
    for thinker in ("thinker", "thinker-vllm"):
        with gateway_process(chain(stack, thinker)) as gateway:
            body = {"model": "qwen3-omni", "voice": "ethan", "input": SPEECH, "response_format": "wav"}
            reply = httpx.post(
                f"http://127.0.0.1:{gateway.http_port}/v1/audio/speech",
                json={**body, **SPEECH_EXTRA},
                timeout=120,
            )
            assert reply.status_code == 200, reply.text
            wavs.append(reply.content)
    assert wavs[0][:4] == b"RIFF" and len(wavs[0]) > 1000
    assert wavs[1] == wavs[0]


def test_media_is_refused_by_name(stack):
    """A chat with an image sent to the vLLM thinker itself (the gateway routes such requests to a
    thinker whose Info lists images): INVALID_ARGUMENT saying why, and the thinker keeps serving."""
    messages = [
        {"role": "user", "content": [{"type": "image", "image": image()}, {"type": "text", "text": "?"}]}
    ]
    open_ = stage_pb2.ThinkerOpen(request_id="media", max_tokens=4)
    open_.messages.append(message_proto(messages[0]))
    first = stage_pb2.ThinkerRequest(key=ChunkKey("media", Stage.GATEWAY, 0).to_proto(), open=open_)

    async def run():
        async with grpc.aio.insecure_channel(stack["thinker-vllm"].address) as channel:
            return await raw_stream(stage_pb2_grpc.ThinkerServiceStub(channel).Stream, [first])

    code, details = asyncio.run(run())
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "text prompts only" in details
    tokens, _, _ = asyncio.run(thinker_tokens(stack["thinker-vllm"], "after-media", [5, 6, 7]))
    assert len(tokens) == 24


def test_bad_requests_get_the_transformers_thinkers_statuses(stack, tiny_model_dir):
    """Refused before vLLM sees them, with the same status and message on both thinkers."""
    image_token = read_config(tiny_model_dir)["thinker_config"]["image_token_id"]
    cases = {
        "too-long": thinker_open("too-long", [5, 6, 7], max_tokens=MAX_MODEL_LEN + 1),
        "vocab": thinker_open("vocab", [5, 100000]),
        "placeholder": thinker_open("placeholder", [5, image_token, 7]),
    }

    async def run(name):
        async with grpc.aio.insecure_channel(stack[name].address) as channel:
            stub = stage_pb2_grpc.ThinkerServiceStub(channel)
            return {case: await raw_stream(stub.Stream, [first]) for case, first in cases.items()}

    vllm, ours = asyncio.run(run("thinker-vllm")), asyncio.run(run("thinker"))
    assert vllm == ours
    assert {code for code, _ in vllm.values()} == {grpc.StatusCode.INVALID_ARGUMENT}
    assert "model length" in vllm["too-long"][1] and "placeholder" in vllm["placeholder"][1]
    assert vllm_idle(stack["thinker-vllm"])


def _children(pid: int) -> dict[int, bytes]:
    """Direct children of `pid` and their command lines (/proc; no psutil)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if int((entry / "stat").read_text().rpartition(")")[2].split()[1]) == pid:
                    found[int(entry.name)] = (entry / "cmdline").read_bytes()
    return found


@pytest.mark.slow
def test_a_dead_vllm_engine_fails_with_unavailable_and_exits_3(tiny_model_dir):
    """vLLM's engine core process killed while idle: the next request gets UNAVAILABLE and the
    thinker exits 3 (as a poisoned GPU does), for its supervisor to start a fresh one."""
    spec = {"thinker": args("thinker", tiny_model_dir, "--backend", "vllm")}
    service = start_services(spec, timeout=300, pythons={"thinker": VLLM_PYTHON})["thinker"]
    try:
        (core,) = [
            pid for pid, cmd in _children(service.proc.pid).items() if cmd.startswith(b"VLLM::EngineCore")
        ]
        os.kill(core, signal.SIGKILL)
        time.sleep(2)

        async def run():
            async with grpc.aio.insecure_channel(service.address) as channel:
                return await raw_stream(
                    stage_pb2_grpc.ThinkerServiceStub(channel).Stream, [thinker_open("x", [5, 6])]
                )

        code, details = asyncio.run(run())
        assert code == grpc.StatusCode.UNAVAILABLE and "died" in details
        assert service.proc.wait(30) == 3
    finally:
        service.stop()


def test_one_gateway_over_both_thinkers_sends_text_to_either_and_media_to_the_one_that_takes_it(stack):
    """A mixed deployment behind one gateway: both thinkers join (their Infos differ only in what they
    take), the gateway says it takes images, text requests are spread over both (least loaded),
    and every request with an image runs on the transformers thinker, each answered."""
    import base64

    from tests.media_files import image_file

    picture = "data:image/png;base64," + base64.b64encode(image_file()).decode()
    with gateway_process(stack) as gateway:  # thinker-vllm and thinker both join as thinkers
        base = f"http://127.0.0.1:{gateway.http_port}"
        card = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["omnistream"]
        assert {"text", "image"} <= set(card["input_modalities"])
        served = {
            name: metric(stack[name], "omnistream_stage_requests_total")
            for name in ("thinker", "thinker-vllm")
        }

        def chat(content) -> None:
            body = {"model": "qwen3-omni", "messages": [{"role": "user", "content": content}]}
            body |= {"modalities": ["text"], "max_tokens": 4}
            reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["finish_reason"] in ("stop", "length")

        for _ in range(4):
            chat("Hello there")
        text = {
            name: metric(stack[name], "omnistream_stage_requests_total") - served[name] for name in served
        }
        assert text["thinker"] >= 1 and text["thinker-vllm"] >= 1 and sum(text.values()) == 4
        for _ in range(3):
            chat(
                [
                    {"type": "image_url", "image_url": {"url": picture}},
                    {"type": "text", "text": "What is it?"},
                ]
            )
        media = {
            name: metric(stack[name], "omnistream_stage_requests_total") - served[name] - text[name]
            for name in served
        }
        assert media == {"thinker": 3, "thinker-vllm": 0}


def test_both_thinkers_report_the_prompt_tokens_their_prefix_cache_served(stack):
    """The same long prompt twice: the second run's chunk 0 says how many prompt tokens came from
    the prefix cache (vLLM's automatic prefix caching; ours, thinker/prefix.py), and vLLM's
    /metrics count the hits. In a cache scope of its own (vLLM: its cache_salt) the same prompt
    finds nothing, then finds its own."""
    ids = [5 + (i * 7) % 200 for i in range(300)]

    async def cached_tokens(service, rid: str, scope: bytes = b"") -> int:
        async with grpc.aio.insecure_channel(service.address) as channel:
            call = stage_pb2_grpc.ThinkerServiceStub(channel).Stream(timeout=60)
            await call.write(thinker_open(rid, ids, max_tokens=2, cache_scope=scope))
            await call.done_writing()
            chunks = [chunk async for chunk in call]
            assert chunks[-1].usage.cached_tokens == chunks[0].cached_tokens
            return chunks[0].cached_tokens

    vllm = stack["thinker-vllm"]
    hits = metric(vllm, "vllm:prefix_cache_hits_total")
    for name in ("thinker", "thinker-vllm"):
        first = asyncio.run(cached_tokens(stack[name], f"apc-1-{name}"))
        second = asyncio.run(cached_tokens(stack[name], f"apc-2-{name}"))
        assert first < second < len(ids), (name, first, second)  # never the last position
        assert second >= len(ids) // 2, (name, second)
        assert asyncio.run(cached_tokens(stack[name], f"apc-scoped-1-{name}", b"session")) == 0, name
        assert asyncio.run(cached_tokens(stack[name], f"apc-scoped-2-{name}", b"session")) >= second, name
    assert metric(vllm, "vllm:prefix_cache_hits_total") - hits >= second
