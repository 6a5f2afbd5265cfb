"""The step-time model (omnistream/service/step_model.py): a stage's step time as a line in its
units, fitted to live steps and seeded by the warm-up probe, so a stage that ran small batches
still knows its large ones."""

from __future__ import annotations

import pytest

from omnistream.service.step_model import StepTimeModel, fit_line


def talker_step(rows: int) -> float:
    """A batched step: 15 ms of its own plus 2.5 ms a row (the tiny talker on this machine, roughly)."""
    return 0.015 + 0.0025 * rows


def test_fit_line_recovers_a_line_and_stays_physical():
    assert fit_line([(u, talker_step(u), 1.0) for u in (1, 4, 16)]) == pytest.approx((0.015, 0.0025))
    # One size only: through the origin (no sharing assumed), the cautious reading.
    assert fit_line([(4, 0.04, 3.0)]) == pytest.approx((0.0, 0.01))
    # Larger steps measured faster (noise): no sharing assumed, at the costliest unit measured.
    assert fit_line([(1, 0.03, 1.0), (8, 0.01, 1.0)]) == pytest.approx((0.0, 0.03))
    assert fit_line([]) == (0.0, 0.0)


def test_a_stage_that_ran_small_batches_only_still_reports_the_capacity_of_larger_ones():
    model = StepTimeModel()
    for rows in (1, 4, 16):  # the warm-up probe
        for _ in range(5):
            model.observe(rows, rows, talker_step(rows))
    model.seed_from_live()
    for _ in range(50):  # serving: only batches of 1 and 2, each twice as slow as the probe
        model.observe(1, 1, 2 * talker_step(1))
        model.observe(2, 2, 2 * talker_step(2))
    fit = model.fit()
    assert fit.slowdown == pytest.approx(2.0)
    assert fit.step_seconds(16) == pytest.approx(2 * talker_step(16), rel=0.02)
    # Each of 16 streams gets 1 / t(16) frames a second; the speed measured at batch 2, assumed to
    # fall as 1 / n beyond it (what admission did before), would have said 2 / (16 t(2)).
    assert fit.row_rate(16) == pytest.approx(1 / (2 * talker_step(16)), rel=0.02)
    held_down = 2 / (16 * 2 * talker_step(2))
    assert fit.row_rate(16) > 2.5 * held_down


def test_without_a_seed_the_live_line_extrapolates():
    model = StepTimeModel()
    for rows in (2, 4, 8):
        model.observe(rows, rows, talker_step(rows))
    fit = model.fit()
    assert (fit.base_seconds, fit.unit_seconds) == pytest.approx((0.015, 0.0025))
    assert fit.slowdown == 1.0 and fit.points == 3


def test_outliers_do_not_move_a_size_and_steps_without_units_are_not_counted():
    model = StepTimeModel()
    for _ in range(9):
        model.observe(4, 4, talker_step(4))
    model.observe(4, 4, 1.0)  # one step that ran late
    model.observe(0, 0, 0.5)  # nothing produced
    model.observe(8, 8, talker_step(8))
    fit = model.fit()
    assert fit.step_seconds(4) == pytest.approx(talker_step(4))
    assert fit.points == 2


def test_units_per_row_comes_from_the_live_steps_else_the_seed():
    model = StepTimeModel()
    model.observe(50, 2, 0.07)  # two 25-frame Code2Wav windows
    model.seed_from_live()
    assert model.seeded and model.fit().units_per_row == 25
    model.observe(8, 2, 0.012)  # two 4-frame first windows
    assert model.fit().units_per_row == 4


def test_nothing_observed_is_no_model():
    assert StepTimeModel().fit() is None


def test_slow_steps_age_out_so_a_past_wave_does_not_hold_the_stage_down():
    """Steps slowed by a wave sharing the cores count for LIVE_MAX_AGE_S only: after it, the
    stage's sizes that were not seen again fall back to the seed's line at today's level."""
    now = [0.0]
    model = StepTimeModel(max_age=30.0, clock=lambda: now[0])
    for rows in (1, 4, 16):
        model.observe(rows, rows, talker_step(rows))
    model.seed_from_live()
    for rows in range(5, 17):  # a wave: every size 5-16, each step five times slower than the probe
        model.observe(rows, rows, 5 * talker_step(rows))
    assert model.fit().slowdown == pytest.approx(5.0)
    now[0] = 31.0  # quiet since: the last level known still counts
    assert model.fit().slowdown == pytest.approx(5.0)
    # then batches of 1 and 2 at the probe's speed
    for _ in range(10):
        model.observe(1, 1, talker_step(1))
        model.observe(2, 2, talker_step(2))
    fit = model.fit()
    assert fit.slowdown == pytest.approx(1.0)
    assert fit.step_seconds(16) == pytest.approx(talker_step(16), rel=0.02)
