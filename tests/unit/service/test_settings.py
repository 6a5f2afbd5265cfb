"""The settings table (omnistream/service/settings.py): a config dataclass's fields become flags of
their type, with help ending in the real default, and YAML is read through the same table."""

from __future__ import annotations

import argparse
import enum
from dataclasses import dataclass
from typing import Literal

import pytest

from omnistream.service.settings import (
    add_flags,
    as_flags,
    from_mapping,
    given,
    load_yaml,
    setting,
    settings_of,
    show,
)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class Example:
    hold: bool = setting(True, help="hold requests")
    replicas: list[str] = setting(list, flag="replica", help="an address")
    queue: int | None = setting(None, shown="--max-concurrency", help="held at most")
    timeout: float = setting(10.0, help="seconds; 100% of them")
    body_bytes: int = setting(8 * 1024 * 1024, help="body limit")
    name: str = setting("qwen3-omni", help="model name")
    path: str | None = setting(None, help="a file")
    backend: Literal["a", "b"] = setting("a", help="engine")
    color: Color = setting(Color.RED, help="a color")


def _parser(**kw) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_flags(parser, Example, **kw)
    return parser


def test_each_type_becomes_its_flag_and_absent_flags_parse_to_not_given():
    parser = _parser()
    args = parser.parse_args([])
    assert given(args, Example) == {}  # nothing given: the YAML's values (or the defaults) stay
    argv = "--no-hold --replica a:1 --replica b:2 --queue 0 --timeout 2 --body-bytes 5 --name x"
    args = parser.parse_args([*argv.split(), "--path", "p.pem", "--backend", "b", "--color", "blue"])
    assert given(args, Example) == {
        "hold": False,
        "replicas": ["a:1", "b:2"],
        "queue": 0,  # a given 0 is given, not absent
        "timeout": 2.0,
        "body_bytes": 5,
        "name": "x",
        "path": "p.pem",
        "backend": "b",
        "color": Color.BLUE,
    }
    assert parser.parse_args(["--hold"]).hold is True
    for bad in (["--backend", "c"], ["--color", "green"], ["--queue", "x"], ["--timeout", "soon"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


def test_the_help_ends_in_the_real_default_written_nowhere_else():
    text = _parser().format_help()
    for line in (
        "hold requests (default: on)",
        "an address (repeatable; default: none)",
        "held at most (default: --max-concurrency)",
        "seconds; 100% of them (default: 10.0)",  # a % in a help text is no format directive
        "body limit (default: 8388608 (8 MiB))",
        "model name (default: qwen3-omni)",
        "engine (default: a)",
        "a color (default: red)",
    ):
        assert line in " ".join(text.split()), line
    assert "a file (default" not in text  # an unset path has no default to tell
    assert show(False) == "off" and show([]) == "none" and show(None) is None and show(3) == "3"


def test_a_command_that_reads_its_namespace_gets_the_defaults_and_may_set_its_own():
    args = _parser(only_given=False, defaults={"timeout": 30.0}).parse_args([])
    assert (args.hold, args.queue, args.timeout, args.name, args.color) == (
        True,
        None,
        30.0,
        "qwen3-omni",
        Color.RED,
    )
    assert "(default: 30.0)" in _parser(only_given=False, defaults={"timeout": 30.0}).format_help()
    assert vars(_parser(names=("name", "hold")).parse_args([])) == {"name": None, "hold": None}


def test_a_setting_may_default_to_an_environment_variable_and_be_required_without_it(monkeypatch):
    @dataclass
    class Serve:
        model: str | None = setting(None, env="EXAMPLE_MODEL", required=True, help="checkpoint")

    monkeypatch.delenv("EXAMPLE_MODEL", raising=False)
    parser = argparse.ArgumentParser()
    add_flags(parser, Serve, only_given=False)
    with pytest.raises(SystemExit):
        parser.parse_args([])
    assert "checkpoint (default: $EXAMPLE_MODEL)" in " ".join(parser.format_help().split())
    monkeypatch.setenv("EXAMPLE_MODEL", "/ckpt")
    parser = argparse.ArgumentParser()
    add_flags(parser, Serve, only_given=False)
    assert parser.parse_args([]).model == "/ckpt"


def test_yaml_is_read_through_the_same_table(tmp_path):
    assert from_mapping(Example, {"timeout": 5, "replicas": ["a:1"], "queue": None, "color": "blue"}) == {
        "timeout": 5.0,  # an int for a float setting is that float
        "replicas": ["a:1"],
        "queue": None,
        "color": Color.BLUE,
    }
    with pytest.raises(ValueError, match=r"my.yaml: unknown key\(s\) max_concurency \(known: hold, "):
        from_mapping(Example, {"max_concurency": 4, "hold": True}, source="my.yaml")
    for data, message in (
        ({"hold": "yes"}, "hold takes bool"),
        ({"queue": True}, "queue takes int"),  # a bool is no count
        ({"timeout": "10s"}, "timeout takes float"),
        ({"replicas": "a:1"}, "replicas takes a list"),
        ({"backend": "c"}, r"backend takes one of \['a', 'b'\]"),
        ({"color": "green"}, r"color takes one of \['red', 'blue'\]"),
        ({"name": None}, "name may not be empty"),
    ):
        with pytest.raises(ValueError, match=message):
            from_mapping(Example, data)
    path = tmp_path / "c.yaml"
    path.write_text("")
    assert load_yaml(path) == {}
    path.write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="a mapping"):
        load_yaml(path)


def test_settings_written_back_as_flags_parse_to_the_same_values():
    values = {"hold": False, "replicas": ["a:1", "b:2"], "timeout": 2.5, "queue": None, "color": Color.BLUE}
    argv = as_flags(values, Example)
    assert argv == [
        "--no-hold",
        "--replica",
        "a:1",
        "--replica",
        "b:2",
        "--timeout",
        "2.5",
        "--color",
        "blue",
    ]
    assert given(_parser().parse_args(argv), Example) == {k: v for k, v in values.items() if v is not None}


def test_every_field_must_be_a_setting_and_of_a_type_flags_can_carry():
    @dataclass
    class Bare:
        x: int = 1

    with pytest.raises(TypeError, match=r"Bare.x is not a setting"):
        settings_of(Bare)

    @dataclass
    class Nested:
        x: dict = setting(dict, help="a mapping")

    with pytest.raises(TypeError, match=r"Nested\.x: a setting is bool, int, float, str"):
        settings_of(Nested)
