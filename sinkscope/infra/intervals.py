"""The one rule for percentile-bootstrap intervals over units (prompts, inputs, heads, runs,
models): from fewer than ``MIN_INTERVAL_UNITS`` units none is given.

A percentile bootstrap of n units can only return means of n-unit resamples. From 2 units
there are 3 distinct resample means, and the 95% interval is the range of the two values;
from 3 or 4 it is still little more than the range. Such an interval reads as an estimate
of uncertainty while it is a list of the values, so below 5 units every producer returns
NaN ends and every report writes "n = 3, no interval" beside the mean (or the values
themselves). docs/metrics.md states the rule."""

from __future__ import annotations

CONFIDENCE = 0.95
MIN_INTERVAL_UNITS = 5


def interval_possible(n_units: int) -> bool:
    """Whether ``n_units`` are enough for a bootstrap interval under the rule above."""
    return n_units >= MIN_INTERVAL_UNITS
