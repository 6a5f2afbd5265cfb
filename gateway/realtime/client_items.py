"""Items as a client gives them (conversation.item.create's `item`, a response.create's `input`),
parsed with pydantic. What each kind needs is checked where its conversation item is made
(gateway/realtime/items.py, function_calls.py): the schema here only bounds and types the fields.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from gateway.realtime.field_types import LENIENT, MAX_TEXT, Id


class ContentPart(BaseModel):
    model_config = LENIENT
    type: Literal["input_text", "input_audio", "input_image", "text", "output_text", "output_audio", "audio"]
    text: Annotated[str, Field(max_length=MAX_TEXT)] | None = None
    audio: str | None = None  # base64 pcm16 24 kHz
    image_url: str | None = None  # data URL
    transcript: Annotated[str, Field(max_length=MAX_TEXT)] | None = None


class Item(BaseModel):
    """A created item: a message (role and content), a function call (call_id, name, arguments)
    or a call's result (call_id, output); what each needs is checked where it is made."""

    model_config = LENIENT
    id: Id | None = None
    type: Literal["message", "function_call", "function_call_output"] = "message"
    role: Literal["user", "assistant", "system"] | None = None
    content: Annotated[list[ContentPart], Field(min_length=1, max_length=64)] | None = None
    call_id: Id | None = None
    name: Annotated[str, Field(max_length=256)] | None = None
    arguments: Annotated[str, Field(max_length=MAX_TEXT)] | None = None
    output: Annotated[str, Field(max_length=MAX_TEXT)] | None = None


class ItemReference(BaseModel):
    """An item of the conversation named in a response's `input` (GA's `item_reference`)."""

    model_config = LENIENT
    type: Literal["item_reference"]
    id: Id


InputItem = Item | ItemReference
