"""Curves over positions: one line per series on a log-scaled position axis (the first
positions and the far ones side by side), with a log-scaled value axis when the values
span more than a factor of ten. Used by the streaming window test."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from sinkscope.infra.errors import InputError
from sinkscope.reports.plots import LABEL_PT, PAGE_WIDTH_IN, TICK_PT, TITLE_PT, legend_below, save_figure

LOG_VALUES_RATIO = 10.0  # values spanning more than this share a log axis


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


def position_curves(
    series: Sequence[tuple[str, Sequence[float], str, str]],
    path: str | os.PathLike,
    title: str,
    ylabel: str,
    marker_at: int | None = None,
    marker_label: str = "",
) -> Figure:
    """One line per ``(name, values, colour, linestyle)``, value k at position k + 1 (log x).
    ``marker_at``: a dotted vertical line at that position, named ``marker_label``."""
    if not series or not all(len(values) for _, values, _, _ in series):
        raise InputError("a position curve needs at least one series with values")
    fig = Figure(figsize=(min(PAGE_WIDTH_IN, 8.0), 4.4), layout="constrained")
    ax = fig.subplots()
    finite = np.concatenate([np.asarray(values, dtype=float) for _, values, _, _ in series])
    finite = finite[np.isfinite(finite) & (finite > 0)]
    for name, values, colour, style in series:
        ax.plot(np.arange(1, len(values) + 1), values, label=name, color=colour, linestyle=style, linewidth=1.2)
    ax.set_xscale("log")
    if finite.size and finite.max() / finite.min() > LOG_VALUES_RATIO:
        ax.set_yscale("log")
    if marker_at is not None and marker_at > 0:
        ax.axvline(marker_at + 1, color="#777777", linestyle=":", linewidth=1.0, label=marker_label or None)
    ax.set_xlabel("position in the chunk (log scale)", fontsize=LABEL_PT)
    ax.set_ylabel(ylabel, fontsize=LABEL_PT)
    ax.tick_params(labelsize=TICK_PT)
    ax.grid(alpha=0.3, which="both")
    ax.set_title(title, fontsize=TITLE_PT)
    legend_below(fig, ax, len(series) + (marker_at is not None))
    return save_figure(fig, path)
