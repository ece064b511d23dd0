"""Grouped bars with their confidence intervals as whiskers, for the probes' estimates
(e.g. the default-state test's error after each removal). A series is drawn with the
object API and saved with ``sinkscope.reports.plots.save_figure``, as every figure is."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sinkscope.infra.errors import InputError
from sinkscope.reports.plots import LABEL_PT, PAGE_WIDTH_IN, TICK_PT, TITLE_PT, legend_below, save_figure


@dataclass(frozen=True)
class IntervalSeries:
    """One bar per category: ``values`` and, where known, the interval ``(low, high)``
    around each (None: no interval, e.g. a single measurement, and no whisker)."""

    name: str
    values: Sequence[float]
    intervals: Sequence[tuple[float, float] | None]


def interval_bar_chart(
    categories: Sequence[str],
    series: Sequence[IntervalSeries],
    path: str | os.PathLike,
    title: str,
    ylabel: str,
    log: bool = False,
) -> Figure:
    """Grouped bars, one group per category, each bar with its interval as a whisker.
    With ``log``, values and whisker ends <= 0 are left out (a log axis cannot show
    them); without it, bars that are all >= 0 keep the axis from 0 up, so an all-zero
    chart has no negative axis."""
    width = 0.8 / max(len(series), 1)
    fig = Figure(
        figsize=(min(PAGE_WIDTH_IN, max(4.6, 0.35 * len(categories) * len(series) + 2.5)), 3.8),
        layout="constrained",
    )
    ax = fig.subplots()
    positions = np.arange(len(categories))
    for index, one in enumerate(series):
        if len(one.values) != len(categories) or len(one.intervals) != len(categories):
            raise InputError(f"series {one.name!r} needs one value and one interval per category")
        heights = np.asarray(one.values, dtype=float)
        if log:
            heights = np.where(heights > 0, heights, np.nan)
        x = positions + (index - (len(series) - 1) / 2) * width
        ax.bar(x, heights, width, label=one.name)
        _whiskers(ax, x, heights, one.intervals, log)
    if log:
        ax.set_yscale("log")
    elif all(v >= 0 for one in series for v in one.values if not math.isnan(v)):
        ax.set_ylim(bottom=0.0, top=None if ax.get_ylim()[1] > 0 else 1.0)
    crowded = sum(len(name) + 2 for name in categories) * TICK_PT * 0.6 / 72 > fig.get_figwidth() - 1.5
    ax.set_xticks(positions, list(categories), rotation=30 if crowded else 0, ha="right" if crowded else "center")
    ax.set_ylabel(ylabel, fontsize=LABEL_PT)
    ax.tick_params(labelsize=TICK_PT)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(title, fontsize=TITLE_PT)
    if len(series) > 1:
        legend_below(fig, ax, len(series))
    return save_figure(fig, path)


def _whiskers(
    ax: Axes, x: np.ndarray, heights: np.ndarray, intervals: Sequence[tuple[float, float] | None], log: bool
) -> None:
    """Each bar's interval as a dark whisker with caps (none for a bar without one)."""
    for position, height, interval in zip(x, heights, intervals):
        if interval is None or math.isnan(height):
            continue
        low, high = interval
        if log:  # a whisker end at or below 0 cannot be drawn: it runs to the axis' bottom
            low = low if low > 0 else height * 1e-3
            if high <= 0:
                continue
        ax.errorbar(
            position,
            height,
            yerr=[[max(height - low, 0.0)], [max(high - height, 0.0)]],
            fmt="none",
            ecolor="0.15",
            elinewidth=1.0,
            capsize=3,
        )
