"""All four stage engines against the engine API (omnistream/engine/api.py), by signature.

Every member of `StageEngine` and of the stage's own protocol exists on each engine class (a method
as a method, a property or attribute as something readable) and a method's signature accepts what
the protocol's does: the same parameters in the same order and kinds, and any extra ones with
defaults. mypy checks the same statically (`omnistream/models/qwen3_omni/family.py` returns them as
`StageEngine`, `omnistream/models/qwen3_omni/engine_types.py` assigns each to its stage's protocol).
No weights are loaded, and the vLLM engine's module imports without vllm.
"""

from __future__ import annotations

import inspect
from typing import Protocol

import pytest

from omnistream.engine.api import (
    STAGE_PROTOCOLS,
    Code2WavStageEngine,
    StageEngine,
    TalkerStageEngine,
    ThinkerStageEngine,
)
from omnistream.models.qwen3_omni.code2wav.engine import Code2WavEngine
from omnistream.models.qwen3_omni.talker.engine import TalkerEngine
from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine
from omnistream.models.qwen3_omni.thinker.vllm_engine import VllmThinkerEngine

ENGINES: list[tuple[type, type]] = [
    (ThinkerEngine, ThinkerStageEngine),
    (VllmThinkerEngine, ThinkerStageEngine),
    (TalkerEngine, TalkerStageEngine),
    (Code2WavEngine, Code2WavStageEngine),
]


def _protocol_members(protocol: type) -> dict[str, object]:
    """Name -> the protocol's own definition (a function, a property, or None for an attribute)."""
    members: dict[str, object] = {}
    for klass in reversed(protocol.__mro__):
        if klass is object or klass is Protocol or not getattr(klass, "_is_protocol", False):
            continue
        for name in inspect.get_annotations(klass):
            members.setdefault(name, None)
        for name, value in vars(klass).items():
            if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)):
                members[name] = value
    return members


def _attributes(engine: type) -> set[str]:
    """What instances of `engine` carry: class attributes, annotations, and `self.x = ...` in the
    constructors of its classes (read from their source: no weights are loaded)."""
    names = set(dir(engine))
    for klass in engine.__mro__:
        names.update(inspect.get_annotations(klass))
        init = vars(klass).get("__init__")
        if init is not None and inspect.isfunction(init):
            source = inspect.getsource(init)
            names.update(part.split("=")[0].split(":")[0].strip() for part in source.split("self.")[1:])
    return names


def _accepts(implementation: inspect.Signature, wanted: inspect.Signature) -> str | None:
    """None when `implementation` can be called every way `wanted` can; else what is wrong."""
    wanted_params = [p for p in wanted.parameters.values() if p.name != "self"]
    given = [p for p in implementation.parameters.values() if p.name != "self"]
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in wanted_params):
        fixed = [p for p in wanted_params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if [p.name for p in given[: len(fixed)]] != [p.name for p in fixed]:
            return f"its first parameters are not {[p.name for p in fixed]}"
        return None
    for index, param in enumerate(wanted_params):
        if index >= len(given) or given[index].name != param.name:
            return f"parameter {index} should be {param.name!r}"
        if given[index].kind != param.kind:
            return f"{param.name!r} is {given[index].kind.description}, not {param.kind.description}"
        if param.default is not param.empty and given[index].default is param.empty:
            return f"{param.name!r} has no default"
    for param in given[len(wanted_params) :]:
        if param.default is param.empty and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            return f"extra parameter {param.name!r} has no default"
    return None


@pytest.mark.parametrize(("engine", "protocol"), ENGINES, ids=lambda x: x.__name__)
def test_every_engine_offers_the_whole_engine_api(engine: type, protocol: type) -> None:
    assert StageEngine in protocol.__mro__
    attributes = _attributes(engine)
    problems = []
    for name, definition in _protocol_members(protocol).items():
        offered = inspect.getattr_static(engine, name, None)
        if inspect.isfunction(definition):
            if not inspect.isfunction(offered):
                problems.append(f"{name}: not a method")
                continue
            wrong = _accepts(inspect.signature(offered), inspect.signature(definition))
            if wrong:
                problems.append(f"{name}{inspect.signature(offered)}: {wrong}")
        elif inspect.isfunction(offered):
            problems.append(f"{name}: a method, where the API has an attribute")
        elif name not in attributes:
            problems.append(f"{name}: missing")
    assert not problems, f"{engine.__name__} against {protocol.__name__}: {problems}"


def test_each_stage_has_its_protocol() -> None:
    assert set(STAGE_PROTOCOLS) == {"thinker", "talker", "code2wav"}
    assert STAGE_PROTOCOLS["thinker"] is ThinkerStageEngine


def test_the_check_catches_a_missing_member_and_a_wrong_signature() -> None:
    class Wrong:
        name = "talker"

        def abort(self, rid: str) -> bool:  # renamed parameter, no `output`
            return False

    members = _protocol_members(StageEngine)
    assert "start" in members and "stats" in members and "config" in members
    assert inspect.getattr_static(Wrong, "start", None) is None
    abort = members["abort"]
    assert inspect.isfunction(abort)
    assert _accepts(inspect.signature(Wrong.abort), inspect.signature(abort)) is not None
