"""Unit-test setup for the transport layer.

The gRPC modules under `omnistream/proto/` are generated and git-ignored. Test modules import them
at collection time, which is before any fixture runs, so generation also happens when this conftest
is imported; the session fixture keeps the dependency explicit for tests that ask for it.
"""

from __future__ import annotations

import pytest

from omnistream.wire.protogen import ensure_generated

ensure_generated()


@pytest.fixture(scope="session", autouse=True)
def generated_protos() -> None:
    ensure_generated()


@pytest.fixture(autouse=True)
def no_services(monkeypatch: pytest.MonkeyPatch) -> None:
    """The unit tier starts no service (the rule `make check` is fast by): a test that would fails
    here, naming the service, instead of quietly making the tier slow. Such a test belongs in
    tests/integration/; a unit test that fakes the start patches `_spawn` itself."""
    from omnistream.cli import launcher

    def refuse(name: str, *_args: object, **_kwargs: object) -> None:
        pytest.fail(f"a unit test started the {name} service: move it to tests/integration/")

    monkeypatch.setattr(launcher, "_spawn", refuse)
