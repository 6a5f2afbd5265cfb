"""The docs name only real settings with their real defaults: README.md's and docs/*.md's settings
tables, and deploy/gateway.example.yaml.

A settings table is one whose first header cell says "flag" or "YAML" (a key); each
backticked name in a row's first cell must be a GatewayConfig key or a flag of some `omnistream`
command, and its "Default" cell (split at ", " when the row names several settings) must read as
that setting's default: `on`/`off`, a number with an optional unit (s, ms, KiB, MiB, GiB; thousands
commas allowed), `none`, a backticked value, or the name of the setting an unset one falls back to.
In the example YAML every key is a setting, and every value is the default unless its comment says
`default: X` (or `default X`) with X the real default.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import GatewayConfig
from omnistream.service.settings import Setting, from_mapping, table

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLE_YAML = ROOT / "deploy" / "gateway.example.yaml"
GATEWAY = table(GatewayConfig)
UNITS = {"": 1, "s": 1, "ms": 1e-3, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
_NUMBER = re.compile(r"^(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)\s*(ms|s|KiB|MiB|GiB)?\b")
_TICKED = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Known:
    """A setting a doc may name: where it lives, its default, and what an unset one falls back to."""

    where: str  # "gateway <key>" or "<command> <flag>"
    default: Any
    falls_back_to: str = ""  # the words the table says for an unset default ("--max-concurrency")


def _gateway_known(row: Setting) -> Known:
    return Known(f"gateway {row.name}", row.default, row.meta.shown or "")


def _command_flags() -> dict[str, list[Known]]:
    """Every flag of every `omnistream` command, with its parsed default (the gateway's flags parse
    to None, not given: their defaults are GatewayConfig's, which `_resolve` looks up first)."""
    from omnistream.cli.main import build_parser

    found: dict[str, list[Known]] = {}

    def walk(parser: argparse.ArgumentParser, command: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{command} {name}".strip())
            for flag in action.option_strings:
                found.setdefault(flag, []).append(Known(f"{command} {flag}", action.default))

    walk(build_parser(), "omnistream")
    return found


FLAGS = _command_flags()


def _resolve(name: str) -> list[Known]:
    """What a backticked name in a settings table's first cell may be; [] if nothing."""
    name = name.split()[0].rstrip(",")
    if name.startswith("--"):
        key = name.removeprefix("--no-") if name.startswith("--no-") else name[2:]
        rows = [r for r in GATEWAY.values() if r.flag[2:] in (key, name[2:])]
        if rows:
            return [_gateway_known(rows[0])]
        return FLAGS.get(name, [])
    if name in GATEWAY:
        return [_gateway_known(GATEWAY[name])]
    return []


def _reads_as(text: str, known: Known) -> bool:
    """Whether a Default cell's text says `known`'s default."""
    text = text.strip()
    default = known.default
    word = text.split()[0].lower().rstrip(",;") if text else ""
    if word in ("on", "off", "true", "false"):
        return isinstance(default, bool) and default == (word in ("on", "true"))
    if word == "none":
        return default in (None, [], "")
    ticked = _TICKED.match(text)
    if ticked:
        value = ticked.group(1)
        if default is None:  # the setting it falls back to, by key or flag
            return bool(known.falls_back_to) and (
                value in known.falls_back_to or "--" + value.replace("_", "-") in known.falls_back_to
            )
        return str(getattr(default, "value", default)) == value
    number = _NUMBER.match(text)
    if number and not isinstance(default, bool) and isinstance(default, int | float):
        value = float(number.group(1).replace(",", "")) * UNITS[number.group(2) or ""]
        return math.isclose(value, default, rel_tol=1e-9)
    return False


@dataclass(frozen=True)
class Row:
    doc: str
    line: int
    names: list[str]
    default: str | None


def _settings_rows() -> list[Row]:
    rows = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        i = 0
        while i < len(lines):
            header = _cells(lines[i])
            if header and i + 1 < len(lines) and re.fullmatch(r"\|[-:| ]+\|", lines[i + 1].strip()):
                is_settings = re.search(r"flag|yaml", header[0], re.IGNORECASE)
                column = next((j for j, h in enumerate(header) if h.lower().startswith("default")), None)
                i += 2
                while i < len(lines) and lines[i].lstrip().startswith("|"):
                    cells = _cells(lines[i])
                    if is_settings:
                        default = cells[column] if column is not None and column < len(cells) else None
                        rows.append(Row(doc.name, i + 1, _TICKED.findall(cells[0]), default))
                    i += 1
                continue
            i += 1
    return rows


def _cells(line: str) -> list[str]:
    line = line.strip()
    if not (line.startswith("|") and line.endswith("|")):
        return []
    return [c.strip() for c in re.split(r"(?<!\\)\|", line[1:-1])]


def test_there_are_settings_tables_to_check():
    assert len(_settings_rows()) >= 15  # the admission and media tables, wherever they live now


def test_the_settings_tables_name_real_settings_with_their_real_defaults():
    wrong = []
    for row in _settings_rows():
        where = f"{row.doc}:{row.line}"
        settings: list[list[Known]] = []
        for name in row.names:
            found = _resolve(name)
            if not found:
                wrong.append(f"{where}: `{name}` is no gateway key nor any command's flag")
            elif all(found[0].where != s[0].where for s in settings):  # `--x`, `x`: one setting
                settings.append(found)
        if row.default is None or not settings:
            continue
        parts = [row.default] if len(settings) == 1 else row.default.split(", ")
        if len(parts) != len(settings):
            wrong.append(f"{where}: {len(settings)} settings but defaults {row.default!r}")
            continue
        for found, text in zip(settings, parts, strict=True):
            if not any(_reads_as(text, known) for known in found):
                real = ", ".join(f"{k.where} = {k.default!r}" for k in found)
                wrong.append(f"{where}: default {text!r} is not the real one ({real})")
    assert not wrong, "settings tables that disagree with the code:\n" + "\n".join(wrong)


def _yaml_lines() -> list[tuple[int, str, str | None, str]]:
    """(line, key, value text or None for a commented-out key, comment) of the example's top-level
    settings, commented-out ones (`# tls_cert: ...`) included."""
    found = []
    for number, line in enumerate(EXAMPLE_YAML.read_text().splitlines(), 1):
        live = re.match(r"^([a-z_0-9]+):\s*(.*?)\s*(?:#\s*(.*))?$", line)
        if live:
            found.append((number, live.group(1), live.group(2), live.group(3) or ""))
            continue
        dead = re.match(r"^#\s*([a-z_0-9]+):\s*(\S.*?)(?:\s+#\s*(.*))?$", line)
        if dead:
            found.append((number, dead.group(1), None, dead.group(3) or ""))
    return found


def test_the_example_yaml_names_real_keys_with_the_real_defaults_or_says_so():
    data = yaml.safe_load(EXAMPLE_YAML.read_text())
    stages = data.pop("stages")
    assert set(stages) <= {"thinker", "talker", "code2wav"}
    values = from_mapping(GatewayConfig, data, source=EXAMPLE_YAML.name)  # every key a setting, typed
    wrong = []
    seen = set()
    for line, key, text, comment in _yaml_lines():
        where = f"{EXAMPLE_YAML.name}:{line}"
        if key == "stages":
            continue  # replica addresses: the example's own, no default to keep
        if key not in GATEWAY:
            wrong.append(f"{where}: {key} is no gateway setting")
            continue
        seen.add(key)
        if text is None:
            continue  # commented out: the default applies
        real = _gateway_known(GATEWAY[key])
        if values[key] == real.default:
            continue
        said = re.search(r"default:?\s+([^;,)]+)", comment)
        if not said:
            wrong.append(
                f"{where}: {key}: {values[key]!r} is not the default {real.default!r}; say `default: X`"
            )
        elif not (_reads_as(said.group(1), real) or _reads_as(f"`{said.group(1).strip()}`", real)):
            wrong.append(f"{where}: {key}: the comment's default {said.group(1)!r} is not {real.default!r}")
    assert not wrong, "\n".join(wrong)
    assert seen >= set(GATEWAY) - {"thinker", "talker", "code2wav"}, "settings the example leaves out"
    config = GatewayConfig.from_yaml(EXAMPLE_YAML)
    config.validate()


@pytest.mark.parametrize(
    ("text", "default", "reads"),
    [
        ("on", True, True),
        ("off", True, False),
        ("10 s", 10.0, True),
        ("8 MiB of files", 8 * 1024 * 1024, True),
        ("36,000,000 per image", 36_000_000, True),
        ("0.0125 s", 0.0125, True),
        ("16", 8, False),
        ("none", None, True),
        ("`qwen3-omni`", "qwen3-omni", True),
        ("soon", 1.0, False),
    ],
)
def test_a_default_cell_reads_as_its_value(text, default, reads):
    assert _reads_as(text, Known("x", default)) is reads
