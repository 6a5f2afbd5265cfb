"""`omnistream serve gateway`'s flags reach its config (flags over YAML) and bad values are refused."""

from __future__ import annotations

import argparse

import pytest
import yaml

from gateway.admission.audio_capacity import DEFAULT_START_JITTER_S
from gateway.config import GatewayConfig
from gateway.main import DERIVED_GRPC_STREAMS, config_from_args, grpc_streams
from gateway.main_args import add_arguments
from omnistream.service.settings import Setting, as_flags, settings_of


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--thinker", "127.0.0.1:1", *argv])


def test_the_start_jitter_allowance_comes_from_the_flag_then_the_yaml_then_the_default(tmp_path):
    assert config_from_args(_parse()).audio_start_jitter == DEFAULT_START_JITTER_S == 0.1
    assert config_from_args(_parse("--audio-start-jitter", "0")).audio_start_jitter == 0.0
    yaml = tmp_path / "gateway.yaml"
    yaml.write_text("thinker: ['127.0.0.1:1']\naudio_start_jitter: 0.25\n")
    assert config_from_args(_parse("--config", str(yaml))).audio_start_jitter == 0.25
    assert (
        config_from_args(_parse("--config", str(yaml), "--audio-start-jitter", "0.05")).audio_start_jitter
        == 0.05
    )
    for bad in (-0.1, 11.0):
        with pytest.raises(ValueError, match="audio_start_jitter"):
            GatewayConfig(thinker=["127.0.0.1:1"], audio_start_jitter=bad).validate()


def _other_value(row: Setting) -> object:
    """A value of the setting's type that is not its default."""
    if row.repeatable:
        return ["a:1", "b:2"]
    if row.kind is bool:
        return not row.default
    if row.kind is str:
        return "x.example"
    base = row.default if row.default is not None else 1
    return base + 1 if row.kind is int else base + 0.5


def test_every_setting_comes_from_its_flag_then_the_yaml_then_the_default(tmp_path):
    """One table: each GatewayConfig field is a flag and a YAML key, the flag over the YAML."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert vars(config_from_args(parser.parse_args([]))) == vars(GatewayConfig()) | {
        "api_key": config_from_args(parser.parse_args([])).api_key  # $OMNISTREAM_API_KEY, if set
    }
    rows = settings_of(GatewayConfig)
    assert len(rows) == len(GatewayConfig.__dataclass_fields__) > 50
    for row in rows:
        value = _other_value(row)
        from_flag = config_from_args(parser.parse_args(as_flags({row.name: value}, GatewayConfig)))
        assert getattr(from_flag, row.name) == value, row.flag
        path = tmp_path / f"{row.name}.yaml"
        path.write_text(yaml.safe_dump({row.name: value}))
        assert getattr(GatewayConfig.from_yaml(path), row.name) == value, row.name
        over = config_from_args(
            parser.parse_args(["--config", str(path), *as_flags({row.name: row.default}, GatewayConfig)])
        )
        if row.default not in (None, []):  # an unset value is no flag: the YAML's stays
            assert getattr(over, row.name) == row.default, row.flag


def test_the_flags_keep_their_names():
    """README, deploy/ and `omnistream up` use these: the generated flags are today's."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = {flag for action in parser._actions for flag in action.option_strings}
    assert {
        "--config", "--sequential", "--thinker", "--talker", "--code2wav", "--audio-hold", "--no-audio-hold",
        "--max-request-bytes", "--media-url-prefix", "--http-port", "--grpc-port", "--api-key",
        "--realtime-max-sessions", "--stage-tls-server-name", "--audio-start-jitter-per-stream",
    } <= flags  # fmt: skip
    args = parser.parse_args(["--thinker", "a:1", "--thinker", "b:1", "--media-url-prefix", "https://m/"])
    assert (args.thinker, args.media_url_prefixes) == (["a:1", "b:1"], ["https://m/"])
    assert config_from_args(parser.parse_args(["--sequential"])).async_chunk is False
    assert config_from_args(parser.parse_args(["--no-async-chunk"])).async_chunk is False


def test_an_unknown_or_mistyped_yaml_key_is_named(tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text("max_concurency: 4\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) max_concurency"):
        GatewayConfig.from_yaml(path)
    path.write_text("max_concurrency: lots\n")
    with pytest.raises(ValueError, match="max_concurrency takes int, got 'lots'"):
        GatewayConfig.from_yaml(path)
    path.write_text("stages: {thinker: [a:1], vocoder: [b:1]}\n")
    with pytest.raises(ValueError, match="stages takes a mapping of thinker, talker, code2wav"):
        GatewayConfig.from_yaml(path)


def test_the_grpc_port_holds_what_admission_may_run_and_queue():
    """Under caps, twice what runs and waits (16 and no queue: 32, as before); derived limits are
    unknown when the port is built, so its bound is far above them and admission refuses."""
    assert grpc_streams(GatewayConfig(max_concurrency=16, max_queue=0)) == 32
    assert grpc_streams(GatewayConfig(max_concurrency=16)) == 64  # the queue follows the cap
    assert grpc_streams(GatewayConfig()) == DERIVED_GRPC_STREAMS
