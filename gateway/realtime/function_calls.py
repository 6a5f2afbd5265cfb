"""Function calls in a realtime conversation: the calls a response makes become `function_call`
output items, a client's `function_call_output` items carry the results back, and both go into
the next prompts as the chat template's tool turns.

A response of a session with tools runs its text through the tool-call parser
(gateway/tools/parser.py, the same as REST): its words are the message item's transcript (and the
only thing spoken: the thinker leaves the call unspoken, omnistream/request/spoken.py); each call is
an item of its own, announced as it starts (`conversation.item.added`,
`response.output_item.added`), its arguments streamed (`response.function_call_arguments.delta`)
and closed once they are a whole JSON object (`.done`, `response.output_item.done`,
`conversation.item.done`). A call cut short (barge-in, `response.cancel`, the token limit) is
ended with `response.output_item.done` (status incomplete, the arguments that were made, no
`.done` for them) and taken out of the conversation (`conversation.item.deleted`): nothing
half-made stays for the next turn to build on. It stays in the response's output, so
`response.done` lists it as it was (incomplete) and says why in its `status_details` (cancelled,
or incomplete at `max_output_tokens`): a call is never taken back unexplained.

In a prompt, a call is the assistant's `tool_calls` (joined to the assistant message before it,
as the model wrote them in one turn) and a result is a `tool` turn; a result whose call is no
longer in the conversation (dropped for the context) is left out with it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gateway.realtime.client_items import Item as GivenItem
from gateway.realtime.conversation import FUNCTION_CALL, FUNCTION_CALL_OUTPUT, Conversation, Item
from gateway.realtime.events import EventError
from gateway.realtime.protocol import Protocol, new_id
from gateway.tools.parser import CallPiece, new_call_id

Emit = Callable[..., Awaitable[None]]  # ResponseRun._emit: (kind, owner=False, **fields)
Dropped = Callable[[list[tuple[str, str]]], Awaitable[None]]  # items the history's caps dropped


def function_item(given: GivenItem, conversation: Conversation) -> Item:
    """A client's `conversation.item.create` of a function_call or a function_call_output (the
    result of a call the conversation holds)."""
    item_id = given.id or new_id("item")
    if given.type == FUNCTION_CALL_OUTPUT:
        if given.call_id is None:
            raise EventError(
                "a function_call_output item needs the call_id of its call",
                code="invalid_value",
                param="item.call_id",
            )
        if given.output is None:
            raise EventError(
                "a function_call_output item needs its output", code="invalid_value", param="item.output"
            )
        if call_of(conversation, given.call_id) is None:
            raise EventError(
                f"the conversation has no function_call with call_id {given.call_id!r}",
                code="invalid_value",
                param="item.call_id",
            )
        return Item(
            item_id, "tool", [], [], type=FUNCTION_CALL_OUTPUT, call_id=given.call_id, output=given.output
        )
    if not given.name:
        raise EventError("a function_call item needs its name", code="invalid_value", param="item.name")
    return Item(
        item_id,
        "assistant",
        [],
        [],
        type=FUNCTION_CALL,
        call_id=given.call_id or new_call_id(),
        name=given.name,
        arguments=given.arguments or "{}",
    )


def call_of(conversation: Conversation, call_id: str) -> Item | None:
    return next(
        (i for i in conversation.items.values() if i.type == FUNCTION_CALL and i.call_id == call_id), None
    )


def prompt_message(item: Item) -> dict[str, Any]:
    """A function item's chat turn (GenerationRequest.messages' tool forms)."""
    if item.type == FUNCTION_CALL:
        call = {
            "id": item.call_id,
            "type": "function",
            "function": {"name": item.name, "arguments": item.arguments},
        }
        return {"role": "assistant", "content": "", "tool_calls": [call]}
    return {"role": "tool", "tool_call_id": item.call_id, "content": item.output}


def joined(turns: list[tuple[Item | None, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The prompt's messages from (item, its message) in conversation order: a call joins the
    assistant message (words or calls) right before it; a result whose call is not among the
    earlier items is left out."""
    out: list[dict[str, Any]] = []
    calls: set[str] = set()
    for item, message in turns:
        if item is not None and item.type == FUNCTION_CALL:
            calls.add(item.call_id)
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                out[-1] = {**last, "tool_calls": [*last.get("tool_calls", ()), *message["tool_calls"]]}
                continue
        elif item is not None and item.type == FUNCTION_CALL_OUTPUT and item.call_id not in calls:
            continue
        out.append(message)
    return out


def complete(arguments: str) -> bool:
    """Are a call's arguments whole (a JSON object: nothing may follow its closing brace)?"""
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False


@dataclass
class _Call:
    item: Item
    index: int  # output_index in the response
    previous: str | None  # the conversation item before it, as the client was told


class CallOutputs:
    """One response's function calls, as output items of the response and items of the
    conversation (see the module doc)."""

    def __init__(
        self,
        protocol: Protocol,
        emit: Emit,
        response_id: str,
        conversation: Conversation,
        next_index: Callable[[], int],
        previous_id: Callable[[], str | None],
        dropped: Dropped | None = None,
    ) -> None:
        self.protocol = protocol
        self.emit = emit
        self.response_id = response_id
        self.conversation = conversation
        self.next_index = next_index
        self.previous_id = previous_id
        self.dropped = dropped
        self.calls: list[_Call] = []  # in output order, the open one last while it streams
        self._open: _Call | None = None

    @property
    def outputs(self) -> list[tuple[int, Item]]:
        """(output_index, item) of the response's calls, a cut one (incomplete) included."""
        return [(c.index, c.item) for c in self.calls]

    async def take(self, piece: CallPiece) -> None:
        if piece.name is not None:
            await self._start(piece)
        if piece.arguments:
            await self._arguments(piece.arguments)

    async def _start(self, piece: CallPiece) -> None:
        if self._open is not None:  # the parser only starts a call once the last one ended
            await self._close(self._open)
        item = Item(
            new_id("item"),
            "assistant",
            [],
            [],
            status="in_progress",
            type=FUNCTION_CALL,
            call_id=piece.id or new_call_id(),
            name=piece.name or "",
        )
        call = _Call(item, self.next_index(), self.previous_id())
        dropped = self.conversation.add(item)
        self.calls.append(call)
        self._open = call
        wire = item.wire(self.protocol)
        await self.emit("conversation.item.added", previous_item_id=call.previous, item=wire)
        await self.emit(
            "response.output_item.added", response_id=self.response_id, output_index=call.index, item=wire
        )
        if dropped and self.dropped is not None:
            await self.dropped(dropped)

    async def _arguments(self, text: str) -> None:
        call = self._open
        if call is None:
            return
        call.item.arguments += text
        await self.emit("response.function_call_arguments.delta", owner=True, delta=text, **self._where(call))
        if "}" in text and complete(call.item.arguments):
            await self._close(call)

    def _where(self, call: _Call) -> dict[str, Any]:
        return {
            "response_id": self.response_id,
            "item_id": call.item.id,
            "output_index": call.index,
            "call_id": call.item.call_id,
        }

    async def _close(self, call: _Call) -> None:
        self._open = None
        item = call.item
        item.status = "completed"
        await self.emit(
            "response.function_call_arguments.done",
            name=item.name,
            arguments=item.arguments,
            **self._where(call),
        )
        wire = item.wire(self.protocol)
        await self.emit(
            "response.output_item.done", response_id=self.response_id, output_index=call.index, item=wire
        )
        await self.emit("conversation.item.done", previous_item_id=call.previous, item=wire)

    async def finish(self) -> None:
        """The response ended: an open call with whole arguments is closed, one cut short leaves the
        conversation (it stays in the response's output, incomplete)."""
        call = self._open
        if call is None:
            return
        if complete(call.item.arguments):
            await self._close(call)
            return
        self._open = None
        item = call.item
        item.status = "incomplete"
        await self.emit(
            "response.output_item.done",
            response_id=self.response_id,
            output_index=call.index,
            item=item.wire(self.protocol),
        )
        if self.conversation.items.get(item.id) is item:
            self.conversation.remove(item)
            await self.emit("conversation.item.deleted", item_id=item.id)
