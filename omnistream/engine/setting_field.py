"""`setting(...)`: the dataclass field that is a setting (its default, help and flag details, once).

Below every layer that declares settings: the engines' own (omnistream/engine/settings.py,
omnistream/engine/load_options.py), the stage services' and the gateway's. The table that turns
such fields into flags and reads YAML against them is omnistream/service/settings.py, which
re-exports `setting`. Standard library only: the gateway imports it, and must stay torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field
from typing import Any

META_KEY = "omnistream.setting"  # the field's metadata entry holding its `SettingMeta`


@dataclass(frozen=True)
class SettingMeta:
    """What a field adds to its type and default to become a setting."""

    help: str
    flag: str | None = None  # the flag's name without dashes, if not the field's name dashed
    group: str | None = None  # the --help section it is listed under
    parse: Callable[[str], Any] | None = None  # argparse type (e.g. one that refuses 0)
    shown: str | None = None  # the default as --help says it, where the value alone says too little
    env: str | None = None  # an environment variable that gives the default (flags only)
    required: bool = False  # a flag that must be given (unless `env` is set)
    metavar: str | None = None  # the value in --help's usage (default: N, X, or the name)


def setting(
    default: Any = MISSING,
    *,
    help: str,
    flag: str | None = None,
    group: str | None = None,
    parse: Callable[[str], Any] | None = None,
    shown: str | None = None,
    env: str | None = None,
    required: bool = False,
    metavar: str | None = None,
    repr: bool = True,
) -> Any:
    """A dataclass field that is a setting. `default`: the value, or a class (list, dict) whose
    instance is the default (a fresh one per config). `help` says what it does, never its default:
    --help appends that from the field (`shown` where the value needs words: "--max-concurrency")."""
    meta = {META_KEY: SettingMeta(help, flag, group, parse, shown, env, required, metavar)}
    if isinstance(default, type):
        return field(default_factory=default, metadata=meta, repr=repr)
    return field(default=default, metadata=meta, repr=repr)
