"""The comparison's two figures, drawn from measured values only.

Sink rate: unrelated models are categories on an axis titled "model", drawn as separate
markers (a line between two models would claim a path between them that nothing
measured). Revisions of one model (a training-checkpoint suite) are joined by one line per
model over its checkpoints, in the order given.

Anchor mass per layer: every audit at its own measured layers, one marker per layer: at the
layer index when every model has the same depth, else at relative depth
(layer + 0.5) / n_layers, each layer at the middle of its share of the depth. A model's
markers are joined only to each other, never interpolated onto another model's layers.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sinkscope.pretrained_analysis.examples import plot_text
from sinkscope.probes.tables import SINK_RATE_NAME
from sinkscope.reports.plots import LABEL_PT, PAGE_WIDTH_IN, TICK_PT, TITLE_PT, legend_below, save_figure

if TYPE_CHECKING:
    from sinkscope.pretrained_analysis.compare import Comparison, ComparisonRow

MARKERS = ("o", "s", "^", "D", "v", "P")  # one per sink-rate threshold
LINE_STYLES = ("-", "--", ":", "-.")  # one per threshold: a model's lines share its colour
DEFAULT_REVISION = "(default)"  # a row audited without a revision: the model's default branch
MODEL_AXIS, CHECKPOINT_AXIS = "model", "checkpoint (revision)"


def is_checkpoint_series(rows: Sequence[ComparisonRow]) -> bool:
    """Two or more audits of one model at distinct revisions: training checkpoints."""
    return len(rows) > 1 and len({revision_label(row) for row in rows}) == len(rows)


def revision_label(row: ComparisonRow) -> str:
    return row.revision if row.revision is not None else DEFAULT_REVISION


def model_label(row: ComparisonRow) -> str:
    """The row's label without its ``@revision``: the name of the model a checkpoint belongs to."""
    suffix = f"@{row.revision}" if row.revision else ""
    return row.label.removesuffix(suffix) if suffix and row.label.endswith(suffix) else row.label


def _figure(n_positions: int) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(min(PAGE_WIDTH_IN, max(4.6, 0.55 * n_positions + 2.5)), 3.8), layout="constrained")
    return fig, fig.subplots()


def _finish(fig: Figure, ax: Axes, title: str, xlabel: str, ylabel: str, n_series: int) -> None:
    ax.set_xlabel(xlabel, fontsize=LABEL_PT)
    ax.set_ylabel(ylabel, fontsize=LABEL_PT)
    ax.set_title(title, fontsize=TITLE_PT)
    ax.tick_params(labelsize=TICK_PT)
    ax.grid(alpha=0.3)
    if n_series > 1:
        legend_below(fig, ax, n_series)


def _category_ticks(fig: Figure, ax: Axes, names: Sequence[str]) -> None:
    crowded = sum(len(name) + 2 for name in names) * TICK_PT * 0.6 / 72 > fig.get_figwidth() - 1.5
    ax.set_xticks(range(len(names)), list(names), rotation=30 if crowded else 0, ha="right" if crowded else "center")
    ax.set_xlim(-0.6, len(names) - 0.4)


def _checkpoint_markers(ax: Axes, comparison: Comparison) -> tuple[list[str], int]:
    """One line per model through its checkpoints (a model with one audit: markers only);
    returns the checkpoint categories and the number of legend entries."""
    groups = comparison.model_groups()
    categories = list(dict.fromkeys(revision_label(row) for _, rows in groups for row in rows))
    for index, (model, rows) in enumerate(groups):
        for k, eps in enumerate(comparison.epsilons()):
            ax.plot(
                [categories.index(revision_label(row)) for row in rows],
                [row.sink_rate[eps] for row in rows],
                marker=MARKERS[k % len(MARKERS)],
                markersize=5,
                linestyle=LINE_STYLES[k % len(LINE_STYLES)] if is_checkpoint_series(rows) else "none",
                color=f"C{index % 10}",
                label=f"{plot_text(model)}, ε = {eps}" if len(groups) > 1 else f"ε = {eps}",
            )
    return categories, len(groups) * len(comparison.epsilons())


def _model_markers(ax: Axes, comparison: Comparison) -> tuple[list[str], int]:
    """Unrelated models: separate markers, side by side per threshold, no line."""
    epsilons, rows = comparison.epsilons(), comparison.rows
    for k, eps in enumerate(epsilons):
        ax.plot(
            np.arange(len(rows)) + (k - (len(epsilons) - 1) / 2) * 0.12,
            [row.sink_rate[eps] for row in rows],
            marker=MARKERS[k % len(MARKERS)],
            markersize=5,
            linestyle="none",
            color=f"C{k % 10}",
            label=f"ε = {eps}",
        )
    return [plot_text(row.label) for row in rows], len(epsilons)


def sink_rate_figure(comparison: Comparison, path: str | os.PathLike) -> Figure:
    """Sink rate per sink-rate threshold: markers per model, or one line per model over its
    checkpoints when the comparison holds revisions of one model."""
    checkpoints = comparison.has_checkpoints()
    n_positions = len({revision_label(row) for row in comparison.rows}) if checkpoints else len(comparison.rows)
    fig, ax = _figure(n_positions)
    categories, n_series = (_checkpoint_markers if checkpoints else _model_markers)(ax, comparison)
    _category_ticks(fig, ax, categories)
    ax.set_ylim(-2.0, 102.0)  # a rate of 0 is a whole marker, not half hidden by the axis
    title = (
        f"sink rate over checkpoints (Gu et al. {SINK_RATE_NAME})"
        if checkpoints
        else f"sink rate (Gu et al. {SINK_RATE_NAME})"
    )
    _finish(fig, ax, title, CHECKPOINT_AXIS if checkpoints else MODEL_AXIS, "% of (prompt, layer, head)", n_series)
    return save_figure(fig, path)


def layer_positions(row: ComparisonRow, same_depth: bool) -> list[float]:
    """Where each of the row's measured layers is drawn: its index, or its relative depth."""
    return [float(layer) if same_depth else (layer + 0.5) / row.n_layers for layer in range(row.n_layers)]


def layer_figure(comparison: Comparison, path: str | os.PathLike) -> Figure:
    """Anchor mass per layer (mean over heads), every audit at its own layers only."""
    rows = comparison.rows
    same_depth = len({row.n_layers for row in rows}) == 1
    fig, ax = _figure(max(row.n_layers for row in rows) // 2)
    for index, row in enumerate(rows):
        name = plot_text(row.label) if same_depth else f"{plot_text(row.label)} ({row.n_layers} layers)"
        ax.plot(
            layer_positions(row, same_depth),
            list(row.layer_anchor_mass),
            marker=MARKERS[index % len(MARKERS)],  # shapes tell apart models whose points coincide
            markersize=4,
            linewidth=0.8,
            label=name,
        )
    if same_depth:
        ax.set_xticks(range(rows[0].n_layers)[:: max(1, rows[0].n_layers // 15)])
    else:
        ax.set_xlim(0.0, 1.0)
    ax.set_ylim(-0.02, 1.02)  # a point at 0 is drawn whole
    xlabel = "layer" if same_depth else "relative depth: (layer + 0.5) / layers (one marker per measured layer)"
    _finish(fig, ax, "anchor mass per layer (mean over heads)", xlabel, "anchor mass", len(rows))
    return save_figure(fig, path)


def sink_rate_caption(comparison: Comparison) -> str:
    if comparison.has_checkpoints():
        return (
            f"sink rate per checkpoint (Gu et al. {SINK_RATE_NAME}, per sink-rate threshold ε); "
            "a line joins the checkpoints of one model"
        )
    return f"sink rate per model (Gu et al. {SINK_RATE_NAME}, per sink-rate threshold ε); separate models, no line between them"


def layer_caption(comparison: Comparison) -> str:
    """Says how many layers each model was measured at: one marker each, nothing interpolated."""
    counts = ", ".join(f"{row.label} {row.n_layers}" for row in comparison.rows)
    where = (
        "at its layer index"
        if len({row.n_layers for row in comparison.rows}) == 1
        else "at relative depth (layer + 0.5) / layers"
    )
    return f"anchor mass per layer (mean over heads), one marker per measured layer {where} ({counts} layers)"
