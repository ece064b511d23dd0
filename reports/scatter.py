"""Scatter panels that set one group of points apart from the rest (e.g. sink heads from the
other heads): side-by-side panels, marked points drawn over the others, one legend below.
Written like every figure (``plots.save_figure``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from sinkscope.reports.plots import LABEL_PT, PAGE_WIDTH_IN, TICK_PT, TITLE_PT, legend_below, save_figure

MARKED_COLOUR, OTHER_COLOUR = "#d62728", "#7f7f7f"


@dataclass(frozen=True)
class ScatterPanel:
    """One panel: ``x``/``y`` per point, ``marked`` per point; ``diagonal`` draws y = x,
    ``log`` puts both axes on a log scale (points <= 0 left out, as a log axis cannot show
    them); ``reference`` draws dotted lines at that x and y (e.g. a ratio of 1)."""

    title: str
    xlabel: str
    ylabel: str
    x: Sequence[float]
    y: Sequence[float]
    marked: Sequence[bool]
    diagonal: bool = False
    log: bool = False
    reference: float | None = None


def _plain_log_axis(ax, axis, values: np.ndarray) -> None:
    """A log axis labelled in plain numbers (0.8, 1, 10); within one decade the minor ticks
    are labelled too, or the axis would show one label or none."""
    (ax.set_xscale if axis is ax.xaxis else ax.set_yscale)("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    axis.set_major_formatter(plain)
    # minor ticks labelled at 2 and 5 only (0.2, 0.5, 2, 5): every one would overlap
    sparse = FuncFormatter(lambda value, _: f"{value:g}" if f"{value:.0e}"[0] in "25" else "")
    narrow = len(values) > 0 and values.max() / values.min() < 30
    axis.set_minor_formatter(sparse if narrow else NullFormatter())


def _draw(ax, panel: ScatterPanel, labels: tuple[str, str]) -> None:
    x, y = np.asarray(panel.x, dtype=float), np.asarray(panel.y, dtype=float)
    marked = np.asarray(panel.marked, dtype=bool)
    shown = np.isfinite(x) & np.isfinite(y) & ((x > 0) & (y > 0) if panel.log else True)
    for group, colour, label, size in ((~marked, OTHER_COLOUR, labels[1], 14), (marked, MARKED_COLOUR, labels[0], 26)):
        keep = shown & group
        ax.scatter(x[keep], y[keep], s=size, c=colour, alpha=0.75, label=f"{label} (n = {int(keep.sum())})")
    if panel.log:
        for axis, values in ((ax.xaxis, x[shown]), (ax.yaxis, y[shown])):
            _plain_log_axis(ax, axis, values)
    if panel.diagonal and shown.any():
        low = min(x[shown].min(), y[shown].min())
        high = max(x[shown].max(), y[shown].max())
        ax.plot([low, high], [low, high], color="black", linewidth=0.8, linestyle="--", label="y = x")
    if panel.reference is not None:
        ax.axhline(panel.reference, color="black", linewidth=0.6, linestyle=":")
        ax.axvline(panel.reference, color="black", linewidth=0.6, linestyle=":")
    ax.set_xlabel(panel.xlabel, fontsize=LABEL_PT)
    ax.set_ylabel(panel.ylabel, fontsize=LABEL_PT)
    ax.set_title(panel.title, fontsize=TITLE_PT)
    ax.tick_params(which="both", labelsize=TICK_PT)
    ax.grid(alpha=0.3)


def marked_scatter(
    panels: Sequence[ScatterPanel], path: str | os.PathLike, title: str, labels: tuple[str, str]
) -> Figure:
    """The ``panels`` side by side; ``labels``: (marked points, other points) in the legend."""
    fig = Figure(figsize=(min(PAGE_WIDTH_IN, 4.2 * len(panels) + 0.6), 4.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    for ax, panel in zip(axes, panels):
        _draw(ax, panel, labels)
    fig.suptitle(title, fontsize=TITLE_PT)
    legend_below(fig, axes[0], 3)
    return save_figure(fig, path)
