"""Sinks over training: a suite over revisions of one model drawn against the training step.

One row of three panels per model whose checkpoints all have a step
(``training_steps``): the sink rate per threshold, the number of sink heads, and the
anchor mass of every layer (mean over its heads), one line per layer coloured by depth.
Every point is one audited checkpoint; lines join a model's checkpoints in step order
and nothing is drawn between them that was not measured. The step axis is logarithmic
where the steps span two decades or more (step 0, where present, sits on a linear
stretch at the start: a symmetric-log axis).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from sinkscope.pretrained_analysis.compare_figures import LINE_STYLES, MARKERS
from sinkscope.pretrained_analysis.examples import plot_text
from sinkscope.probes.tables import SINK_RATE_NAME
from sinkscope.reports.plots import LABEL_PT, PAGE_WIDTH_IN, TICK_PT, TITLE_PT, save_figure
from sinkscope.reports.step_axis import STEP_AXIS, set_step_scale

if TYPE_CHECKING:
    from sinkscope.pretrained_analysis.compare import Comparison, ComparisonRow

FEW_LAYERS = 8  # up to this many layer lines get a legend; more, a colour bar


def _style(ax: Axes, title: str, ylabel: str, steps: Sequence[int]) -> None:
    set_step_scale(ax, steps)
    ax.set_title(title, fontsize=TITLE_PT)
    ax.set_xlabel(STEP_AXIS, fontsize=LABEL_PT)
    ax.set_ylabel(ylabel, fontsize=LABEL_PT)
    ax.tick_params(labelsize=TICK_PT)
    ax.grid(alpha=0.3)


def _sink_rate_panel(ax: Axes, rows: Sequence[ComparisonRow], steps: list[int]) -> None:
    for k, eps in enumerate(rows[0].sink_rate):
        ax.plot(
            steps,
            [row.sink_rate[eps] for row in rows],
            marker=MARKERS[k % len(MARKERS)],
            markersize=4,
            linestyle=LINE_STYLES[k % len(LINE_STYLES)],
            color=f"C{k % 10}",
            label=f"ε = {eps}",
        )
    ax.set_ylim(-2.0, 102.0)  # a rate of 0 is a whole marker
    ax.legend(fontsize=TICK_PT, loc="best")
    _style(ax, f"sink rate ({SINK_RATE_NAME})", "% of (prompt, layer, head)", steps)


def _sink_heads_panel(ax: Axes, rows: Sequence[ComparisonRow], steps: list[int]) -> None:
    ax.plot(steps, [row.n_sink_heads for row in rows], marker="o", markersize=4, color="C3")
    ax.set_ylim(-0.5, max(1, *(row.n_sink_heads for row in rows)) + 0.5)  # all zeros: still a readable axis
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # a count of heads
    _style(ax, f"sink heads (of {rows[0].n_layers * rows[0].n_heads})", "sink heads", steps)


def _layer_panel(fig: Figure, ax: Axes, rows: Sequence[ComparisonRow], steps: list[int]) -> None:
    """One line per layer coloured by depth: a legend for a few layers, a colour bar for many."""
    n_layers = rows[0].n_layers
    colours, norm = colormaps["viridis"], Normalize(vmin=0, vmax=max(1, n_layers - 1))
    for layer in range(n_layers):
        ax.plot(
            steps,
            [row.layer_anchor_mass[layer] for row in rows],
            marker=".",
            markersize=4,
            linewidth=0.9,
            color=colours(norm(layer)),
            label=f"layer {layer}",
        )
    ax.set_ylim(-0.02, 1.02)
    _style(ax, "anchor mass per layer (mean over heads)", "anchor mass", steps)
    if n_layers <= FEW_LAYERS:
        ax.legend(fontsize=TICK_PT, loc="best")
        return
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=colours), ax=ax, pad=0.02)
    bar.set_label("layer", fontsize=LABEL_PT)
    bar.ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    bar.ax.tick_params(labelsize=TICK_PT)


def trajectory_figure(comparison: Comparison, path: str | os.PathLike) -> Figure:
    """One row of three panels per model with a trajectory (``Comparison.trajectories``)."""
    trajectories = comparison.trajectories()
    fig = Figure(figsize=(PAGE_WIDTH_IN, 3.4 * len(trajectories)), layout="constrained")
    axes = fig.subplots(len(trajectories), 3, squeeze=False)
    for (model, rows), (rate_ax, heads_ax, layer_ax) in zip(trajectories, axes, strict=True):
        steps = [int(row.step) for row in rows if row.step is not None]
        _sink_rate_panel(rate_ax, rows, steps)
        _sink_heads_panel(heads_ax, rows, steps)
        _layer_panel(fig, layer_ax, rows, steps)
        if len(trajectories) > 1:
            rate_ax.set_title(f"{plot_text(model)}: {rate_ax.get_title()}", fontsize=TITLE_PT)
    return save_figure(fig, path)


def trajectory_caption(comparison: Comparison) -> str:
    parts = [
        f"{model}: {len(rows)} checkpoints, steps {rows[0].step:,} to {rows[-1].step:,}"
        for model, rows in comparison.trajectories()
    ]
    return (
        "sinks over training, one point per audited checkpoint at its training step, lines in step order ("
        + "; ".join(parts)
        + "); sink rate over every (prompt, layer, head) entry and anchor mass over every query of every prompt, "
        "as in each audit; no interval recorded"
    )
