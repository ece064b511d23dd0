"""The reproduction's time estimate comes from the error's trend, never from the step cap."""

from __future__ import annotations

import math

import pytest

from sinkscope.toy.progress import RunLine, estimate_steps_left


def _decaying(start: float, rate: float, steps: range) -> list[tuple[int, float]]:
    """An error that falls by a factor e every ``1 / rate`` steps."""
    return [(step, start * math.exp(-rate * step)) for step in steps]


def test_an_exponentially_falling_error_is_extrapolated_to_the_threshold():
    history = _decaying(1.0, 1e-3, range(0, 2001, 100))  # at step 2000 the error is e^-2
    left = estimate_steps_left(history, stop_linf=math.exp(-5))
    assert left == pytest.approx(3000, rel=1e-6)  # e^-2 -> e^-5 at one e-fold per 1,000 steps


def test_the_trend_uses_the_later_half_so_an_early_rise_does_not_hide_it():
    rising = [(step, 0.5 + step / 1000) for step in range(0, 1000, 100)]  # 0.5 -> 1.4, as models start
    falling = [(step, 1.4 * math.exp(-2e-3 * (step - 1000))) for step in range(1000, 3001, 100)]
    left = estimate_steps_left(rising + falling, stop_linf=1.4 * math.exp(-2e-3 * 4000))
    assert left == pytest.approx(2000, rel=1e-6)


def test_no_estimate_while_the_error_is_flat_rising_or_barely_logged():
    flat = [(step, 0.3) for step in range(0, 1001, 100)]
    rising = [(step, 0.1 + step / 1e4) for step in range(0, 1001, 100)]
    assert estimate_steps_left(flat, 5e-3) is None
    assert estimate_steps_left(rising, 5e-3) is None
    assert estimate_steps_left([(0, 1.0), (100, 0.5)], 5e-3) is None
    assert estimate_steps_left([], 5e-3) is None


def test_no_estimate_from_an_early_slow_trend_far_from_the_threshold():
    # 0.9 -> 0.8 over steps 400-800 says 0.005 in ~17,000 steps: a guess, not shown
    slow = [(step, 0.9 * math.exp(-3e-4 * (step - 400))) for step in range(0, 801, 100)]
    assert estimate_steps_left(slow, 5e-3) is None
    assert estimate_steps_left(slow, 0.7) is not None  # near enough to the data to extrapolate


def test_a_trend_already_below_the_threshold_needs_no_more_steps():
    history = _decaying(1.0, 1e-2, range(0, 1001, 100))
    assert estimate_steps_left(history, stop_linf=0.5) == 0.0


def test_noise_around_a_trend_still_gives_its_slope():
    wobble = [1.3, 0.8, 1.1, 0.9]  # a batch error that jumps around its trend
    history = [(step, math.exp(-1e-3 * step) * wobble[i % 4]) for i, step in enumerate(range(0, 4001, 100))]
    left = estimate_steps_left(history, stop_linf=math.exp(-8))
    assert 3000 < left < 5000  # the clean trend says 4,000


def test_the_line_shows_the_estimate_in_time_and_no_bound_from_the_cap():
    line = RunLine("softmax-2x2-seed0", 2_000, 50_000, 0.05, 5e-3, 100.0, 3_000).text()
    assert line.endswith("100 steps/s, about 30s more by the error's trend")
    assert "at most" not in line and "1h" not in line  # 48,000 steps to the cap would read 8m00s
    capped = RunLine("relu-1x1-seed0", 45_000, 50_000, 0.05, 5e-3, 100.0, 9_000).text()  # cap at 5,000 more
    assert "reaches the 50,000-step cap first, in about 50s" in capped
