"""Every stage setting's default is written once: in its `setting(...)` declaration.

The engines' settings (omnistream/engine/settings.py, the load settings of
omnistream/engine/load_options.py) and the stage service's (services/serve_args.py) are what
`omnistream serve` generates its flags from and hands down as typed objects. The code they reach
takes its values from those objects, so none of it may default a parameter, a dataclass field or a
flag of the same name to the same value again: `max_model_len: int = 4096` in an engine, a family
or the pipeline would drift from `--max-model-len` the first time one of them changes. Read with
`ast` (the consumers below, lazy code included), so a default on a path no test runs still counts.

A `None` default says "not given" (the callee decides) and repeats no value; it is allowed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omnistream.engine.load_options import LoadOptions
from omnistream.engine.settings import STAGE_SETTINGS
from omnistream.service.settings import settings_of
from services.serve_args import StageSettings

ROOT = Path(__file__).resolve().parents[3]
# Where the settings are declared (`setting(...)` fields): their defaults are written here only.
DECLARATIONS = (
    "omnistream/engine/load_options.py",
    "omnistream/engine/settings.py",
    "services/serve_args.py",
)
# What takes the settings: the entry points that build them, and the code they are handed down to.
CONSUMERS = (
    "services/serve.py",
    "services/serve_args.py",
    "omnistream/service/bootstrap.py",
    "omnistream/models/family.py",
    "omnistream/models/qwen3_omni/family.py",
    "omnistream/models/qwen3_omni/memory.py",
    "omnistream/models/qwen3_omni/checkpoint.py",
    "omnistream/models/qwen3_omni/thinker/engine.py",
    "omnistream/models/qwen3_omni/thinker/vllm_engine.py",
    "omnistream/models/qwen3_omni/thinker/vllm_launch.py",
    "omnistream/models/qwen3_omni/talker/engine.py",
    "omnistream/models/qwen3_omni/code2wav/engine.py",
    "omnistream/pipeline.py",
    "omnistream/cli/up.py",
    "omnistream/cli/generate.py",
    "omnistream/cli/common.py",
    "omnistream/bench/run.py",
    "omnistream/bench/stages.py",
    "omnistream/bench/device_smoke.py",
    "omnistream/bench/op_counts.py",
    "omnistream/bench/long_prompt.py",
)
SETTING_CLASSES = (StageSettings, LoadOptions, *STAGE_SETTINGS.values())


def setting_defaults() -> dict[str, Any]:
    """Every stage setting's name and default (one default per name: checked below)."""
    return {row.name: row.default for cls in SETTING_CLASSES for row in settings_of(cls)}


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def declared_constants(root: Path) -> set[str]:
    """The names the declarations give as defaults (`setting(DEFAULT_X, ...)`): a consumer that
    defaults to the same constant repeats the default as surely as one that writes its value."""
    names = set()
    for path in DECLARATIONS:
        file = root / path
        if not file.exists():
            continue
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Call) and _dotted(node.func) == "setting" and node.args:
                name = _dotted(node.args[0])
                if name is not None:
                    names.add(name)
    return names


def _defaults(tree: ast.AST) -> Iterator[tuple[str, ast.expr, int]]:
    """(name, default expression, line) of every parameter default, class-level annotated default
    (a dataclass field) and argparse `add_argument("--flag", default=...)` in `tree`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            for arg, default in zip(
                positional[len(positional) - len(args.defaults) :], args.defaults, strict=True
            ):
                yield arg.arg, default, default.lineno
            for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
                if kw_default is not None:
                    yield arg.arg, kw_default, kw_default.lineno
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value:
                    if isinstance(item.value, ast.Call) and _dotted(item.value.func) == "setting":
                        continue  # a declaration, not a repeat
                    yield item.target.id, item.value, item.lineno
        elif isinstance(node, ast.Call) and _dotted(node.func) == "add_argument" and node.args:
            flag = node.args[0]
            if isinstance(flag, ast.Constant) and isinstance(flag.value, str) and flag.value.startswith("--"):
                for keyword in node.keywords:
                    if keyword.arg == "default":
                        yield flag.value[2:].replace("-", "_"), keyword.value, keyword.value.lineno


def _same(value: Any, default: Any) -> bool:
    return isinstance(value, bool) == isinstance(default, bool) and value == default


def duplicated_defaults(root: Path, defaults: dict[str, Any], constants: set[str]) -> list[str]:
    """`path:line: name = default` for every consumer default that repeats a setting's."""
    found = []
    for path in CONSUMERS:
        file = root / path
        if not file.exists():
            continue
        for name, expr, line in _defaults(ast.parse(file.read_text())):
            if name not in defaults:
                continue
            try:
                value = ast.literal_eval(expr)
            except ValueError:  # not a literal: a constant the declaration uses counts
                if _dotted(expr) in constants:
                    found.append(f"{path}:{line}: {name} = {ast.unparse(expr)} (the setting's default)")
                continue
            if value is not None and _same(value, defaults[name]):
                found.append(f"{path}:{line}: {name} = {ast.unparse(expr)} (the setting's default)")
    return found


def test_no_consumer_repeats_a_settings_default():
    duplicated = duplicated_defaults(ROOT, setting_defaults(), declared_constants(ROOT))
    assert not duplicated, (
        "defaults written again outside their setting(...) declaration (take the value from the typed "
        "settings object instead, omnistream/engine/settings.py):\n" + "\n".join(duplicated)
    )


def test_each_setting_has_one_default_and_each_stage_declares_a_flag_once():
    seen: dict[str, Any] = {}
    for cls in SETTING_CLASSES:
        for row in settings_of(cls):
            assert seen.setdefault(row.name, row.default) == row.default, f"{cls.__name__}.{row.name}"
    service = {row.name for row in settings_of(StageSettings)}
    for stage, cls in STAGE_SETTINGS.items():
        both = service & {row.name for row in settings_of(cls)}
        assert not both, f"{stage}: declared by the service and the engine settings alike: {sorted(both)}"


def test_the_check_finds_a_repeated_default(tmp_path):
    """The check itself: a literal, a declaration's constant, a dataclass field and a flag are
    found; None, another value and another name are not."""
    consumer = tmp_path / CONSUMERS[0]
    consumer.parent.mkdir(parents=True)
    consumer.write_text(
        "import dataclasses\n"
        "def engine(max_model_len: int = 4096, max_batch=DEFAULT_MAX_BATCH, *, max_requests=None):\n"
        "    pass\n"
        "@dataclasses.dataclass\n"
        "class Options:\n"
        "    device: str = 'cpu'\n"
        "    prefill_chunk: int = 8\n"
        "    width: int = 4096\n"
        "p.add_argument('--allow-float64', default=False)\n"
    )
    found = duplicated_defaults(tmp_path, setting_defaults(), {"DEFAULT_MAX_BATCH"})
    assert [line.split(": ")[1] for line in found] == [
        "max_model_len = 4096 (the setting's default)",
        "max_batch = DEFAULT_MAX_BATCH (the setting's default)",
        "device = 'cpu' (the setting's default)",
        "allow_float64 = False (the setting's default)",
    ]
