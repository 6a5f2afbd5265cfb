"""The op counter: every dispatched aten op, split by capturable region."""

from __future__ import annotations

import torch

from omnistream.engine.capture import capturable
from omnistream.engine.op_count import OpCounter


def test_counts_each_op_once_inside_or_outside():
    x = torch.ones(4)
    with OpCounter() as counter:
        y = x + 1  # outside: add
        with capturable("region"):
            z = y * 2  # inside: mul
            z = z.sum()  # inside: sum
        _ = [y[i] for i in range(3)]  # outside: one select per row
    counts = counter.counts
    assert (counts.inside, counts.outside, counts.total) == (2, 4, 6)
    assert counts.outside_ops == {"aten.add": 1, "aten.select": 3}
    assert counts.as_dict() == {"total": 6, "inside": 2, "outside": 4}


def test_nothing_is_counted_after_the_block():
    x = torch.ones(2)
    with OpCounter() as counter:
        x.add(1)
    x.add(1)
    assert counter.counts.total == 1
