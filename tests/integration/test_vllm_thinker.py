"""A thinker on vLLM (`serve thinker --backend vllm`, run by the vLLM environment's python) beside a
transformers thinker, both real processes sharing one talker and one code2wav.

The two thinkers must be indistinguishable to everything after them for text prompts: the same
token ids (greedy, alone and batched inside vLLM), hence the same codes and audio; a cancelled or
timed-out stream must end its request inside vLLM (vLLM's own `vllm:num_requests_*` gauges on the
thinker's /metrics, not only ours); a given answer (speech) is spoken the same; and the vLLM thinker
says in its Info that it takes text only, refusing media with INVALID_ARGUMENT.
One stack per module: vLLM's engine takes ~20-40 s to start here.

The vLLM thinker serves a copy of the tiny checkpoint whose text model has ENDLESS_LEN positions
(the weights are the same files; RoPE has no learned positions), so a request can ask for more
tokens than vLLM makes in many minutes here: a stream ended by cancel or deadline meets a request
that is still running, on a starved machine or a fast one, and nothing in the test is a race.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from omnistream.cli.launcher import start_services
from omnistream.models.family import read_config
from omnistream.proto.omni.v1 import stage_pb2, stage_pb2_grpc
from omnistream.service.server import STAGE_ORIGIN, STATUS_ORIGIN_METADATA_KEY
from omnistream.wire.chunk_key import ChunkKey, Stage
from omnistream.wire.messages import message_proto
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
# Both thinkers' model length for everything but the ended-stream tests.
MAX_MODEL_LEN = 8192
# The vLLM thinker's model length (its checkpoint copy has as many positions; KV 512 bytes a token):
# a request of ENDLESS tokens needs minutes of this machine's vLLM (~1,000 tokens/s at best, slower
# as its context grows), far past any test here, so it ends only when its stream does.
ENDLESS_LEN = 262144
ENDLESS = ENDLESS_LEN - 16
# The ended-by-deadline stream's deadline: it falls while the request runs (however slowly vLLM
# makes tokens on a loaded machine) unless the thinker was kept this long from reading its open.
DEADLINE_S = 10.0
# How long vLLM may take to let go of an ended request (a poll of its own gauges).
IDLE_TIMEOUT_S = 30.0
GENERATED = "vllm:generation_tokens_total"
STAGE_REQUESTS = "omnistream_stage_requests_total"
STAGE_ABORTS = "omnistream_stage_aborts_total"


def args(stage: str, model: str, *extra: str) -> list[str]:
    return ["serve", stage, "--model", model, "--dtype", "float32", "--max-batch", "8", *extra]


def with_positions(model_dir: str, directory: Path, positions: int) -> str:
    """A copy of the checkpoint in `model_dir` whose thinker text model has `positions` positions:
    the config rewritten, every other file linked (the same weights, tokenizer, processor)."""
    directory.mkdir(parents=True, exist_ok=True)
    for source in Path(model_dir).iterdir():
        if source.name != "config.json" and source.is_file():
            (directory / source.name).symlink_to(source.resolve())
    config = json.loads((Path(model_dir) / "config.json").read_text())
    config["thinker_config"]["text_config"]["max_position_embeddings"] = positions
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return str(directory)


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tmp_path_factory):
    """thinker-vllm (ENDLESS_LEN positions), thinker (transformers), talker, code2wav."""
    long_dir = with_positions(tiny_model_dir, tmp_path_factory.mktemp("vllm") / "tiny", ENDLESS_LEN)
    specs = {
        "thinker-vllm": args("thinker", long_dir, "--backend", "vllm", "--max-model-len", str(ENDLESS_LEN)),
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
    assert vllm.family == ours.family
    assert (vllm.limits.max_model_len, ours.limits.max_model_len) == (ENDLESS_LEN, MAX_MODEL_LEN)


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


@dataclass
class Ended:
    """How an ended stream went, as its client saw it."""

    status: grpc.StatusCode
    details: str
    by_stage: bool  # the status is one the stage sent (its origin mark), not one gRPC made up
    tokens: int  # read before the stream ended
    first_token_s: float | None  # from the call's start

    def __str__(self) -> str:
        first = "none" if self.first_token_s is None else f"after {self.first_token_s:.2f} s"
        origin = "the stage" if self.by_stage else "gRPC"
        read = f"{self.tokens} tokens read, the first {first}"
        return f"{self.status.name} from {origin} ({self.details!r}), {read}"


# Statuses gRPC makes up for a call that ended on the client's side (no stage sent them): any
# UNAVAILABLE, a transport that broke (seen once under load: 'sendmsg: Broken pipe' before the first
# token), and INTERNAL 'Internal error from Core', a write or half-close onto a call its deadline had
# already ended (a client starved past the deadline before it read: grpc/grpc#36066 reports it in
# place of DEADLINE_EXCEEDED).
def ended_by_grpc(ended: Ended) -> bool:
    if ended.by_stage:
        return False
    internal = (ended.status, ended.details) == (grpc.StatusCode.INTERNAL, "Internal error from Core")
    return internal or ended.status == grpc.StatusCode.UNAVAILABLE


async def end_stream(service, how: str, rid: str) -> Ended:
    """Open an ENDLESS request and end its stream by `how`: "cancel" cancels the call once its first
    tokens arrived (however long vLLM takes to make them), "deadline" reads what comes until
    DEADLINE_S ends the call.

    Every way the call can end on this side is the call's status: a deadline that falls during a
    write surfaces as AioRpcError, InvalidStateError or grpc's ExecuteBatchError depending on the
    operation it interrupts, and each means the call is over; its status says how."""
    async with grpc.aio.insecure_channel(service.address) as channel:
        started = time.monotonic()
        call = stage_pb2_grpc.ThinkerServiceStub(channel).Stream(
            timeout=None if how == "cancel" else DEADLINE_S
        )
        got, first = 0, None
        try:
            await call.write(thinker_open(rid, [5, 6, 7], max_tokens=ENDLESS))
            await call.done_writing()
            async for chunk in call:
                got += len(chunk.token_ids)
                first = time.monotonic() - started if first is None else first
                if how == "cancel":
                    call.cancel()
                    break
        except Exception:  # the call ended early: its status below says how
            pass
        trailers = await call.trailing_metadata() or ()
        by_stage = (STATUS_ORIGIN_METADATA_KEY, STAGE_ORIGIN) in tuple(trailers)
        return Ended(await call.code(), await call.details() or "", by_stage, got, first)


@pytest.mark.parametrize("how", ["cancel", "deadline"])
def test_an_ended_stream_ends_its_request_inside_vllm(stack, how):
    """The request cannot finish by itself (ENDLESS tokens), so vLLM letting go of it proves that
    the stream's end reached vLLM: its own gauges say nothing runs or waits, its own counter of
    generated tokens stops short, and the stage counts the request as opened and aborted.

    The stream ends as `how` says, or as gRPC reports a call it ended itself (`ended_by_grpc`, without
    the stage's mark): the thinker must let go of its request all the same, so the same witnesses
    hold."""
    service = stack["thinker-vllm"]
    opened, aborted = metric(service, STAGE_REQUESTS), metric(service, STAGE_ABORTS)
    generated = metric(service, GENERATED)

    async def run():
        ended = await end_stream(service, how, f"end-{how}")
        idle = await wait_for(lambda: vllm_idle(service), timeout=IDLE_TIMEOUT_S)
        return ended, idle

    ended, idle = asyncio.run(run())
    made = metric(service, GENERATED) - generated
    seen = (
        f"{ended}; the stage opened {metric(service, STAGE_REQUESTS) - opened:g} and aborted "
        f"{metric(service, STAGE_ABORTS) - aborted:g}; vLLM made {made:g} tokens"
    )
    want = grpc.StatusCode.CANCELLED if how == "cancel" else grpc.StatusCode.DEADLINE_EXCEEDED
    by_grpc = ended_by_grpc(ended)
    assert ended.status == want or by_grpc, seen
    assert how == "deadline" or by_grpc or ended.tokens >= 1, seen  # cancelled once tokens came
    assert idle, f"vLLM still holds the request after its stream ended: {seen}"
    assert metric(service, STAGE_REQUESTS) - opened == 1, seen
    assert metric(service, STAGE_ABORTS) - aborted == 1, seen
    assert ended.tokens <= made < ENDLESS, seen
    assert metric(service, GENERATED) - generated == made, seen  # nothing more after it was let go


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
    """Refused before vLLM sees them, with the same status and message on both thinkers (a
    request too long for a thinker's model length: one token more than its own)."""
    image_token = read_config(tiny_model_dir)["thinker_config"]["image_token_id"]
    lengths = {"thinker-vllm": ENDLESS_LEN, "thinker": MAX_MODEL_LEN}

    async def run(name):
        cases = {
            "too-long": thinker_open("too-long", [5, 6, 7], max_tokens=lengths[name] + 1),
            "vocab": thinker_open("vocab", [5, 100000]),
            "placeholder": thinker_open("placeholder", [5, image_token, 7]),
        }
        async with grpc.aio.insecure_channel(stack[name].address) as channel:
            stub = stage_pb2_grpc.ThinkerServiceStub(channel)
            return {case: await raw_stream(stub.Stream, [first]) for case, first in cases.items()}

    vllm, ours = asyncio.run(run("thinker-vllm")), asyncio.run(run("thinker"))
    code, details = vllm.pop("too-long")
    assert f"max_tokens ({ENDLESS_LEN + 1}) exceeds the model length {ENDLESS_LEN}" in details
    said = details.replace(str(ENDLESS_LEN + 1), str(MAX_MODEL_LEN + 1))
    assert (code, said.replace(str(ENDLESS_LEN), str(MAX_MODEL_LEN))) == ours.pop("too-long")
    assert vllm == ours
    assert {code for code, _ in vllm.values()} == {grpc.StatusCode.INVALID_ARGUMENT}
    assert "placeholder" in vllm["placeholder"][1]
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
