"""Curves with intervals: one line per series over numeric x, each measured point with its
interval as an error bar. Only measured points are drawn (NaN means are left out, never
joined across), and a point without an interval (fewer than two units) has no bar."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure

from sinkscope.infra.errors import InputError
from sinkscope.reports.plots import LABEL_PT, TICK_PT, TITLE_PT, legend_below, save_figure


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
