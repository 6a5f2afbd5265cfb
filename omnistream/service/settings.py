"""One table per config dataclass: its fields are the settings, and flags and YAML are read from it.

A setting's type, default and help are written once, beside its field:

    @dataclass
    class Config:
        queue_timeout: float = setting(10.0, help="seconds a request may wait for admission")
        thinker: list[str] = setting(list, help="thinker replica address")

and everything else is derived from that field, so nothing repeats it by hand (the idea of vLLM's
`engine/arg_utils.py`, which turns its config dataclasses into flags):

- `add_flags` adds one argparse flag per field: `--queue-timeout` (the field's name, dashed),
  `bool` as `--x/--no-x`, `list[str]` repeatable, `T | None`, `Literal[...]` and `Enum` as choices;
  its help ends in the real default, formatted from the field.
- `given` reads back the flags that were given. Flags parse to None when absent (`only_given`, the
  default), so the order defaults <- YAML file <- flags holds: a flag absent from the command line
  does not overwrite what the YAML said.
- `build` makes the typed config from a parsed namespace, once, at a command's entry point (a
  stage service's engine settings, omnistream/engine/settings.py); past it, code takes the object.
- `from_mapping` checks a YAML mapping against the same table: an unknown key or a value of the
  wrong type is an error naming the key, not a surprise at serving time.

Torch-free and light (argparse, dataclasses, typing), so the gateway and the stage services both
build their parsers from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import os
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

# The field declarator lives below every layer that declares settings (the engines' too).
from omnistream.engine.setting_field import META_KEY as _META_KEY
from omnistream.engine.setting_field import SettingMeta as _Meta
from omnistream.engine.setting_field import setting as setting

MIB = 1024 * 1024
_METAVARS = {int: "N", float: "X"}  # what --help shows for a value (a str's is its name)
_Config = typing.TypeVar("_Config")


@dataclass(frozen=True)
class Setting:
    """One row of a config's table: a field as the flags and the YAML see it."""

    name: str
    kind: type  # bool, int, float, str, or an Enum class
    default: Any  # the value a config gets without a flag or YAML key (MISSING: none)
    optional: bool  # None is a value (`T | None`)
    repeatable: bool  # list[kind]: a flag given once per item, a YAML list
    choices: tuple[Any, ...] | None
    meta: _Meta

    @property
    def flag(self) -> str:
        """The flag as typed: `--audio-hold` for `audio_hold`."""
        return "--" + (self.meta.flag or self.name.replace("_", "-"))

    @property
    def help(self) -> str:
        return self.meta.help


def show(value: Any) -> str | None:
    """A default in words: on/off, none for an empty list, whole MiB spelled out beside the bytes."""
    if value is MISSING or value is None:
        return None
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value) if value else "none"
    if isinstance(value, int) and value >= MIB and value % MIB == 0:
        return f"{value} ({value // MIB} MiB)"
    return str(value)


def settings_of(cls: type) -> list[Setting]:
    """The table of a config dataclass, in field order (every field must be a `setting`)."""
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(_META_KEY)
        if meta is None:
            raise TypeError(f"{cls.__name__}.{f.name} is not a setting(...): it needs a help text")
        kind, optional, repeatable, choices = _kind(hints[f.name], f"{cls.__name__}.{f.name}")
        default = f.default if f.default_factory is MISSING else f.default_factory()
        rows.append(Setting(f.name, kind, default, optional, repeatable, choices, meta))
    return rows


def _kind(hint: Any, where: str) -> tuple[type, bool, bool, tuple[Any, ...] | None]:
    """(item type, optional, repeatable, choices) of a field's annotation."""
    optional = False
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"{where}: one type besides None, got {hint}")
        hint, optional = rest[0], True
    repeatable = typing.get_origin(hint) is list
    if repeatable:
        (hint,) = typing.get_args(hint)
    choices = None
    if typing.get_origin(hint) is typing.Literal:
        choices = typing.get_args(hint)
        hint = type(choices[0])
    elif isinstance(hint, type) and issubclass(hint, enum.Enum):
        choices = tuple(hint)
    if not isinstance(hint, type) or not (hint in (bool, int, float, str) or issubclass(hint, enum.Enum)):
        raise TypeError(f"{where}: a setting is bool, int, float, str, an Enum or a list of them, got {hint}")
    return hint, optional, repeatable, choices


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    names: Iterable[str] | None = None,
    only_given: bool = True,
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """One flag per setting of `cls` (or of `names`, in that order). `only_given`: an absent flag
    parses to None, for `given` to lay over a config; else to the field's default (or `defaults`'
    value for its name: a command whose own default differs), for a command that reads its
    namespace as it is."""
    rows_by_name = table(cls)
    rows = [rows_by_name[name] for name in names] if names is not None else list(rows_by_name.values())
    groups: dict[str, argparse._ArgumentGroup] = {}
    for row in rows:
        default = (defaults or {}).get(row.name, row.default)
        target = parser
        if row.meta.group and isinstance(parser, argparse.ArgumentParser):
            target = groups.get(row.meta.group) or _group(parser, row.meta.group)
            groups[row.meta.group] = target
        _add_flag(target, row, default, only_given)


def _group(parser: argparse.ArgumentParser, title: str) -> argparse._ArgumentGroup:
    """The parser's section of that title, made on first use (two configs may share one)."""
    for group in parser._action_groups:
        if group.title == title:
            return group
    return parser.add_argument_group(title)


def _add_flag(
    target: argparse.ArgumentParser | argparse._ArgumentGroup, row: Setting, default: Any, only_given: bool
) -> None:
    shown = row.meta.shown if row.meta.shown is not None else show(default)
    if row.meta.env:
        shown = f"${row.meta.env}" if shown is None else f"{shown}, or ${row.meta.env}"
    notes = (["repeatable"] if row.repeatable else []) + ([f"default: {shown}"] if shown is not None else [])
    help_text = row.help + (f" ({'; '.join(notes)})" if notes else "")
    kwargs: dict[str, Any] = {"dest": row.name, "help": help_text.replace("%", "%%")}
    if row.meta.env:  # set and not empty: the default; unset or empty: the field's
        default = os.environ.get(row.meta.env) or (None if default is MISSING else default)
    if row.meta.required and default in (None, MISSING):
        kwargs["required"] = True
    kwargs["default"] = None if only_given or default is MISSING else default
    if row.kind is bool and not row.repeatable:
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        kwargs["type"] = row.meta.parse or row.kind  # an Enum class turns its value into a member
        if row.choices is not None:
            kwargs["choices"] = row.choices
        elif row.meta.metavar or row.kind in _METAVARS:
            kwargs["metavar"] = row.meta.metavar or _METAVARS[row.kind]
        if row.repeatable:
            kwargs["action"] = "append"
            kwargs["default"] = None  # append onto a given list would keep the default's items
    target.add_argument(row.flag, **kwargs)


def table(cls: type) -> dict[str, Setting]:
    """`settings_of(cls)` by name."""
    return {s.name: s for s in settings_of(cls)}


def as_flags(values: Mapping[str, Any], cls: type) -> list[str]:
    """Settings of `cls` written back as its flags, in `values`' order (None: left out), for a
    command that starts another with some of its own settings (`omnistream up` its gateway)."""
    rows = table(cls)
    argv: list[str] = []
    for name, value in values.items():
        row = rows[name]
        if value is None:
            continue
        if row.kind is bool and not row.repeatable:
            argv.append(row.flag if value else "--no-" + row.flag[2:])
            continue
        for item in value if row.repeatable else [value]:
            argv += [row.flag, str(getattr(item, "value", item))]
    return argv


def given(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The settings of `cls` whose flags were given (parsed by `add_flags(..., only_given=True)`)."""
    values = {s.name: getattr(args, s.name, None) for s in settings_of(cls)}
    return {name: value for name, value in values.items() if value is not None}


def build(cls: type[_Config], namespace: argparse.Namespace, **overrides: Any) -> _Config:
    """The config dataclass `cls` from a parsed command line: each of its settings the namespace
    holds (one it lacks, or holds as None, as a flag `only_given` left out, keeps the field's
    default), then `overrides` (what the command names otherwise: `up --thinker-device`). The one
    place a namespace becomes a typed config: past a command's entry point, code takes the object."""
    parsed = vars(namespace)
    values = {s.name: parsed[s.name] for s in settings_of(cls) if parsed.get(s.name) is not None}
    return cls(**{**values, **overrides})


def from_mapping(cls: type, data: Mapping[str, Any], source: str = "config") -> dict[str, Any]:
    """`data` (a YAML file's mapping) as `cls`'s keyword arguments, each value checked against its
    field's type (an int for a float setting is taken as that float). ValueError naming the key for
    a key that is no setting or a value of the wrong type."""
    rows = table(cls)
    unknown = sorted(set(data) - set(rows))
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {', '.join(unknown)} (known: {', '.join(rows)})")
    return {name: _checked(rows[name], value, source) for name, value in data.items()}


def load_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML file's top-level mapping ({} for an empty file); ValueError when it is not one."""
    import yaml  # type: ignore[import-untyped]  # no stubs; here: the flags alone need no YAML parser

    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a mapping of setting: value expected, got {type(data).__name__}")
    return data


def _checked(row: Setting, value: Any, source: str) -> Any:
    if value is None:
        if row.optional:
            return None
        raise ValueError(f"{source}: {row.name} may not be empty")
    if row.repeatable:
        if not isinstance(value, list | tuple):
            raise ValueError(f"{source}: {row.name} takes a list, got {value!r}")
        return [_item(row, v, source) for v in value]
    return _item(row, value, source)


def _item(row: Setting, value: Any, source: str) -> Any:
    kind = row.kind
    if issubclass(kind, enum.Enum):
        try:
            return kind(value)
        except ValueError:
            pass
    elif row.choices is not None:
        if value in row.choices:
            return value
    elif kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    elif isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return value
    expected = f"one of {[getattr(c, 'value', c) for c in row.choices]}" if row.choices else kind.__name__
    raise ValueError(f"{source}: {row.name} takes {expected}, got {value!r}")
