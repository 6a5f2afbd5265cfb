"""The reference tier: the model, in this process, against the transformers reference (no services,
as the unit tier, whose protos and no-services guard it shares), apart from the unit tier because a
whole generation or a real-structured decode takes seconds where a unit test takes milliseconds."""

from __future__ import annotations

from tests.unit.conftest import generated_protos, no_services  # noqa: F401 (fixtures, by name)
