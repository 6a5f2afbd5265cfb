"""Retries happen only before the first event (a fake stub stands in for the gateway)."""

import grpc
import pytest

from omnistream.client import Client, Unavailable
from omnistream.proto.omni.v1 import gateway_pb2

Event = gateway_pb2.GenerateEvent


class _Failure(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return "stage down"

    def trailing_metadata(self):
        return (("omni-error-kind", "unavailable"),)


class _Call:
    def __init__(self, events, fail_after: int | None) -> None:
        self.events, self.fail_after, self.cancelled = events, fail_after, False

    def __iter__(self):
        for i, event in enumerate(self.events):
            if self.fail_after == i:
                raise _Failure(grpc.StatusCode.UNAVAILABLE)
            yield event
        if self.fail_after == len(self.events):
            raise _Failure(grpc.StatusCode.UNAVAILABLE)

    def cancel(self):
        self.cancelled = True


class _Stub:
    def __init__(self, plan) -> None:
        self.plan, self.calls = list(plan), []

    def Generate(self, request, timeout=None, metadata=()):
        call = _Call(*self.plan.pop(0))
        self.calls.append(call)
        return call


TEXT = Event(text=Event.TextDelta(text="a"))
END = Event(end=Event.End(finish_reason="stop"))


def _client(plan, retries=2) -> Client:
    client = Client("127.0.0.1:1", retries=retries, max_backoff=0.0)
    client._stub = _Stub(plan)
    return client


def test_a_refusal_before_any_event_is_retried():
    client = _client([([], 0), ([TEXT, END], None)])
    assert client.complete("hi").text == "a"
    assert len(client._stub.calls) == 2 and all(c.cancelled for c in client._stub.calls)


def test_a_failure_after_an_event_is_not_retried():
    client = _client([([TEXT, END], 1), ([TEXT, END], None)])
    with pytest.raises(Unavailable):
        client.complete("hi")
    assert len(client._stub.calls) == 1


def test_retries_are_bounded():
    client = _client([([], 0)] * 3, retries=2)
    with pytest.raises(Unavailable):
        client.complete("hi")
    assert len(client._stub.calls) == 3
