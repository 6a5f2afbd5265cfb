"""`--chunk-schedules` and the A B B A order the schedules run in."""

from __future__ import annotations

import pytest

from omnistream.bench.run import chunk_schedules, interleave


def test_chunk_schedules_are_parsed_and_checked():
    assert chunk_schedules("fixed,grow") == ["fixed", "grow"]
    assert chunk_schedules(" grow ") == ["grow"]
    assert chunk_schedules("") == [None]  # none given: the table's default, no target suffix
    with pytest.raises(ValueError, match="unknown chunk schedule"):
        chunk_schedules("fixed,steady")
    with pytest.raises(ValueError, match="twice"):
        chunk_schedules("grow,grow")


def test_schedules_and_targets_interleave_a_b_b_a():
    units = [("services", "fixed"), ("services", "grow")]
    assert interleave(units, 2) == [units[0], units[1], units[1], units[0]]
    assert interleave(units, 3) == [*units, *units[::-1], *units]
    assert interleave(["a"], 2) == ["a", "a"]
