"""Bar charts of estimates with their intervals: one bar per category and series, a
whisker from each interval's low to its high end. An estimate without an interval (NaN
ends, e.g. from a single unit) is drawn without a whisker, never with a made-up one.

``effect_control_chart`` puts an effect and its matched control on panels of their own,
each on its own scale: a control a million times smaller than the effect would be an
invisible bar on the effect's axis, so its panel also writes each value in its label."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sinkscope.infra.errors import InputError
from sinkscope.reports.formatting import format_cell, sig
from sinkscope.reports.plots import LABEL_PT, PAGE_WIDTH_IN, TICK_PT, TITLE_PT, legend_below, save_figure

EFFECT_COLOUR, CONTROL_COLOUR = "#d9480f", "#5c7cfa"  # an effect and its matched control, told apart
WHISKER_COLOUR = "#1d2330"


@dataclass(frozen=True)
class IntervalSeries:
    """One series of estimates: ``values[k]`` with its interval ``lows[k]`` to ``highs[k]``
    (NaN ends: no interval) for category k; ``colour``: a matplotlib colour or None."""

    name: str
    values: Sequence[float]
    lows: Sequence[float]
    highs: Sequence[float]
    colour: str | None = None

    def check(self, n_categories: int) -> None:
        sizes = {len(self.values), len(self.lows), len(self.highs)}
        if sizes != {n_categories}:
            raise InputError(
                f"series {self.name!r} needs {n_categories} values, lows and highs, "
                f"got {len(self.values)}, {len(self.lows)} and {len(self.highs)}"
            )


def whisker_lengths(series: IntervalSeries) -> np.ndarray:
    """``[2, n]`` distances below and above each value to its interval's ends (NaN: none)."""
    values = np.asarray(series.values, dtype=float)
    lows, highs = np.asarray(series.lows, dtype=float), np.asarray(series.highs, dtype=float)
    return np.stack([values - lows, highs - values]).clip(min=0.0)


def draw_interval_bars(
    ax: Axes,
    categories: Sequence[str],
    series: Sequence[IntervalSeries],
    width_in: float = PAGE_WIDTH_IN,
    log: bool = False,
) -> None:
    """Grouped bars with whiskers on ``ax`` (``width_in`` inches wide): one group per
    category, one bar per series. With ``log`` a value <= 0 gets no bar and a whisker end
    <= 0 runs to the axis' bottom (a log axis cannot show either)."""
    width = 0.8 / max(len(series), 1)
    positions = np.arange(len(categories))
    for index, one in enumerate(series):
        one.check(len(categories))
        heights = np.asarray(one.values, dtype=float)
        lengths = whisker_lengths(one)
        if log:
            heights = np.where(heights > 0, heights, np.nan)
            lengths[0] = np.minimum(lengths[0], heights * (1 - 1e-3))
        ax.bar(
            positions + (index - (len(series) - 1) / 2) * width,
            heights,
            width,
            yerr=lengths,
            capsize=3,
            error_kw={"elinewidth": 1.6, "capthick": 1.6, "ecolor": WHISKER_COLOUR, "gid": "whisker"},
            label=one.name,
            color=one.colour,
        )
    if log:
        ax.set_yscale("log")
    else:
        ax.axhline(0.0, color="#5b6473", linewidth=0.8)
        ends = [v for one in series for v in (*one.values, *one.lows) if not math.isnan(v)]
        if all(v >= 0 for v in ends):
            # all-zero or positive bars and whiskers: the axis starts at 0, never below
            ax.set_ylim(bottom=0.0, top=None if ax.get_ylim()[1] > 0 else 1.0)
    slot = (width_in - 1.0) / max(len(categories), 1)  # inches per category
    crowded = max((len(name) for name in categories), default=0) * TICK_PT * 0.6 / 72 > 0.9 * slot
    ax.set_xticks(positions, list(categories), rotation=30 if crowded else 0, ha="right" if crowded else "center")
    ax.tick_params(labelsize=TICK_PT)
    ax.grid(axis="y", alpha=0.3)


def interval_bar_chart(
    categories: Sequence[str],
    series: Sequence[IntervalSeries],
    path: str | os.PathLike,
    title: str,
    ylabel: str,
    log: bool = False,
) -> Figure:
    """Grouped bars with interval whiskers, one panel (e.g. a default-state test's errors,
    on a ``log`` axis when they grow by orders of magnitude)."""
    fig = Figure(
        figsize=(min(PAGE_WIDTH_IN, max(4.6, 0.35 * len(categories) * len(series) + 2.5)), 3.8),
        layout="constrained",
    )
    ax = fig.subplots()
    draw_interval_bars(ax, categories, series, fig.get_figwidth(), log)
    ax.set_ylabel(ylabel, fontsize=LABEL_PT)
    ax.set_title(title, fontsize=TITLE_PT)
    if len(series) > 1:
        legend_below(fig, ax, len(series))
    return save_figure(fig, path)


def effect_control_chart(
    categories: Sequence[str],
    effect: IntervalSeries,
    control: IntervalSeries,
    path: str | os.PathLike,
    title: str,
    ylabel: str,
) -> Figure:
    """The effect (left) and its matched control (right), each bar with its whisker, each
    panel on its own scale; the control's panel writes every value in its category's label
    and its largest size in its title, so a control too small to see is still read."""
    fig = Figure(figsize=(PAGE_WIDTH_IN, 4.0), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[3, 2])
    draw_interval_bars(left, categories, [effect], PAGE_WIDTH_IN * 0.6)
    left.set_ylabel(ylabel, fontsize=LABEL_PT)
    left.set_title(effect.name, fontsize=LABEL_PT)
    draw_interval_bars(right, categories, [control], PAGE_WIDTH_IN * 0.4)
    values = np.asarray(control.values, dtype=float)
    largest = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else float("nan")
    right.set_title(f"{control.name} (own scale; |value| at most {sig(largest)})", fontsize=LABEL_PT)
    right.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    labels = [f"{name}: {format_cell(float(value), '+.2g')}" for name, value in zip(categories, values)]
    right.set_xticks(range(len(categories)), labels, rotation=30 if len(categories) > 2 else 0, ha="right")
    fig.suptitle(title, fontsize=TITLE_PT)
    return save_figure(fig, path)
