"""The markdown report (omnistream/bench/conversation/tables.py)."""

from __future__ import annotations

import pytest

from omnistream.bench.conversation.summary import check_targets, merge_turns, ratios
from omnistream.bench.conversation.tables import concurrent_table, report, turn_table
from tests.unit.bench.conversation.fake_runs import checkpoint_summary, turn_rows


def test_the_turn_table_shows_the_chosen_turns_and_the_last():
    on = merge_turns([turn_rows([float(t) for t in range(1, 13)])])
    off = merge_turns([turn_rows([2.0 * t for t in range(1, 13)], cached_share=0.0)])
    lines = turn_table(on, off).splitlines()
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["1", "2", "5", "10", "12"]
    assert lines[3].split("|")[2].strip() == "2.0" and lines[3].split("|")[3].strip() == "4.0"
    assert "90%" in lines[3] and "gateway" not in lines[0]  # REST turns: no gateway column
    spoken = merge_turns(
        [
            [
                {**row, "gateway_ttft_ms": row["ttft_ms"] / 2, "tokens_at_first_text": 2}
                for row in turn_rows([4.0, 6.0, 8.0])
            ],
            [
                {**row, "gateway_ttft_ms": row["ttft_ms"] / 2, "tokens_at_first_text": 1}
                for row in turn_rows([4.0, 6.0, 8.0])
            ],
            [
                {**row, "gateway_ttft_ms": row["ttft_ms"] / 2, "tokens_at_first_text": 1}
                for row in turn_rows([4.0, 6.0, 8.0])
            ],
        ]
    )
    lines = turn_table(spoken, off).splitlines()
    assert lines[0].endswith("gateway TTFT on ms | tokens at first text on |")
    assert lines[3].split("|")[-3].strip() == "3.0" and lines[3].split("|")[-2].strip() == "1"  # medians


def test_the_report_has_every_workload_and_every_target():
    summary = {"tiny": checkpoint_summary([30.0, 20.0, 22.0], [30.0, 25.0, 40.0])}
    targets = check_targets(summary)
    text = report(summary, targets)
    assert "### tiny: realtime, 3 turns" in text and "### tiny: rest, 3 turns" in text
    assert "TTFT turn 3 / turn 2: cache on 1.10x, off 1.60x" in text
    assert "### tiny: concurrent REST conversations" in text and "| on | 10 x 10 | 0 | 10.00 (10.00)" in text
    assert text.count("PASS") + text.count("FAIL") == len(targets) == 5
    assert "| off |" in concurrent_table(None, summary["tiny"]["off"]["concurrent"])
    named = ratios(summary)
    assert named["tiny rest cache off: TTFT turn 3 / turn 2"] == pytest.approx(1.6)
    assert named["tiny realtime cache on: cached share at turn 3"] == pytest.approx(0.9, abs=0.01)
    assert named["tiny concurrent: audio s/s cache on / off"] == 1.0
