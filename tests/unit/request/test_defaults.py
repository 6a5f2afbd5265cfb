"""One table of request defaults, applied alike by REST, the gateway's gRPC API, `omnistream generate`
and the benchmark: equivalent inputs through each entry point's mapper give equal requests."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.api.grpc import to_generation_request as grpc_to_request
from gateway.api.openai.chat import ChatCompletionRequest
from gateway.api.openai.chat import to_generation_request as rest_to_request
from gateway.config import GatewayConfig
from omnistream.bench.clients import Workload, grpc_request, rest_body
from omnistream.cli.generate import request_from_args
from omnistream.cli.main import build_parser
from omnistream.proto.omni.v1 import common_pb2, gateway_pb2, stage_pb2
from omnistream.request.defaults import DEFAULTS, Defaults, RequestInput, ServingDefaults, resolve
from omnistream.request.errors import InvalidRequest
from omnistream.request.generation import GenerationRequest
from omnistream.request.sampling_params import SamplingParams

README = Path(__file__).resolve().parents[3] / "docs" / "serving.md"  # the defaults table's page
HI = [{"role": "user", "content": "hi"}]


# `voices` and `default_voice`: what the deployment's talkers reported in their Info (None: not yet).
def via_rest(
    body: dict[str, Any],
    config: GatewayConfig,
    voices: tuple[str, ...] | None = None,
    default_voice: str | None = None,
) -> GenerationRequest:
    parsed = ChatCompletionRequest.model_validate({"messages": HI, **body})
    deployment = SimpleNamespace(voices=voices, default_voice=default_voice)
    core = SimpleNamespace(config=config, deployment=deployment)
    return rest_to_request(parsed, core)[0]  # type: ignore[arg-type]


def via_grpc(
    config: GatewayConfig,
    voices: tuple[str, ...] | None = None,
    default_voice: str | None = None,
    **fields: Any,
) -> GenerationRequest:
    messages = fields.pop("messages", HI)
    request = gateway_pb2.GenerateRequest(messages=[common_pb2.Message(**m) for m in messages], **fields)
    return grpc_to_request(request, config, voices, default_voice)


def via_cli(
    flags: list[str],
    config: GatewayConfig,
    voices: tuple[str, ...] | None = None,
    default_voice: str | None = None,
) -> GenerationRequest:
    args = build_parser().parse_args(["generate", "--prompt", "hi", "--output-dir", "unused", *flags])
    return request_from_args(args, ServingDefaults.of(config, voices, default_voice))


def talker_defaults(seed: int | None = None) -> SamplingParams:
    d = DEFAULTS
    return SamplingParams(
        d.talker_temperature, d.talker_top_p, d.talker_top_k, d.talker_repetition_penalty, seed
    )


# (REST body, gRPC fields, CLI flags): the same request said three ways.
EQUIVALENT = {
    "nothing given": ({}, {}, []),
    "a seed only": (
        {"seed": 7},
        # A set `sampling` is read as sent, so the gRPC client states the temperature it wants.
        {"sampling": common_pb2.Sampling(temperature=1.0, top_p=1.0, seed=7)},
        ["--seed", "7"],
    ),
    "greedy": (
        {"temperature": 0, "talker_temperature": 0},
        {
            "sampling": common_pb2.Sampling(temperature=0),
            "talker_sampling": common_pb2.Sampling(temperature=0, top_k=50, repetition_penalty=1.05),
        },
        ["--temperature", "0", "--talker-temperature", "0"],
    ),
    "every knob": (
        {
            "messages": [{"role": "system", "content": "Be brief."}, *HI],
            "max_tokens": 12,
            "temperature": 0.7,
            "top_p": 0.9,
            "seed": 11,
            "audio": {"voice": "chelsie"},
            "max_audio_frames": 30,
            "talker_temperature": 0.6,
            "talker_top_k": 20,
            "talker_top_p": 0.8,
            "talker_repetition_penalty": 1.1,
            "talker_seed": 12,
            "initial_codec_chunk_frames": 3,
            "codec_chunk_schedule": "fixed",
            "async_chunk": False,
            "ignore_eos": True,
        },
        {
            "messages": [{"role": "system", "content": "Be brief."}, *HI],
            "max_tokens": 12,
            "sampling": common_pb2.Sampling(temperature=0.7, top_p=0.9, seed=11),
            "speaker": "chelsie",
            "max_audio_frames": 30,
            "talker_sampling": common_pb2.Sampling(
                temperature=0.6, top_k=20, top_p=0.8, repetition_penalty=1.1, seed=12
            ),
            "initial_codec_chunk_frames": 3,
            "codec_chunk_schedule": stage_pb2.CHUNK_SCHEDULE_FIXED,
            "async_chunk": False,
            "ignore_eos": True,
        },
        [
            "--system",
            "Be brief.",
            "--max-tokens",
            "12",
            "--temperature",
            "0.7",
            "--top-p",
            "0.9",
            "--seed",
            "11",
            "--speaker",
            "chelsie",
            "--max-audio-frames",
            "30",
            "--talker-temperature",
            "0.6",
            "--talker-top-k",
            "20",
            "--talker-top-p",
            "0.8",
            "--talker-repetition-penalty",
            "1.1",
            "--talker-seed",
            "12",
            "--initial-codec-chunk-frames",
            "3",
            "--codec-chunk-schedule",
            "fixed",
            "--mode",
            "sequential",
            "--ignore-eos",
        ],
    ),
    "text only": ({"modalities": ["text"]}, {"text_only": True}, ["--no-audio"]),
    "growing chunks, said explicitly": (
        {"codec_chunk_schedule": "grow"},
        {"codec_chunk_schedule": stage_pb2.CHUNK_SCHEDULE_GROWING},
        ["--codec-chunk-schedule", "grow"],
    ),
}


@pytest.mark.parametrize("case", EQUIVALENT)
def test_every_entry_point_resolves_equivalent_input_to_the_same_request(case: str) -> None:
    body, fields, flags = EQUIVALENT[case]
    config = GatewayConfig(default_max_tokens=100, max_audio_frames=500, async_chunk=True)
    rest = via_rest(body, config)
    assert via_grpc(config, **fields) == rest
    assert via_cli(flags, config) == rest


def test_nothing_given_gets_the_table() -> None:
    config = GatewayConfig(default_max_tokens=100, max_audio_frames=500, codec_chunk_frames=20)
    request = via_rest({}, config, default_voice="ethan")  # a Qwen3-Omni talker's Info
    assert request.messages == HI  # no system prompt is added
    assert request.sampling == SamplingParams(DEFAULTS.temperature, DEFAULTS.top_p, DEFAULTS.top_k)
    assert request.talker_sampling == talker_defaults()
    assert not request.sampling.greedy and not request.talker_sampling.greedy
    assert request.speaker == "ethan" and request.return_audio and not request.ignore_eos
    assert DEFAULTS.voice is None  # the table names no voice: the model's default is the talker's
    # The deployment's values, not the table's built-in ones.
    assert (request.max_tokens, request.max_audio_frames, request.codec_chunk_frames) == (100, 500, 20)
    assert request.initial_codec_chunk_frames is None and request.mode == "async"
    assert request.codec_chunk_schedule == DEFAULTS.codec_chunk_schedule == "grow"
    # gRPC's UNSPECIFIED is "not given" there (on the stage API it means an older gateway: fixed).
    assert via_grpc(config).codec_chunk_schedule == "grow"
    assert via_rest({}, GatewayConfig(async_chunk=False)).mode == "sequential"


def test_the_in_process_deployment_is_the_table() -> None:
    request = resolve(RequestInput(messages=HI))
    gateway = via_rest({}, GatewayConfig())  # the gateway's defaults are the same table
    assert request == gateway
    assert (request.max_tokens, request.max_audio_frames) == (DEFAULTS.max_tokens, DEFAULTS.max_audio_frames)


def test_the_request_seed_seeds_the_talker_unless_it_has_its_own() -> None:
    assert resolve(RequestInput(messages=HI, seed=3)).talker_sampling == talker_defaults(3)
    assert resolve(RequestInput(messages=HI, seed=3, talker_seed=4)).talker_sampling.seed == 4
    # gRPC: a set talker_sampling without a seed takes the request's too.
    got = via_grpc(
        GatewayConfig(),
        sampling=common_pb2.Sampling(temperature=1.0, seed=3),
        talker_sampling=common_pb2.Sampling(temperature=0.5),
    )
    assert got.talker_sampling.seed == 3


def test_grpc_float32_knobs_arrive_as_the_decimals_sent() -> None:
    got = via_grpc(
        GatewayConfig(), talker_sampling=common_pb2.Sampling(temperature=0.9, repetition_penalty=1.05)
    )
    assert (got.talker_sampling.temperature, got.talker_sampling.repetition_penalty) == (0.9, 1.05)


def test_a_system_prompt_is_added_only_when_given() -> None:
    assert resolve(RequestInput(messages=HI)).messages == HI
    with_system = resolve(RequestInput(messages=HI, system="Be brief."))
    assert with_system.messages == [{"role": "system", "content": "Be brief."}, *HI]
    table = Defaults(system_prompt="You are a helpful assistant.")
    assert resolve(RequestInput(messages=HI), defaults=table).messages[0]["content"] == table.system_prompt
    own = [{"role": "system", "content": "Mine."}, *HI]
    assert resolve(RequestInput(messages=own), defaults=table).messages == own


def test_an_empty_system_prompt_means_no_system_message() -> None:
    # `generate --system ""`: no system turn at all (an empty one still costs its framing tokens),
    # and it also overrides a table's default prompt.
    assert resolve(RequestInput(messages=HI, system="")).messages == HI
    table = Defaults(system_prompt="You are a helpful assistant.")
    assert resolve(RequestInput(messages=HI, system=""), defaults=table).messages == HI
    # With prompt_ids there is nothing to add it to, and nothing to refuse either.
    assert resolve(RequestInput(prompt_ids=[1, 2], system="")).messages is None
    with pytest.raises(InvalidRequest):
        resolve(RequestInput(prompt_ids=[1, 2], system="Be brief."))


@pytest.mark.parametrize(
    ("voices", "default_voice", "expected"),
    [
        ((), "ethan", "ethan"),
        (("chelsie", "Ethan"), "ethan", "ethan"),
        (("zoe", "max"), "zoe", "zoe"),
        ((), None, ""),  # not known: the speaker is left empty, and the talker speaks its default
        (("zoe", "max"), None, ""),
    ],
)
def test_the_default_voice_is_the_one_the_talker_reports(
    voices: tuple[str, ...], default_voice: str | None, expected: str
) -> None:
    deployment = ServingDefaults(voices=voices, voice=default_voice)
    assert resolve(RequestInput(messages=HI), deployment).speaker == expected
    # The gateway's voices and default are the talkers' (their Info); the CLI's its checkpoint's.
    config, known = GatewayConfig(), voices or None
    assert via_rest({}, config, known, default_voice).speaker == expected
    assert via_grpc(config, known, default_voice).speaker == expected
    assert via_cli([], config, known, default_voice).speaker == expected


def test_a_configured_voice_wins_where_the_deployment_has_it() -> None:
    table, given = Defaults(voice="chelsie"), RequestInput(messages=HI)
    has_it = ServingDefaults(voices=("chelsie", "ethan"), voice="ethan")
    lacks_it = ServingDefaults(voices=("aiden", "ethan"), voice="ethan")
    assert resolve(given, has_it, table).speaker == "chelsie"
    assert resolve(given, lacks_it, table).speaker == "ethan"  # the model's default instead
    assert resolve(given, ServingDefaults(), table).speaker == "chelsie"  # voices not known: as configured


def test_the_cli_takes_the_checkpoints_voices_and_default(tmp_path: Path) -> None:
    from omnistream.cli.generate import checkpoint_serving

    assert checkpoint_serving(tmp_path) == ServingDefaults()  # no config.json: neither known
    config = {"model_type": "qwen3_omni_moe", "talker_config": {"speaker_id": {"Chelsie": 1, "Ethan": 2}}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert checkpoint_serving(tmp_path) == ServingDefaults(voices=("chelsie", "ethan"), voice="ethan")


@pytest.mark.parametrize(
    ("given", "field"),
    [
        (RequestInput(), "messages"),
        (RequestInput(messages=HI, prompt_ids=[1]), "messages"),
        (RequestInput(messages=[{"role": "robot", "content": "x"}]), "messages"),
        (RequestInput(prompt_ids=[1], system="x"), "system"),
        (RequestInput(messages=HI, temperature=-1), "temperature"),
        (RequestInput(messages=HI, top_p=0), "top_p"),
        (RequestInput(messages=HI, talker_top_p=2), "talker_top_p"),
        (RequestInput(messages=HI, talker_repetition_penalty=0), "talker_repetition_penalty"),
        (RequestInput(messages=HI, seed=-1), "seed"),
        (RequestInput(messages=HI, talker_seed=2**63), "talker_seed"),
        (RequestInput(messages=HI, max_tokens=0), "max_tokens"),
        (RequestInput(messages=HI, max_audio_frames=0), "max_audio_frames"),
        (RequestInput(messages=HI, codec_chunk_schedule="doubling"), "codec_chunk_schedule"),
    ],
)
def test_invalid_input_names_its_field(given: RequestInput, field: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        resolve(given)
    assert info.value.field == field


def test_the_cli_passes_nothing_it_was_not_given() -> None:
    args = build_parser().parse_args(["generate", "--prompt", "hi", "--output-dir", "x"])
    request_flags = {
        "system", "mode", "max_tokens", "max_audio_frames", "temperature", "top_p", "top_k",
        "repetition_penalty", "seed", "talker_temperature", "talker_top_k", "talker_top_p",
        "talker_repetition_penalty", "talker_seed", "speaker", "ignore_eos", "no_audio",
        "initial_codec_chunk_frames", "codec_chunk_schedule",
    }  # fmt: skip
    assert {name: getattr(args, name) for name in request_flags} == dict.fromkeys(request_flags)


def test_the_benchmark_sends_its_workload_alike_to_every_target() -> None:
    workload = Workload(
        output_len=12,
        audio_frames=30,
        ignore_eos=True,
        initial_codec_chunk_frames=2,
        codec_chunk_schedule="fixed",
    )
    config = GatewayConfig()
    given = workload.request_input([5, 6, 7], async_chunk=False)
    in_process = resolve(given, ServingDefaults.of(config))
    assert in_process.sampling.greedy and in_process.talker_sampling.greedy  # on purpose: same work
    assert in_process.codec_chunk_schedule == "fixed"
    assert grpc_to_request(grpc_request(given), config) == in_process
    as_text = dataclasses.replace(given, prompt_ids=None, messages=HI)
    assert via_rest(rest_body(as_text), config) == resolve(as_text, ServingDefaults.of(config))


def test_readme_has_the_table() -> None:
    """The docs' one table of defaults (docs/serving.md) states the values this module applies."""
    text = README.read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", text, flags=re.MULTILINE)
    stated = {knob: cell.strip() for knob, cell in rows if knob in Defaults.__dataclass_fields__}
    expected = {}
    for knob in Defaults.__dataclass_fields__:
        value = getattr(DEFAULTS, knob)
        expected[knob] = "none" if value is None else str(value).lower()
    assert {k: v.split()[0].strip("`") for k, v in stated.items()} == expected


def test_a_cache_salt_becomes_a_scope_of_its_own_and_none_is_the_shared_one():
    from omnistream.request.defaults import RequestInput, ServingDefaults, cache_scope_of_salt, resolve
    from omnistream.request.errors import InvalidRequest

    def scope(salt):
        return resolve(
            RequestInput(messages=[{"role": "user", "content": "hi"}], cache_salt=salt), ServingDefaults()
        ).cache_scope

    assert scope(None) == b""
    assert scope("tenant-a") == scope("tenant-a") == cache_scope_of_salt("tenant-a")
    assert len(scope("tenant-a")) == 16 and scope("tenant-a") != scope("tenant-b")
    with pytest.raises(InvalidRequest) as err:
        scope("")
    assert err.value.field == "cache_salt"
