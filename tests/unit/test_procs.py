"""The tests' own poll: a service that cannot be reached yet is waited for, not a failure."""

from __future__ import annotations

import pytest

from tests.procs import wait_until


def test_a_poll_that_cannot_reach_a_service_is_not_yet():
    answers = iter([ConnectionRefusedError(), TimeoutError(), True])

    def poll() -> bool:
        answer = next(answers)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    assert wait_until(poll, timeout=5, interval=0.01)


def test_the_last_polls_error_is_raised_at_the_deadline():
    def poll() -> bool:
        raise ConnectionRefusedError("nothing listens")

    with pytest.raises(ConnectionRefusedError, match="nothing listens"):
        wait_until(poll, timeout=0.05, interval=0.01)


def test_an_error_that_is_not_about_reaching_a_service_is_raised_at_once():
    def poll() -> bool:
        raise KeyError("healthy")

    with pytest.raises(KeyError):
        wait_until(poll, timeout=5, interval=0.01)
