"""DeepRows: the deep rows of a prompt's multimodal positions as one tensor, still a mapping of
position -> row; taken by position in one index, moved in one copy."""

from __future__ import annotations

import pytest
import torch

from omnistream.models.qwen3_omni.talker.deep_rows import DeepRows


def test_it_is_the_mapping_it_was_made_of():
    given = {7: torch.tensor([1.0, 2.0]), 3: torch.tensor([3.0, 4.0]), 9: torch.tensor([5.0, 6.0])}
    rows = DeepRows.of(given)
    assert list(rows) == [7, 3, 9] and len(rows) == 3 and rows.width == 2
    assert all(torch.equal(rows[p], given[p]) for p in given)
    assert 3 in rows and 4 not in rows
    assert DeepRows.of(rows) is rows


def test_rows_are_taken_in_the_order_asked_and_a_missing_position_is_a_key_error():
    rows = DeepRows([10, 11, 12, 20], torch.arange(8.0).view(4, 2))
    assert torch.equal(rows.take([10, 11, 12]), torch.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]))
    assert torch.equal(rows.take([20, 10]), torch.tensor([[6.0, 7.0], [0.0, 1.0]]))
    assert rows.take([]).shape == (0, 2)
    with pytest.raises(KeyError):
        rows.take([10, 13])


def test_one_copy_moves_them_and_none_when_they_are_where_asked():
    rows = DeepRows([1, 2], torch.ones(2, 3, dtype=torch.float32))
    assert rows.to("cpu", torch.float32) is rows
    moved = rows.to("cpu", torch.float64)
    assert moved.rows.dtype == torch.float64 and moved.positions == [1, 2]


def test_rows_that_do_not_match_their_positions_are_refused():
    with pytest.raises(ValueError, match="need"):
        DeepRows([1, 2, 3], torch.zeros(2, 4))
    with pytest.raises(ValueError, match="two deep rows"):
        DeepRows([1, 1], torch.zeros(2, 4))
    with pytest.raises(ValueError, match="one width"):
        DeepRows.of({1: torch.zeros(4), 2: torch.zeros(5)})
