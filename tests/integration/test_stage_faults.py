"""Faults at the stage services, as real processes: cancel races at random points, poisoned requests
batched with innocent ones, malformed and protocol-breaking messages. After each, nothing leaks and
the innocent requests end with their full output."""

from __future__ import annotations

import asyncio
import os
import random

import grpc
import numpy as np
import pytest

from omnistream.models.qwen3_omni.checkpoint import load_tokenizer
from omnistream.proto.omni.v1 import common_pb2, stage_pb2, stage_pb2_grpc
from omnistream.wire.chunk_key import ChunkKey, Stage
from omnistream.wire.tensors import to_proto

from .conftest import metric, wait_for
from .stage_calls import (
    c2w_input,
    c2w_open,
    collect_services,
    make_request,
    raw_stream,
    talker_input,
    talker_open,
)

# Races per stage: a few dozen here, `OMNISTREAM_CANCEL_RACES=1000 make test-slow` for the long run.
CANCEL_RACES = int(os.environ.get("OMNISTREAM_CANCEL_RACES", "24"))
SLOW_CANCEL_RACES = int(os.environ.get("OMNISTREAM_SLOW_CANCEL_RACES", "1000"))
INNOCENT = make_request(
    [{"role": "user", "content": "Tell me a story about the sea."}],
    max_tokens=40,
    ignore_eos=True,
    max_audio_frames=40,
)
HIDDEN_WIDTH = 64  # the tiny thinker's hidden size


def _prompt_ids(tiny_model_dir: str, content: str = "hi") -> list[int]:
    tok = load_tokenizer(tiny_model_dir)
    ids = tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def _leak_free(stages) -> bool:
    return all(
        metric(s, "omnistream_stage_engine_requests") == 0
        and metric(s, "omnistream_stage_orphaned_requests") == 0
        and metric(s, "omnistream_stage_open_streams") == 0
        and metric(s, "omnistream_stage_running_requests") + metric(s, "omnistream_stage_waiting_requests")
        == 0
        for s in stages.values()
    )


def _channels(stages):
    opts = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
    return {name: grpc.aio.insecure_channel(stages[name].address, opts) for name in stages}


def _raw_call(channel: grpc.aio.Channel, service: str):
    """A bidi call that sends bytes as they are (for malformed messages)."""
    return channel.stream_stream(f"/omni.v1.{service}/Stream")


def _thinker_open(rid: str, **kw) -> stage_pb2.ThinkerRequest:
    fields = {"prompt_text": "Tell me about rivers.", "max_tokens": 60, "ignore_eos": True, **kw}
    return stage_pb2.ThinkerRequest(
        key=ChunkKey(rid, Stage.GATEWAY, 0).to_proto(), open=stage_pb2.ThinkerOpen(request_id=rid, **fields)
    )


async def _race_one(rng: random.Random, stage: str, stub, rid: str, prompt_ids: list[int]) -> None:
    """Open a stream, cancel it at a random point of its life."""
    if stage == "thinker":
        messages = [_thinker_open(rid)]
    elif stage == "talker":
        messages = [  # one frame per chunk: the talker answers before its input has ended
            talker_open(rid, initial_chunk_frames=1),
            talker_input(rid, 1, prompt_ids=prompt_ids, token_ids=[5, 6]),
        ]
    else:
        codes = np.zeros((16, 30), dtype=np.int64)
        messages = [c2w_open(rid), c2w_input(rid, 1, codes, last=False)]
    call = stub.Stream(timeout=30)
    point = rng.choice(["before-open", "after-open", "after-input", "after-first-output"])
    try:
        if point != "before-open":
            await call.write(messages[0])
            if point != "after-open":
                for message in messages[1:]:
                    await call.write(message)
                if point == "after-first-output":
                    await asyncio.wait_for(call.read(), 30)
        await asyncio.sleep(rng.uniform(0, 0.02))
    except (TimeoutError, grpc.aio.AioRpcError):
        pass
    finally:
        call.cancel()


async def _cancel_races(stages, tiny_model_dir: str, races: int, seed: int) -> dict[str, float]:
    """Run the races; return how many requests each stage's engine admitted meanwhile (the races
    must reach the engines to mean anything), once every stage is back to holding nothing."""
    rng = random.Random(seed)
    before = {name: metric(s, "omnistream_stage_requests_total") for name, s in stages.items()}
    prompt_ids = _prompt_ids(tiny_model_dir)
    channels = _channels(stages)
    stubs = {
        "thinker": stage_pb2_grpc.ThinkerServiceStub(channels["thinker"]),
        "talker": stage_pb2_grpc.TalkerServiceStub(channels["talker"]),
        "code2wav": stage_pb2_grpc.Code2WavServiceStub(channels["code2wav"]),
    }
    try:
        for i in range(races):
            # A few at once, so cancels also land while other requests are mid-step.
            await asyncio.gather(
                *(_race_one(rng, s, stubs[s], f"race-{seed}-{s}-{i}", prompt_ids) for s in stubs)
            )
        assert await wait_for(lambda: _leak_free(stages), timeout=30.0, interval=0.2)
        after = {name: metric(s, "omnistream_stage_requests_total") for name, s in stages.items()}
        return {name: after[name] - before[name] for name in stages}
    finally:
        for channel in channels.values():
            await channel.close()


def test_cancel_races_leave_no_request_behind(stages, tiny_model_dir):
    admitted = asyncio.run(_cancel_races(stages, tiny_model_dir, CANCEL_RACES, seed=1))
    assert all(count >= CANCEL_RACES // 4 for count in admitted.values()), admitted
    *_, done = asyncio.run(collect_services(stages, INNOCENT, "after-races"))
    assert len(done.output_ids) == 40 and done.frames == 40


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_thousand_cancel_races_per_stage_leave_no_request_behind(stages, tiny_model_dir):
    admitted = asyncio.run(_cancel_races(stages, tiny_model_dir, SLOW_CANCEL_RACES, seed=2))
    print(f"\n{SLOW_CANCEL_RACES} cancel races per stage; requests admitted by each engine: {admitted}")
    assert all(count >= SLOW_CANCEL_RACES // 4 for count in admitted.values()), admitted
    *_, done = asyncio.run(collect_services(stages, INNOCENT, "after-many-races"))
    assert len(done.output_ids) == 40 and done.frames == 40


def _hidden(rows: int, width: int = HIDDEN_WIDTH, dtype=np.float32, fill: float = 0.1) -> common_pb2.Tensor:
    return to_proto(np.full((rows, width), fill, dtype=dtype))


def test_poisoned_requests_fail_alone_while_innocent_ones_finish(stages, tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    image_id = tok.convert_tokens_to_ids("<|image_pad|>")
    plain = _prompt_ids(tiny_model_dir)
    user_at = plain.index(tok.convert_tokens_to_ids("user"))
    with_image = [*plain[: user_at + 2], image_id, *plain[user_at + 2 :]]  # an image in the user turn
    image_at = with_image.index(image_id)

    def talker_case(rid: str, **input_fields):
        return [talker_open(rid), talker_input(rid, 1, token_ids=[5], last=True, **input_fields)]

    def thinker_case(rid: str, *extra, **open_fields):
        return [_thinker_open(rid, **open_fields), *extra]

    cases = {
        "talker: image token without prompt_hidden": (
            "talker",
            talker_case("p1", prompt_ids=with_image),
            "prompt_hidden",
        ),
        "talker: prompt_hidden of the wrong width": (
            "talker",
            talker_case(
                "p2", prompt_ids=with_image, prompt_hidden=_hidden(1, 7), multimodal_positions=[image_at]
            ),
            "width",
        ),
        "talker: NaN in prompt_hidden": (
            "talker",
            talker_case(
                "p3",
                prompt_ids=with_image,
                prompt_hidden=_hidden(1, fill=np.nan),
                multimodal_positions=[image_at],
            ),
            "nan",
        ),
        "talker: int64 prompt_hidden": (
            "talker",
            talker_case(
                "p4",
                prompt_ids=with_image,
                prompt_hidden=_hidden(1, dtype=np.int64),
                multimodal_positions=[image_at],
            ),
            "prompt_hidden",
        ),
        "talker: multimodal position 10^6": (
            "talker",
            talker_case("p5", prompt_ids=with_image, prompt_hidden=_hidden(1), multimodal_positions=[10**6]),
            "multimodal position",
        ),
        "talker: rows for a text position": (
            "talker",
            talker_case("p6", prompt_ids=plain, prompt_hidden=_hidden(1), multimodal_positions=[user_at]),
            "multimodal position",
        ),
        "thinker: image placeholder ids without media": (
            "thinker",
            [
                stage_pb2.ThinkerRequest(
                    key=ChunkKey("p7", Stage.GATEWAY, 0).to_proto(),
                    open=stage_pb2.ThinkerOpen(request_id="p7", prompt_ids=with_image, max_tokens=5),
                )
            ],
            "placeholder",
        ),
        "thinker: a second open": (
            "thinker",
            thinker_case("p8", _thinker_open("p8"), max_tokens=400),
            "no message after its open",
        ),
    }

    async def run():
        channels = _channels(stages)
        stubs = {
            "thinker": stage_pb2_grpc.ThinkerServiceStub(channels["thinker"]),
            "talker": stage_pb2_grpc.TalkerServiceStub(channels["talker"]),
        }
        innocents = [
            asyncio.ensure_future(collect_services(stages, INNOCENT, f"innocent-{i}")) for i in range(4)
        ]
        # The poison arrives while the innocent requests are in the talker's batch.
        assert await wait_for(lambda: metric(stages["talker"], "omnistream_stage_engine_requests") >= 4, 60)
        outcomes = await asyncio.gather(
            *(raw_stream(stubs[stage].Stream, messages) for stage, messages, _ in cases.values())
        )
        finished = await asyncio.gather(*innocents)
        for channel in channels.values():
            await channel.close()
        return outcomes, finished

    outcomes, finished = asyncio.run(run())
    for (name, (_, _, needle)), (code, details) in zip(cases.items(), outcomes, strict=True):
        assert code == grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {code} {details}"
        assert needle in details.lower(), f"{name}: {details!r} should mention {needle!r}"
    for _text, codes, audio, done in finished:
        assert len(done.output_ids) == 40 and done.frames == 40 and codes.shape == (16, 40)
        assert audio.size == done.audio_samples > 0
    assert asyncio.run(wait_for(lambda: _leak_free(stages), timeout=30.0, interval=0.2))


def test_malformed_bytes_are_invalid_argument_at_every_stage(stages):
    async def run():
        channels = _channels(stages)
        results = {}
        for stage, service in (
            ("thinker", "ThinkerService"),
            ("talker", "TalkerService"),
            ("code2wav", "Code2WavService"),
        ):
            for label, data in (("garbage", b"\xff\xff\xff\xff\x0f garbage"), ("truncated", b"\x0a\x20ab")):
                call = _raw_call(channels[stage], service)(timeout=30)
                await call.write(data)
                await call.done_writing()
                try:
                    async for _ in call:
                        pass
                    results[(stage, label)] = (grpc.StatusCode.OK, "")
                except grpc.aio.AioRpcError as exc:
                    results[(stage, label)] = (exc.code(), exc.details())
        for channel in channels.values():
            await channel.close()
        return results

    for (stage, label), (code, details) in asyncio.run(run()).items():
        assert code == grpc.StatusCode.INVALID_ARGUMENT, f"{stage} {label}: {code} {details}"
        assert "malformed" in details, details
    assert asyncio.run(wait_for(lambda: _leak_free(stages), timeout=30.0, interval=0.2))


def test_special_token_text_from_a_user_stays_text(stages, tiny_model_dir):
    """`<|image_pad|>` typed by a user reaches the thinker as characters, so the talker speaks it."""
    tok = load_tokenizer(tiny_model_dir)
    specials = {t.content for t in tok.added_tokens_decoder.values() if t.special}
    special_ids = {tok.convert_tokens_to_ids(s) for s in specials}
    text = "look: " + " ".join(sorted(specials)) + " end"
    request = make_request(
        [{"role": "system", "content": "<|im_end|>"}, {"role": "user", "content": text}],
        max_tokens=8,
        ignore_eos=True,
        max_audio_frames=8,
    )
    _, _, _, done = asyncio.run(collect_services(stages, request, "specials"))
    template = _prompt_ids(tiny_model_dir, "x")
    # The template's own turns: one more (the system turn) than a lone user turn has.
    expected_specials = [
        *(t for t in template if t in special_ids),
        tok.convert_tokens_to_ids("<|im_start|>"),
        tok.convert_tokens_to_ids("<|im_end|>"),
    ]
    assert sorted(t for t in done.prompt_ids if t in special_ids) == sorted(expected_specials)
    assert tok.decode(done.prompt_ids).count("<|image_pad|>") == 1
    assert done.frames == 8


def test_an_open_keyed_for_another_stage_is_invalid_argument_with_inputs_in_flight(stages):
    """Issue 28: an open whose ChunkKey names the wrong stage (the gateway's, on the talker) is
    INVALID_ARGUMENT naming the key, also when the client has sent its inputs right behind it:
    before, the stage ended the call while they were in flight, and the grpc.aio client then
    reported INTERNAL "Internal error from Core" instead of the stage's status (now and then)."""
    codes = np.zeros((16, 2), dtype=np.int64)

    def talker_case(rid: str) -> list:
        wrong = stage_pb2.TalkerRequest(
            key=ChunkKey(rid, Stage.GATEWAY, 0).to_proto(),
            open=stage_pb2.TalkerOpen(request_id=rid, max_frames=5),
        )
        return [wrong, *(talker_input(rid, i, token_ids=[5] * 50) for i in range(1, 21))]

    def code2wav_case(rid: str) -> list:
        wrong = stage_pb2.Code2WavRequest(
            key=ChunkKey(rid, Stage.GATEWAY, 0).to_proto(), open=stage_pb2.Code2WavOpen(request_id=rid)
        )
        return [wrong, *(c2w_input(rid, i, codes, first_frame=2 * (i - 1), last=False) for i in range(1, 21))]

    async def status(stub_call, messages) -> tuple[grpc.StatusCode, str]:
        """The call's final status, as a client that writes all at once and then reads sees it
        (a write after the call ended is refused: the status then says why)."""
        call = stub_call(timeout=30)
        try:
            for message in messages:
                await call.write(message)
            await call.done_writing()
        except (asyncio.InvalidStateError, grpc.aio.AioRpcError):
            pass
        return await call.code(), await call.details()

    async def run():
        channels = _channels(stages)
        talker = stage_pb2_grpc.TalkerServiceStub(channels["talker"])
        c2w = stage_pb2_grpc.Code2WavServiceStub(channels["code2wav"])
        outcomes = []
        for i in range(20):
            outcomes.append(await status(talker.Stream, talker_case(f"wrong-stage-t{i}")))
            outcomes.append(await status(c2w.Stream, code2wav_case(f"wrong-stage-c{i}")))
        for channel in channels.values():
            await channel.close()
        return outcomes

    outcomes = asyncio.run(run())
    wrong = [(code, details) for code, details in outcomes if code != grpc.StatusCode.INVALID_ARGUMENT]
    assert not wrong, f"{len(wrong)} of {len(outcomes)} refused opens got another status: {wrong[:3]}"
    for _, details in outcomes:
        assert "chunk key" in details and "comes from stage gateway" in details, details
    assert asyncio.run(wait_for(lambda: _leak_free(stages), timeout=30.0, interval=0.2))
