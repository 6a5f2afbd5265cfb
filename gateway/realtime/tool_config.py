"""A realtime session's tools and tool choice: the Realtime API's JSON as the gateway's one tool
model (gateway/tools/spec.py), checked when they are set so a bad one is an `error` event naming
the param and changes nothing, and shown back in session.created / session.updated.

Realtime tools are flat (`{"type": "function", "name", "description", "parameters"}`) where chat
completions nest them under `function`; a named choice is `{"type": "function", "name"}`. What
they mean for an answer (the prompt's tools block, the grammar of `required` or a named function,
whether the text is searched for calls) is decided by `spec.tool_use`, as for REST.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.realtime.events import EventError, FunctionChoice, FunctionTool, ToolChoice
from gateway.tools.spec import Choice, Function, Named, ToolUse, tool_use
from omnistream.request.errors import OmniError


def functions_of(tools: Sequence[FunctionTool], param: str) -> tuple[Function, ...]:
    """The given tools as functions; `param` is where they sit (`session.tools`)."""
    return tuple(
        Function(t.name, t.description, t.parameters, param=f"{param}.{i}") for i, t in enumerate(tools)
    )


def choice_of(choice: ToolChoice) -> Choice | Named:
    return Named(choice.name) if isinstance(choice, FunctionChoice) else choice


def checked_use(functions: Sequence[Function], choice: Choice | Named, param: str) -> ToolUse:
    """What an answer with these tools and choice does, or an EventError naming the param
    (`param`: the object holding them, `session` or `response`)."""
    try:
        return tool_use(functions, choice, choice_param=f"{param}.tool_choice")
    except OmniError as exc:
        raise EventError(exc.message, code="invalid_value", param=exc.field) from None


def updated(
    functions: tuple[Function, ...],
    choice: Choice | Named,
    tools: Sequence[FunctionTool] | None,
    new_choice: ToolChoice | None,
    param: str,
) -> tuple[tuple[Function, ...], Choice | Named]:
    """The tools and choice after an update that gives `tools` and/or `new_choice` (None: kept),
    checked together (e.g. `required` with no tools is refused whichever update made it so)."""
    if tools is not None:
        functions = functions_of(tools, f"{param}.tools")
    if new_choice is not None:
        choice = choice_of(new_choice)
    checked_use(functions, choice, param)
    return functions, choice


def tools_wire(functions: Sequence[Function]) -> list[dict[str, Any]]:
    """The tools as the Realtime API shows them."""
    out = []
    for f in functions:
        tool: dict[str, Any] = {"type": "function", "name": f.name}
        if f.description is not None:
            tool["description"] = f.description
        if f.parameters is not None:
            tool["parameters"] = dict(f.parameters)
        out.append(tool)
    return out


def choice_wire(choice: Choice | Named) -> str | dict[str, str]:
    return {"type": "function", "name": choice.name} if isinstance(choice, Named) else choice
