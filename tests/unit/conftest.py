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
