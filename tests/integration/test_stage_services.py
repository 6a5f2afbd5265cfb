"""The three stage services driven directly over gRPC (no gateway), as real processes."""

from __future__ import annotations

import asyncio
import signal

import grpc
import numpy as np
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.serving.stage_calls import run_request
from omnistream.cli.launcher import start_services
from omnistream.models.qwen3_omni.checkpoint import load_tokenizer
from omnistream.models.qwen3_omni.codec_chunks import SCHEDULES, ChunkPlan
from omnistream.pipeline import AudioEvent, TextEvent, collect
from omnistream.proto.omni.v1 import common_pb2, stage_pb2, stage_pb2_grpc
from omnistream.wire.chunk_key import ChunkKey, Stage

from .conftest import metric, stage_args, wait_for
from .stage_calls import (
    c2w_input,
    c2w_open,
    collect_services,
    make_request,
    raw_stream,
    request_plan,
    stubs,
    talker_input,
    talker_open,
)

PROMPTS = [
    [{"role": "user", "content": "Tell me a story about the sea."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, how are you?"}],
]


@pytest.fixture(scope="module")
def local(local_pipeline):
    return local_pipeline


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("mode", ["async", "sequential"])
@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_services_match_in_process_pipeline(stages, local, mode, index, schedule):
    request = make_request(PROMPTS[index], mode, codec_chunk_schedule=schedule)
    expected = asyncio.run(collect(local, make_request(PROMPTS[index], mode, codec_chunk_schedule=schedule)))
    sizes: list[int] = []
    rid = f"parity-{mode}-{index}-{schedule}"
    text, codes, audio, done = asyncio.run(collect_services(stages, request, rid, sizes))
    assert done.output_ids == expected.output_ids
    assert text == expected.text
    np.testing.assert_array_equal(codes, expected.codes)
    np.testing.assert_array_equal(audio, expected.audio)
    # Exact streaming: the services' audio is the one-shot decode of their own codes (float64
    # engines ship float32, so one float32 step is all rounding may leave).
    with torch.no_grad():
        full = local.code2wav.code2wav(torch.from_numpy(codes)[None]).reshape(-1).float().numpy()
    assert audio.shape == full.shape
    np.testing.assert_allclose(audio, full, rtol=0, atol=float(np.spacing(np.float32(1))))
    # The schedule travelled in both opens: the talker shipped and code2wav decoded by its windows.
    windows = request_plan(request).windows(codes.shape[1])
    assert sizes == [windows[0] * 1920 - 555] + [n * 1920 for n in windows[1:]]


def test_async_mode_first_audio_leaves_before_thinker_finishes(stages):
    request = make_request(
        PROMPTS[0], max_tokens=400, ignore_eos=True, max_audio_frames=12, initial_codec_chunk_frames=2
    )

    async def run():
        order = []
        async for event in run_request(stubs(stages), request, "order", ChunkPlan(2, 25, 25)):
            if isinstance(event, AudioEvent):
                order.append("audio")
            elif isinstance(event, TextEvent):
                order.append("text")
        return order

    order = asyncio.run(run())
    assert order.count("text") >= 2
    assert order.index("audio") < len(order) - 1 - order[::-1].index("text")


def test_cancel_mid_stream_frees_every_stage(stages):
    request = make_request(
        PROMPTS[0], max_tokens=300, ignore_eos=True, max_audio_frames=300, initial_codec_chunk_frames=2
    )

    async def run():
        events = run_request(stubs(stages), request, "cancel-me", ChunkPlan(2, 25, 25))
        async for event in events:
            if isinstance(event, AudioEvent):
                break
        await events.aclose()

        def all_idle() -> bool:
            return all(
                metric(s, "omnistream_stage_running_requests")
                + metric(s, "omnistream_stage_waiting_requests")
                == 0
                and metric(s, "omnistream_stage_open_streams") == 0
                for s in stages.values()
            )

        return await wait_for(all_idle, timeout=5.0)

    assert asyncio.run(run())


def test_bad_inputs_get_their_status_and_others_keep_going(stages, tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    prompt_ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    if not isinstance(prompt_ids, list):
        prompt_ids = prompt_ids["input_ids"]

    async def run():
        opts = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
        thinker = stage_pb2_grpc.ThinkerServiceStub(
            grpc.aio.insecure_channel(stages["thinker"].address, opts)
        )
        talker = stage_pb2_grpc.TalkerServiceStub(grpc.aio.insecure_channel(stages["talker"].address, opts))
        c2w = stage_pb2_grpc.Code2WavServiceStub(grpc.aio.insecure_channel(stages["code2wav"].address, opts))
        good = asyncio.ensure_future(
            collect_services(
                stages, make_request(PROMPTS[0], max_tokens=60, ignore_eos=True, max_audio_frames=60), "good"
            )
        )
        gw = ChunkKey("bad1", Stage.GATEWAY, 0).to_proto()
        bad_sampling = common_pb2.Sampling(temperature=1.0, top_p=2.0)
        ok_codes = np.zeros((16, 3), dtype=np.int64)
        cases = {
            "thinker input before open": (
                thinker.Stream,
                [stage_pb2.ThinkerRequest(key=gw)],
                grpc.StatusCode.INVALID_ARGUMENT,
                "open",
            ),
            "thinker top_p out of range": (
                thinker.Stream,
                [
                    stage_pb2.ThinkerRequest(
                        key=gw,
                        open=stage_pb2.ThinkerOpen(
                            request_id="bad1", prompt_text="hi", sampling=bad_sampling
                        ),
                    )
                ],
                grpc.StatusCode.INVALID_ARGUMENT,
                "top_p",
            ),
            "thinker bad request id": (
                thinker.Stream,
                [
                    stage_pb2.ThinkerRequest(
                        key=ChunkKey("x", Stage.GATEWAY, 0).to_proto(),
                        open=stage_pb2.ThinkerOpen(request_id="bad_id", prompt_text="hi"),
                    )
                ],
                grpc.StatusCode.INVALID_ARGUMENT,
                "request_id",
            ),
            "talker unknown speaker": (
                talker.Stream,
                [talker_open("bad2", speaker="nobody")],
                grpc.StatusCode.INVALID_ARGUMENT,
                "speaker",
            ),
            "talker chunk out of order": (
                talker.Stream,
                [
                    talker_open("bad3"),
                    talker_input("bad3", 2, prompt_ids=prompt_ids, token_ids=[5], last=True),
                ],
                grpc.StatusCode.INVALID_ARGUMENT,
                "bad3_thinker_2",
            ),
            "talker chunk repeated": (
                talker.Stream,
                [
                    talker_open("bad4"),
                    talker_input("bad4", 1, prompt_ids=prompt_ids, token_ids=[5]),
                    talker_input("bad4", 1, token_ids=[6], last=True),
                ],
                grpc.StatusCode.INVALID_ARGUMENT,
                "bad4_thinker_1",
            ),
            "talker open keyed as the gateway's": (
                talker.Stream,
                [
                    stage_pb2.TalkerRequest(
                        key=ChunkKey("bad9", Stage.GATEWAY, 0).to_proto(),
                        open=stage_pb2.TalkerOpen(request_id="bad9", max_frames=5),
                    )
                ],
                grpc.StatusCode.INVALID_ARGUMENT,
                "key",
            ),
            "code2wav open keyed as the thinker's": (
                c2w.Stream,
                [
                    stage_pb2.Code2WavRequest(
                        key=ChunkKey("bad10", Stage.THINKER, 0).to_proto(),
                        open=stage_pb2.Code2WavOpen(request_id="bad10"),
                    )
                ],
                grpc.StatusCode.INVALID_ARGUMENT,
                "key",
            ),
            "thinker open keyed as the talker's": (
                thinker.Stream,
                [
                    stage_pb2.ThinkerRequest(
                        key=ChunkKey("bad11", Stage.TALKER, 0).to_proto(),
                        open=stage_pb2.ThinkerOpen(request_id="bad11", prompt_text="hi"),
                    )
                ],
                grpc.StatusCode.INVALID_ARGUMENT,
                "key",
            ),
            "talker open keyed with a 10,000-character request id": (
                talker.Stream,
                [
                    stage_pb2.TalkerRequest(
                        key=common_pb2.ChunkKey(request_id="k" * 10_000, stage=common_pb2.STAGE_THINKER),
                        open=stage_pb2.TalkerOpen(request_id="bad14", max_frames=5),
                    )
                ],
                grpc.StatusCode.INVALID_ARGUMENT,
                "10000 characters",
            ),
            "talker input ends before its last chunk": (
                talker.Stream,
                [talker_open("bad12"), talker_input("bad12", 1, prompt_ids=prompt_ids, token_ids=[5])],
                grpc.StatusCode.INVALID_ARGUMENT,
                "last chunk",
            ),
            "code2wav input ends before its last chunk": (
                c2w.Stream,
                [c2w_open("bad13"), c2w_input("bad13", 1, ok_codes, last=False)],
                grpc.StatusCode.INVALID_ARGUMENT,
                "last chunk",
            ),
            "code2wav codes out of range": (
                c2w.Stream,
                [c2w_open("bad5"), c2w_input("bad5", 1, np.full((16, 3), 9999, dtype=np.int64))],
                grpc.StatusCode.INVALID_ARGUMENT,
                "codes",
            ),
            "code2wav malformed tensor": (
                c2w.Stream,
                [
                    c2w_open("bad6"),
                    c2w_input("bad6", 1, common_pb2.Tensor(dtype="int64", shape=[16, 3], data=b"xx")),
                ],
                grpc.StatusCode.INVALID_ARGUMENT,
                "codes",
            ),
            "code2wav frame gap": (
                c2w.Stream,
                [c2w_open("bad7"), c2w_input("bad7", 1, ok_codes, first_frame=7)],
                grpc.StatusCode.INVALID_ARGUMENT,
                "frame",
            ),
            "code2wav oversized message": (
                c2w.Stream,
                [c2w_open("bad8"), c2w_input("bad8", 1, np.zeros((16, 200_000), dtype=np.int64))],
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "",
            ),
        }
        results = {}
        for name, (call, messages, code, needle) in cases.items():
            results[name] = (await raw_stream(call, messages), code, needle)
        *_, done = await good
        return results, done

    results, done = asyncio.run(run())
    for name, ((code, details), expected, needle) in results.items():
        assert code == expected, f"{name}: {code} {details}"
        assert needle.lower() in details.lower(), f"{name}: {details!r} should mention {needle!r}"
    assert len(done.output_ids) == 60 and done.frames == 60
    for service in stages.values():
        assert service.proc.poll() is None


def test_sigterm_drains_in_flight_request_and_exits_zero(tiny_model_dir):
    services = start_services({"thinker": stage_args("thinker", tiny_model_dir, "--grace-seconds", "30")})
    service = services["thinker"]
    try:

        async def run():
            channel = grpc.aio.insecure_channel(service.address)
            stub = stage_pb2_grpc.ThinkerServiceStub(channel)
            call = stub.Stream()
            await call.write(
                stage_pb2.ThinkerRequest(
                    key=ChunkKey("drain", Stage.GATEWAY, 0).to_proto(),
                    open=stage_pb2.ThinkerOpen(
                        request_id="drain", prompt_text="hello", max_tokens=1000, ignore_eos=True
                    ),
                )
            )
            await call.done_writing()
            tokens = 0
            first = await call.read()
            tokens += len(first.token_ids)
            service.proc.send_signal(signal.SIGTERM)
            health = health_pb2_grpc.HealthStub(channel)
            status = await health.Check(health_pb2.HealthCheckRequest(service=""))
            # A new stream during the drain is refused: sent while the first one is still generating
            # (after it ends the server stops, and a stream then meets the shutdown, not the drain).
            code, _ = await raw_stream(
                stub.Stream,
                [
                    stage_pb2.ThinkerRequest(
                        key=ChunkKey("late", Stage.GATEWAY, 0).to_proto(),
                        open=stage_pb2.ThinkerOpen(request_id="late", prompt_text="hi", max_tokens=2),
                    )
                ],
            )
            while (chunk := await call.read()) is not grpc.aio.EOF:  # read() and async-for don't mix
                tokens += len(chunk.token_ids)
                last = chunk
            await channel.close()
            return tokens, last.finished, status.status, code

        tokens, finished, status, late_code = asyncio.run(run())
        assert tokens == 1000 and finished
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert late_code == grpc.StatusCode.UNAVAILABLE
        assert service.proc.wait(30) == 0
    finally:
        service.stop()


def test_a_cache_scope_is_found_by_its_own_requests_only_and_released_by_rpc(stages):
    """ThinkerOpen/TalkerOpen.cache_scope over the wire: a scope's second turn finds its first in
    both stages, another scope (and the shared one) finds nothing of it, and once ReleaseCache has
    dropped it, neither does its own; the codes never change. A bad scope is INVALID_ARGUMENT."""
    from omnistream.wire.convert import MAX_CACHE_SCOPE_BYTES

    messages = [{"role": "user", "content": "Scoped: tell me about the lighthouse and the keeper."}]
    hits = "omnistream_stage_prefix_cache_hit_tokens_total"

    def run(rid: str, scope: bytes):
        before = [metric(stages[s], hits) for s in ("thinker", "talker")]
        request = make_request(messages, max_tokens=6, max_audio_frames=8, cache_scope=scope)
        _, codes, _, done = asyncio.run(collect_services(stages, request, rid))
        after = [metric(stages[s], hits) for s in ("thinker", "talker")]
        return codes, done.cached_tokens, after[1] - before[1]

    first, cached, talker = run("scope-a-1", b"scope-a")
    assert cached == 0 and talker == 0
    for rid, scope in (("scope-b-1", b"scope-b"), ("shared-1", b"")):
        codes, cached, talker = run(rid, scope)
        assert (cached, talker) == (0, 0) and np.array_equal(codes, first)
    codes, cached, talker = run("scope-a-2", b"scope-a")
    assert cached > 0 and talker > 0 and np.array_equal(codes, first)

    async def release(scope: bytes):
        async with (
            grpc.aio.insecure_channel(stages["thinker"].address) as thinker,
            grpc.aio.insecure_channel(stages["talker"].address) as talker,
        ):
            for stub in (
                stage_pb2_grpc.ThinkerServiceStub(thinker),
                stage_pb2_grpc.TalkerServiceStub(talker),
            ):
                await stub.ReleaseCache(stage_pb2.ReleaseCacheRequest(cache_scope=scope), timeout=10)

    released = "omnistream_stage_prefix_cache_released_blocks_total"
    before = {s: metric(stages[s], released) for s in ("thinker", "talker")}
    asyncio.run(release(b"scope-a"))
    assert asyncio.run(wait_for(lambda: all(metric(stages[s], released) > n for s, n in before.items()), 10))
    codes, cached, talker = run("scope-a-3", b"scope-a")
    assert (cached, talker) == (0, 0) and np.array_equal(codes, first)
    for bad in (b"", b"x" * (MAX_CACHE_SCOPE_BYTES + 1)):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            asyncio.run(release(bad))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "cache_scope" in err.value.details()


def test_audio_sent_before_in_a_scope_goes_as_its_digest_with_the_same_answer(stages):
    """AudioPart.digest over the wire: a scope's later turn names the audio its first turn sent, and
    its tokens and codes are those of the same messages sent whole; a digest the scope does not
    hold (another scope's, or after ReleaseCache) is FAILED_PRECONDITION `media_expired`."""
    from omnistream.request.errors import OmniError
    from omnistream.request.media import AudioInput, audio_digest

    rng = np.random.default_rng(5)
    first, second = (AudioInput((0.1 * rng.standard_normal(16000)).astype(np.float32)) for _ in range(2))
    turn1 = [{"role": "user", "content": [{"type": "audio", "audio": first}]}]
    turn2 = [
        *turn1,
        {"role": "assistant", "content": "I heard you."},
        {"role": "user", "content": [{"type": "audio", "audio": second}]},
    ]
    hits = "omnistream_thinker_scope_audio_hits_total"
    kept = {audio_digest(first)}

    def refer(audio):
        digest = audio_digest(audio)
        return digest if digest in kept else None

    def run(rid, messages, scope, referrer=None):
        request = make_request(messages, max_tokens=6, max_audio_frames=8, cache_scope=scope)
        return asyncio.run(collect_services(stages, request, rid, refer_audio=referrer))

    run("digest-1", turn1, b"scope-audio")
    whole_text, whole_codes, _, whole = run("digest-whole", turn2, b"")
    before = metric(stages["thinker"], hits)
    text, codes, _, done = run("digest-2", turn2, b"scope-audio", refer)
    assert metric(stages["thinker"], hits) == before + 1
    assert done.output_ids == whole.output_ids and text == whole_text
    assert np.array_equal(codes, whole_codes)
    for rid, scope in (("digest-other", b"scope-other"), ("digest-shared", b"")):
        with pytest.raises(OmniError) as err:
            run(rid, turn2, scope, refer)
        expected = "media_expired" if scope else "invalid_request"
        assert err.value.kind == expected, err.value.message

    async def release():
        async with grpc.aio.insecure_channel(stages["thinker"].address) as channel:
            stub = stage_pb2_grpc.ThinkerServiceStub(channel)
            await stub.ReleaseCache(stage_pb2.ReleaseCacheRequest(cache_scope=b"scope-audio"), timeout=10)

    asyncio.run(release())
    with pytest.raises(OmniError) as err:
        run("digest-3", turn2, b"scope-audio", refer)
    assert err.value.kind == "media_expired" and "send its samples" in err.value.message
