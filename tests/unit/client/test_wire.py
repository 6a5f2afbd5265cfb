import grpc
import numpy as np

from omnistream.client import AudioChunk, DeadlineExceeded, End, Overloaded, TextDelta, Usage
from omnistream.client.connection import Connection
from omnistream.client.wire import retryable, to_error, to_event
from omnistream.proto.omni.v1 import gateway_pb2
from omnistream.wire.tensors import to_proto

Event = gateway_pb2.GenerateEvent


def test_wire_events_become_typed_events():
    text = to_event(Event(text=Event.TextDelta(text="hé", token_ids=[1, 2])))
    assert text == TextDelta("hé", (1, 2))
    pcm = np.array([0.25, -0.5], np.float32)
    audio = to_event(Event(audio=Event.AudioChunk(pcm=to_proto(pcm), sample_rate=24000, first_sample=480)))
    assert isinstance(audio, AudioChunk) and audio.sample_rate == 24000 and audio.first_sample == 480
    np.testing.assert_array_equal(audio.samples, pcm)
    usage = to_event(Event(usage=Event.Summary(prompt_tokens=3, completion_tokens=4, e2e_seconds=1.5)))
    assert usage == Usage(3, 4, e2e=1.5)
    assert to_event(Event(end=Event.End(finish_reason="length"))) == End("length")
    assert to_event(Event(error=Event.Error(kind="internal", message="x"))) is None


def test_statuses_become_the_projects_typed_errors_with_kind_and_retry_after():
    error = to_error(
        grpc.StatusCode.RESOURCE_EXHAUSTED, "full", [("omni-error-kind", "overloaded"), ("retry-after", "2")]
    )
    assert isinstance(error, Overloaded) and error.retry_after == 2.0 and retryable(error)
    timeout = to_error(grpc.StatusCode.DEADLINE_EXCEEDED, "late", [])
    assert isinstance(timeout, DeadlineExceeded) and not retryable(timeout)
    assert timeout.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_backoff_follows_retry_after_within_its_cap(monkeypatch):
    c = Connection("x:1", max_backoff=3.0)
    assert c.backoff(0, 2.0) == 2.0 and c.backoff(0, 30.0) == 3.0 and c.backoff(1, None) == 0.4
    monkeypatch.setenv("OMNISTREAM_API_KEY", "k")
    assert c.metadata() == (("authorization", "Bearer k"),)
    assert Connection("x:1").credentials() is None and Connection("x:1", tls=True).credentials() is not None
