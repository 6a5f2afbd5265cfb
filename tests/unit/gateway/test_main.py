"""`omnistream serve gateway`'s flags reach its config (flags over YAML) and bad values are refused."""

from __future__ import annotations

import argparse

import pytest

from gateway.admission.audio_capacity import DEFAULT_START_JITTER_S
from gateway.config import GatewayConfig
from gateway.main import config_from_args
from gateway.main_args import add_arguments


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
