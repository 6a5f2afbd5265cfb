"""Media prompts through the stage services (gRPC, real processes) against the transformers
reference: the gateway's wiring sends decoded media in ThinkerOpen and forwards the thinker's deep
rows and media layout to the talker."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from omnistream.proto.omni.v1 import common_pb2, stage_pb2, stage_pb2_grpc
from omnistream.request.media import AudioInput
from omnistream.wire.chunk_key import ChunkKey, Stage
from omnistream.wire.messages import message_proto
from omnistream.wire.tensors import to_proto
from tests.media_reference import MAX_FRAMES, MAX_TOKENS
from tests.media_samples import conversations

from .stage_calls import collect_services, make_request, raw_stream

CASES = conversations()


@pytest.fixture(scope="module")
def expected(media_expected):
    return media_expected


def _request(messages, use_audio_in_video=False):
    return make_request(
        messages, max_tokens=MAX_TOKENS, max_audio_frames=MAX_FRAMES, use_audio_in_video=use_audio_in_video
    )


def test_media_prompts_match_reference_alone_and_batched(stages, expected):
    names = list(CASES)
    solo = {
        n: asyncio.run(collect_services(stages, _request(*CASES[n]), f"media-{n.replace('_', '-')}"))
        for n in names
    }

    async def run_all():
        runs = [
            collect_services(stages, _request(*CASES[n]), f"media-batch-{n.replace('_', '-')}") for n in names
        ]
        text = [{"role": "user", "content": "Tell me a story about the sea."}]
        runs += [collect_services(stages, _request(text), f"media-batch-text-{i}") for i in range(2)]
        return await asyncio.gather(*runs)

    batched = dict(zip(names, asyncio.run(run_all()), strict=False))
    for runs in (solo, batched):
        for name, (_, codes, audio, done) in runs.items():
            prompt_ids, tokens, ref_codes = expected[name]
            assert done.prompt_ids == prompt_ids, name
            assert done.output_ids == tokens, name
            assert codes.shape[0] == 16 and audio.size > 0
            np.testing.assert_array_equal(codes, ref_codes, err_msg=name)


def test_bad_media_is_invalid_argument_naming_it(stages):
    """Checked at the thinker's door (before any batch), with the offending part named."""
    cases = {
        "sample_rate": AudioInput(np.zeros(1600, np.float32), 8000),
        "float32": AudioInput(np.zeros(1600, np.float64)),
    }

    async def run():
        async with grpc.aio.insecure_channel(stages["thinker"].address) as channel:
            stub = stage_pb2_grpc.ThinkerServiceStub(channel)
            outcomes = {}
            for needle, audio in cases.items():
                rid = f"bad-media-{needle.replace('_', '-')}"
                messages = [{"role": "user", "content": [{"type": "audio", "audio": audio}]}]
                open_ = stage_pb2.ThinkerOpen(request_id=rid, max_tokens=4)
                if audio.samples.dtype == np.float32:
                    open_.messages.append(message_proto(messages[0]))
                else:  # the request model would not build this one: write the part by hand
                    part = common_pb2.AudioPart(samples=to_proto(audio.samples), sample_rate=16000)
                    open_.messages.append(
                        common_pb2.Message(role="user", parts=[common_pb2.ContentPart(audio=part)])
                    )
                first = stage_pb2.ThinkerRequest(key=ChunkKey(rid, Stage.GATEWAY, 0).to_proto(), open=open_)
                outcomes[needle] = await raw_stream(stub.Stream, [first])
            return outcomes

    for needle, (code, details) in asyncio.run(run()).items():
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (needle, code, details)
        assert needle in details and "messages[0]" in details, details
