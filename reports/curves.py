"""Curves of measured points against a numeric axis, two kinds:

- with intervals (``interval_curves``): one line per series, each measured point with its
  interval as an error bar; only measured points are drawn (NaN means are left out, never
  joined across), and a point without an interval (fewer than two units) has no bar;
- over positions (``position_curves``): one line per series on a log-scaled position axis
  (the first positions and the far ones side by side), with a log-scaled value axis when
  the values span more than a factor of ten (the streaming window test).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure

from sinkscope.infra.errors import InputError
from sinkscope.reports.plots import LABEL_PT, PAGE_WIDTH_IN, TICK_PT, TITLE_PT, legend_below, save_figure

LOG_VALUES_RATIO = 10.0  # values spanning more than this share a log axis


@dataclass(frozen=True)
class CurveSeries:
    """One line: ``name``, and per x its mean and interval ends (NaN: not measured / no interval)."""

    name: str
    x: tuple[float, ...]
    mean: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]


def _draw(ax, series: CurveSeries) -> None:
    x, mean = np.asarray(series.x, dtype=float), np.asarray(series.mean, dtype=float)
    low, high = np.asarray(series.low, dtype=float), np.asarray(series.high, dtype=float)
    measured = np.isfinite(mean)
    if series.x and not (len(series.mean) == len(series.low) == len(series.high) == len(series.x)):
        raise InputError(f"series {series.name!r} has unequal x, mean and interval lengths")
    line = ax.plot(x[measured], mean[measured], marker="o", markersize=3, label=series.name)[0]
    bars = measured & np.isfinite(low) & np.isfinite(high)
    if bars.any():
        errors = np.vstack([mean[bars] - low[bars], high[bars] - mean[bars]])
        ax.errorbar(x[bars], mean[bars], yerr=errors, fmt="none", ecolor=line.get_color(), capsize=3)


def interval_curves(
    series: Sequence[CurveSeries],
    path: str | os.PathLike,
    title: str,
    xlabel: str,
    ylabel: str,
    ylim: tuple[float, float] | None = None,
    log_x: bool = False,
) -> Figure:
    """One line with markers and error bars per series, each point at the x it was measured
    at (series that agree overlap); ``log_x``: a base-2 x axis labelled at the measured x."""
    fig = Figure(figsize=(5.6, 3.6), layout="constrained")
    ax = fig.subplots()
    for item in series:
        _draw(ax, item)
    if log_x:
        ax.set_xscale("log", base=2)
        ticks = sorted({x for item in series for x, mean in zip(item.x, item.mean) if np.isfinite(mean)})
        ax.set_xticks(ticks, [f"{value:g}" for value in ticks])
        ax.minorticks_off()
    ax.set_xlabel(xlabel, fontsize=LABEL_PT)
    ax.set_ylabel(ylabel, fontsize=LABEL_PT)
    ax.tick_params(labelsize=TICK_PT)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=TITLE_PT)
    if len(series) > 1:
        legend_below(fig, ax, len(series))
    return save_figure(fig, path)


def running_mean(values: Sequence[float], width: int) -> list[float]:
    """The mean of each value and the ``width - 1`` before it (fewer at the start), so every
    point is an average of measured values only."""
    array = np.asarray(values, dtype=float)
    if width <= 1:
        return array.tolist()
    total = np.cumsum(np.insert(array, 0, 0.0))
    ends = np.arange(1, len(array) + 1)
    starts = np.maximum(ends - width, 0)
    return ((total[ends] - total[starts]) / (ends - starts)).tolist()


Series = tuple[str, Sequence[float], str, str]  # (name, values, colour, line style)


def position_curves(
    panels: Sequence[tuple[str, Sequence[Series]]],
    path: str | os.PathLike,
    title: str,
    ylabel: str,
    marker_at: int | None = None,
    marker_label: str = "",
) -> Figure:
    """One panel per ``(panel title, series)``, side by side on a shared value axis; in each,
    one line per series, value k at position k + 1, the first one drawn on top as the
    reference. The panels share their series'
    names, so one legend under them names every line. ``marker_at``: a dotted vertical line
    at that position, named ``marker_label``."""
    if not panels or not all(values for _, series in panels for _, values, _, _ in series):
        raise InputError("a position curve needs at least one panel of series with values")
    fig = Figure(figsize=(min(PAGE_WIDTH_IN, max(7.5, 1.0 + 3.6 * len(panels))), 4.6), layout="constrained")
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    every = np.concatenate([np.asarray(v, dtype=float) for _, series in panels for _, v, _, _ in series])
    every = every[np.isfinite(every) & (every > 0)]
    log_values = bool(every.size) and every.max() / every.min() > LOG_VALUES_RATIO
    for ax, (panel_title, series) in zip(axes, panels, strict=True):
        for index, (name, values, colour, style) in enumerate(series):
            # the first series is the reference (full attention): drawn wider and on top, so
            # a setting that matches it does not hide it
            wide = {"linewidth": 1.8, "zorder": 3, "alpha": 0.8} if index == 0 else {"linewidth": 1.1}
            ax.plot(np.arange(1, len(values) + 1), values, label=name, color=colour, linestyle=style, **wide)
        if marker_at is not None and marker_at > 0:
            ax.axvline(marker_at + 1, color="#777777", linestyle=":", linewidth=1.0, label=marker_label or None)
        # a linear position axis: on a log one the few positions before the marker, where
        # every setting still sees every key, took most of the width from the scored ones
        ax.set_xlim(1, max(len(values) for _, values, _, _ in series))
        if log_values:
            ax.set_yscale("log")
        ax.set_title(panel_title, fontsize=LABEL_PT)
        ax.set_xlabel("position in the chunk", fontsize=LABEL_PT)
        ax.tick_params(labelsize=TICK_PT)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel(ylabel, fontsize=LABEL_PT)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(labels)), fontsize=TICK_PT, frameon=False)
    fig.suptitle(title, fontsize=TITLE_PT)
    return save_figure(fig, path)
