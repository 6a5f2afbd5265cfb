"""The REST API's chat messages: one model per role, as OpenAI's message types are.

A tagged union on `role`, so the published schema says what each role must hold (a tool message
its `tool_call_id`, only an assistant message `tool_calls`) and a bad message is reported against
the role it was meant as. The tags ("<user>", ...) are left out of `param` by
gateway/api/openai/errors.py (`UNION_TAGS`); plain role names could not be, as `user` is also a
top-level field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator
from pydantic.json_schema import SkipJsonSchema

from gateway.api.openai.content import Content, tag_by, to_content

STRICT = ConfigDict(extra="forbid", strict=True)

# Names and labels, not prompt text: `model` is echoed into every streamed chunk, so an unbounded one
# would multiply a request's size by the number of chunks.
Name = Annotated[str, Field(max_length=256)]

ROLES = ("system", "developer", "user", "assistant", "tool")
ROLE_TAGS = frozenset(f"<{r}>" for r in (*ROLES, "unknown"))


class FunctionCall(BaseModel):
    model_config = STRICT
    name: Name
    arguments: str = Field(description="The arguments as JSON text.")


class ToolCallParam(BaseModel):
    """An earlier assistant turn's call (OpenAI's `tool_calls` entry)."""

    model_config = STRICT
    id: Name
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(BaseModel):
    model_config = STRICT
    role: Literal["system"]
    content: Content
    name: Name | None = None


class DeveloperMessage(BaseModel):
    """OpenAI's newer name for a system message; the prompt has it as one."""

    model_config = STRICT
    role: Literal["developer"]
    content: Content
    name: Name | None = None


class UserMessage(BaseModel):
    model_config = STRICT
    role: Literal["user"]
    content: Content
    name: Name | None = None


class AssistantMessage(BaseModel):
    model_config = STRICT
    role: Literal["assistant"]
    content: Content | None = Field(None, description="May be absent when the turn made tool_calls.")
    name: Name | None = None
    tool_calls: list[ToolCallParam] | None = Field(None, description="The calls this turn made.")

    @model_validator(mode="after")
    def _says_or_calls(self) -> AssistantMessage:
        if self.content is None and not self.tool_calls:
            raise ValueError("an assistant message needs content or tool_calls")
        return self


class ToolMessage(BaseModel):
    model_config = STRICT
    role: Literal["tool"]
    content: Content
    tool_call_id: Name = Field(description="The call this is the result of.")


class UnknownRoleMessage(BaseModel):
    """What an object with a missing or unknown `role` is checked as: it always fails, on `role`,
    so the error names messages.N.role and lists the roles there are. Not in the schema."""

    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]


ChatMessage = Annotated[
    Annotated[SystemMessage, Tag("<system>")]
    | Annotated[DeveloperMessage, Tag("<developer>")]
    | Annotated[UserMessage, Tag("<user>")]
    | Annotated[AssistantMessage, Tag("<assistant>")]
    | Annotated[ToolMessage, Tag("<tool>")]
    | SkipJsonSchema[Annotated[UnknownRoleMessage, Tag("<unknown>")]],
    Discriminator(
        tag_by("role", ROLES),
        custom_error_type="message_role",
        custom_error_message=f"Input should be a message object with role one of {', '.join(ROLES)}",
    ),
]
Message = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage


def turn(message: Message, index: int, url_prefixes: tuple[str, ...]) -> dict[str, Any]:
    """One message as the request model's turn (GenerationRequest.messages)."""
    content = "" if message.content is None else to_content(message.content, index, url_prefixes)
    out: dict[str, Any] = {
        "role": "system" if message.role == "developer" else message.role,
        "content": content,
    }
    if isinstance(message, AssistantMessage) and message.tool_calls:
        out["tool_calls"] = [c.model_dump() for c in message.tool_calls]
    if isinstance(message, ToolMessage):
        out["tool_call_id"] = message.tool_call_id
    return out
