"""Figures shared by toy and pretrained reports. Every figure is written atomically as PNG
and returned as a matplotlib ``Figure`` (a notebook shows it). Figures are built with
matplotlib's object API, not pyplot: no global figure state, and the caller's backend
is left alone (importing sinkscope never switches a notebook to Agg)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from interp.atomic_io import atomic_path
from interp.errors import InputError


def save_figure(fig: Figure, path: str | os.PathLike, dpi: int = 110) -> Figure:
    """Write ``fig`` to ``path`` as PNG, atomically; returns it."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight")
    return fig


def attention_grid(
    patterns: np.ndarray,
    path: str | os.PathLike,
    title: str,
    tick_labels: Sequence[str] | None = None,
    vmax: float | None = None,
    cmap: str = "viridis",
    layer_labels: Sequence[int] | None = None,
    head_labels: Sequence[int] | None = None,
) -> Figure:
    """Heatmaps of attention for every layer and head, like the paper's figures.

    patterns: ``[layer, head, query, key]`` (e.g. the mean or std over test sequences).
    Rows are layers, columns heads; each cell shows query (y) against key (x).
    layer_labels / head_labels: the model's indices when ``patterns`` holds a subset.
    """
    if patterns.ndim != 4:
        raise InputError(f"expected patterns [layer, head, query, key], got shape {patterns.shape}")
    n_layers, n_heads, n_query, n_key = patterns.shape
    layer_labels = list(range(n_layers)) if layer_labels is None else list(layer_labels)
    head_labels = list(range(n_heads)) if head_labels is None else list(head_labels)
    if len(layer_labels) != n_layers or len(head_labels) != n_heads:
        raise InputError(f"need {n_layers} layer labels and {n_heads} head labels for patterns {patterns.shape}")
    size = 2.6
    fig = Figure(figsize=(size * n_heads + 1.2, size * n_layers + 0.6), layout="constrained")
    axes = fig.subplots(n_layers, n_heads, squeeze=False)
    top = float(np.nanmax(patterns)) if vmax is None else vmax
    image = None
    for layer in range(n_layers):
        for head in range(n_heads):
            ax = axes[layer][head]
            image = ax.imshow(patterns[layer, head], vmin=0.0, vmax=max(top, 1e-9), cmap=cmap)
            ax.set_title(f"L{layer_labels[layer]} H{head_labels[head]}", fontsize=9)
            if tick_labels is not None:
                step = max(1, len(tick_labels) // 8)
                ticks = list(range(0, n_key, step))
                ax.set_xticks(ticks, [tick_labels[t] for t in ticks], fontsize=6, rotation=90)
                ax.set_yticks(ticks, [tick_labels[t] for t in ticks], fontsize=6)
            else:
                ax.tick_params(labelsize=6)
            if layer == n_layers - 1:
                ax.set_xlabel("key", fontsize=7)
            if head == 0:
                ax.set_ylabel("query", fontsize=7)
    fig.suptitle(title, fontsize=10)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8)
    return save_figure(fig, path)


def layer_head_map(
    values: np.ndarray,
    path: str | os.PathLike,
    title: str,
    colorbar_label: str,
    vmin: float = 0.0,
    vmax: float = 1.0,
) -> Figure:
    """A layer x head heatmap ``values [layer, head]`` with each cell annotated."""
    return heatmap(values, path, title, colorbar_label, "head", "layer", vmin, vmax)


def heatmap(
    values: np.ndarray,
    path: str | os.PathLike,
    title: str,
    colorbar_label: str,
    xlabel: str,
    ylabel: str,
    vmin: float = 0.0,
    vmax: float = 1.0,
    cmap: str = "magma",
    x_tick_labels: Sequence[str] | None = None,
    y_tick_labels: Sequence[str] | None = None,
) -> Figure:
    """A ``[rows, columns]`` heatmap with integer ticks (or the given tick labels, one per
    column / row) and each cell annotated (up to 256 cells), e.g. layer x head, or layer
    x position for patching effects."""
    n_rows, n_columns = values.shape
    fig = Figure(figsize=(max(3.0, 0.5 * n_columns + 2), max(2.5, 0.4 * n_rows + 1.5)), layout="constrained")
    ax = fig.subplots()
    image = _draw_grid(ax, values, vmin, vmax, xlabel, ylabel, cmap)
    if x_tick_labels is not None:
        ax.set_xticks(range(n_columns), list(x_tick_labels))
    if y_tick_labels is not None:
        ax.set_yticks(range(n_rows), list(y_tick_labels))
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, label=colorbar_label)
    return save_figure(fig, path)


def layer_head_maps(
    panels: Sequence[tuple[str, np.ndarray]],
    path: str | os.PathLike,
    title: str,
    colorbar_label: str,
    vmin: float = 0.0,
    vmax: float = 1.0,
) -> Figure:
    """Several layer x head heatmaps side by side, one per ``(name, values [layer, head])``
    panel (e.g. one per model), on one color scale."""
    if not panels:
        raise InputError("layer_head_maps needs at least one panel")
    widths = [max(1.2, 0.45 * values.shape[1] + 0.6) for _, values in panels]
    height = max(2.2, 0.4 * max(values.shape[0] for _, values in panels) + 1.2)
    fig = Figure(figsize=(sum(widths) + 1.2, height), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False, gridspec_kw={"width_ratios": widths})
    image: Any = None
    for ax, (name, values) in zip(axes[0], panels):
        image = _draw_grid(ax, values, vmin, vmax, "head", "layer", "magma")
        ax.set_title(name, fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.colorbar(image, ax=axes[0].tolist(), label=colorbar_label, shrink=0.9)
    return save_figure(fig, path)


def _draw_grid(ax: Axes, values: np.ndarray, vmin: float, vmax: float, xlabel: str, ylabel: str, cmap: str):
    """Draw one ``[rows, columns]`` map on ``ax`` (cells annotated up to 256); returns the image."""
    n_rows, n_columns = values.shape
    image = ax.imshow(values, vmin=vmin, vmax=vmax, cmap=cmap, aspect="auto")
    if n_rows * n_columns <= 256:
        for row in range(n_rows):
            for column in range(n_columns):
                value = values[row, column]
                ax.text(
                    column,
                    row,
                    f"{value:.2f}",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="white" if value < (vmin + vmax) / 2 else "black",
                )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_xticks(range(n_columns))
    ax.set_yticks(range(n_rows))
    return image


def line_chart(
    x: Sequence[float] | Sequence[str],
    series: Sequence[tuple[str, Sequence[float]]],
    path: str | os.PathLike,
    title: str,
    xlabel: str,
    ylabel: str,
    ylim: tuple[float, float] | None = None,
) -> Figure:
    """One line with markers per ``(name, values)`` series over ``x`` (numbers or category names)."""
    fig = Figure(figsize=(max(4.5, 0.45 * len(x) + 2.5), 3.4), layout="constrained")
    ax = fig.subplots()
    for name, values in series:
        if len(values) != len(x):
            raise InputError(f"series {name!r} has {len(values)} values for {len(x)} x positions")
        ax.plot(list(x), list(values), marker="o", markersize=3, label=name)  # type: ignore[arg-type]
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    if x and isinstance(x[0], str):
        ax.tick_params(axis="x", labelrotation=45)
    elif all(isinstance(value, int) for value in x):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    if len(series) > 1:
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def bar_chart(
    categories: Sequence[str],
    series: Sequence[tuple[str, Sequence[float]]],
    path: str | os.PathLike,
    title: str,
    ylabel: str,
    log: bool = False,
) -> Figure:
    """Grouped bars: one group per category, one bar per ``(name, values)`` series.
    With ``log``, values <= 0 (or NaN) are left out, since a log axis cannot show them."""
    width = 0.8 / max(len(series), 1)
    fig = Figure(figsize=(max(4.5, 0.35 * len(categories) * len(series) + 2.5), 3.6), layout="constrained")
    ax = fig.subplots()
    positions = np.arange(len(categories))
    for index, (name, values) in enumerate(series):
        if len(values) != len(categories):
            raise InputError(f"series {name!r} has {len(values)} values for {len(categories)} categories")
        heights = np.asarray(values, dtype=float)
        if log:
            heights = np.where(heights > 0, heights, np.nan)
        ax.bar(positions + (index - (len(series) - 1) / 2) * width, heights, width, label=name)
    if log:
        ax.set_yscale("log")
    ax.set_xticks(
        positions,
        list(categories),
        rotation=30 if len(categories) > 4 else 0,
        ha="right" if len(categories) > 4 else "center",
    )
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(title, fontsize=10)
    if len(series) > 1:
        ax.legend(fontsize=7)
    return save_figure(fig, path)
