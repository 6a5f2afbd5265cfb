"""The runs' order, the checkpoints and workloads parsed, the flags' defaults
(omnistream/bench/conversation/runs.py). The measure itself starts stacks:
tests/integration/test_bench_conversation.py runs it end to end."""

from __future__ import annotations

import argparse

import pytest

from omnistream.bench.args import add_arguments
from omnistream.bench.conversation.runs import plan, resolve_models, workloads_of


def test_the_cache_settings_run_a_b_b_a():
    assert plan(2) == ["on", "off", "off", "on"]
    assert plan(1) == ["on", "off"]
    assert plan(4) == ["on", "off", "off", "on", "on", "off", "off", "on"]


def test_models_and_workloads_are_parsed():
    assert resolve_models("tiny,real-shaped", "x") == [
        ("tiny", ".cache/tiny-model"),
        ("real-shaped", ".cache/real-shaped-model"),
    ]
    assert resolve_models("", ".cache/tiny-model") == [("tiny", ".cache/tiny-model")]
    assert resolve_models("/ckpt/qwen-omni", "x") == [("qwen-omni", "/ckpt/qwen-omni")]
    with pytest.raises(ValueError, match="twice"):
        resolve_models("tiny,tiny", "x")
    assert workloads_of("rest, realtime") == ["rest", "realtime"]
    for bad in ("", "rest,chat"):
        with pytest.raises(ValueError):
            workloads_of(bad)


def test_the_flags_default_to_the_issues_workload():
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--conversation"])
    assert args.conversation and args.conversation_turns == 20 and args.conversation_concurrency == 10
    assert args.conversation_workloads == "realtime,rest,concurrent" and args.repeats == 2
    assert args.conversation_turn_seconds == 0.0  # the speech alone, as the issue measured
    assert not p.parse_args([]).conversation
