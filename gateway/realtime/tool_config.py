"""A realtime session's tools and tool choice: the Realtime API's JSON as the gateway's one tool
model (gateway/tools/spec.py), and shown back in session.created / session.updated.

A bad tool is refused when it is set (an `error` event naming the param; the tools stay as they
were). Whether the choice fits the tools (`required` needs some, a named function must be among
them) is checked when a response runs, not when they are set: a client may set the choice before
its tools (pipecat sends `tool_choice: "required"` in its first session.update, its tools later),
and OpenAI's schema accepts either alone. A response whose choice does not fit is refused with an
`error` naming `session.tool_choice` (or `response.tool_choice`), and does not start.

Realtime tools are flat (`{"type": "function", "name", "description", "parameters"}`) where chat
completions nest them under `function`; a named choice is `{"type": "function", "name"}`. What
they mean for an answer (the prompt's tools block, the grammar of `required` or a named function,
whether the text is searched for calls) is decided by `spec.tool_use`, as for REST.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.realtime.events import EventError
from gateway.realtime.settings import FunctionChoice, FunctionTool, ToolChoice
from gateway.tools.spec import Choice, Function, Named, ToolUse, check_functions, tool_use
from omnistream.request.errors import OmniError

CHOICES: tuple[Choice, ...] = ("auto", "none", "required")


def functions_of(tools: Sequence[FunctionTool], param: str) -> tuple[Function, ...]:
    """The given tools as functions, checked (names, parameter schemas: an EventError naming the
    bad one); `param` is where they sit (`session.tools`)."""
    functions = tuple(
        Function(t.name, t.description, t.parameters, param=f"{param}.{i}") for i, t in enumerate(tools)
    )
    try:
        check_functions(functions)
    except OmniError as exc:
        raise EventError(exc.message, code="invalid_value", param=exc.field) from None
    return functions


def choice_of(choice: ToolChoice) -> Choice | Named:
    """A choice as given: one of `CHOICES`, a named function, or (beta) a function's name."""
    if isinstance(choice, FunctionChoice):
        return Named(choice.name)
    return next((c for c in CHOICES if c == choice), None) or Named(choice)


def apply_tools(target: Any, fields: Any, where: str) -> None:
    """A session.update's or response.create's `tools` and `tool_choice` (those given) onto a
    session config or one response's settings (`where`: `session` or `response`). The choice is
    set first: a bad tool (the EventError naming it) leaves the tools as they were, not it."""
    if fields.tool_choice is not None:
        target.tool_choice = choice_of(fields.tool_choice)
    if fields.tools is not None:
        target.tools = functions_of(fields.tools, f"{where}.tools")


def checked_use(functions: Sequence[Function], choice: Choice | Named, param: str) -> ToolUse:
    """What an answer with these tools and choice does, or an EventError naming the param
    (`param`: the object holding them, `session` or `response`)."""
    try:
        return tool_use(functions, choice, choice_param=f"{param}.tool_choice")
    except OmniError as exc:
        message = exc.message
        if exc.field == f"{param}.tool_choice":
            message += f" when a response runs (set tools, or tool_choice 'auto', on the {param})"
        raise EventError(message, code="invalid_value", param=exc.field) from None


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


def choice_wire(choice: Choice | Named, beta: bool) -> str | dict[str, str]:
    """As the Realtime API shows it (beta's tool_choice is a string: a named function is its name)."""
    if not isinstance(choice, Named):
        return choice
    return choice.name if beta else {"type": "function", "name": choice.name}
