"""Figures shared by toy and pretrained reports. Every figure is written atomically as PNG
and returned as a matplotlib ``Figure`` (a notebook shows it). Figures are built with
matplotlib's object API, not pyplot: no global figure state, and the caller's backend
is left alone (importing sinkscope never switches a notebook to Agg)."""

from __future__ import annotations

import io
import math
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from sinkscope.infra.atomic_io import atomic_path
from sinkscope.infra.errors import InputError
from sinkscope.reports.colour_scales import text_colour
from sinkscope.reports.document import HeadMaps
from sinkscope.reports.panels import block_starts, block_ticks, key_label, max_pooled
from sinkscope.reports.png_text import TEXT_PX_KEY, smallest_text_pt, with_text_chunk
from sinkscope.reports.titles import wrap_titles

DPI = 110
NOT_MEASURED_COLOUR = "#e6e6e6"  # a map cell with no value (a layer not probed)
# A report's column is 1130 px wide (reports/html.py); a figure drawn at most this wide is
# shown at its own size, so its text keeps the size it was drawn at.
PAGE_WIDTH_IN = 1100 / DPI
TITLE_PT, LABEL_PT, TICK_PT, SMALL_PT = 10, 9, 8, 7  # SMALL_PT: cell values, dense tick labels
MAX_GRID_COLUMNS = 6  # attention panels per row; more heads wrap onto further rows


def save_figure(fig: Figure, path: str | os.PathLike, dpi: int = DPI) -> Figure:
    """Write ``fig`` to ``path`` as PNG, atomically; returns it. The PNG records the size of
    its smallest text in pixels (``TEXT_PX_KEY``): a page can tell if it stays legible."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # a name in a script the fonts lack (CJK, emoji) draws as boxes; a warning per glyph says nothing more
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", category=UserWarning)
        wrap_titles(fig)
        fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    data = buffer.getvalue()
    smallest = smallest_text_pt(fig)  # after the draw: tick labels exist only once drawn
    if smallest is not None:
        data = with_text_chunk(data, TEXT_PX_KEY, f"{smallest * dpi / 72:.2f}")
    with atomic_path(path) as tmp:
        Path(tmp).write_bytes(data)
    return fig


def _tick_step(n: int, length_in: float, pitch: float = 1.6) -> int:
    """Every how many ticks to label so that labels of ``SMALL_PT`` (``pitch`` font sizes
    apart) do not touch along an axis ``length_in`` inches long."""
    fits = max(2, int(length_in * 72 / (SMALL_PT * pitch)))
    return max(1, math.ceil(n / fits))


TOKEN_PITCH = 1.25  # token labels, one line each side by side, need 1.25 font sizes apiece


def attention_grid(
    patterns: np.ndarray,
    path: str | os.PathLike,
    title: str,
    tick_labels: Sequence[str] | None = None,
    vmax: float | None = None,
    cmap: str = "viridis",
    layer_labels: Sequence[int] | None = None,
    head_labels: Sequence[int] | None = None,
    colorbar_label: str = "attention weight",
    titles: Sequence[Sequence[str]] | None = None,
) -> Figure:
    """Heatmaps of attention for every layer and head, like the paper's figures:
    patterns ``[layer, head, query, key]`` (e.g. the mean or std over test sequences).
    Rows are layers, columns heads (more than ``MAX_GRID_COLUMNS`` heads wrap onto further
    rows); each panel shows query (y) against key (x), with tick labels on the outer
    panels. The figure fits a report's width, so its labels are shown at the size drawn;
    with ``tick_labels`` (tokens) panels grow until every token is labelled (thinned only
    past the page's width). layer_labels / head_labels: the model's indices when
    ``patterns`` holds a subset; titles[layer][head]: panel titles."""
    if patterns.ndim != 4:
        raise InputError(f"expected patterns [layer, head, query, key], got shape {patterns.shape}")
    n_layers, n_heads, n_query, n_key = patterns.shape
    layer_labels = list(range(n_layers)) if layer_labels is None else list(layer_labels)
    head_labels = list(range(n_heads)) if head_labels is None else list(head_labels)
    if len(layer_labels) != n_layers or len(head_labels) != n_heads:
        raise InputError(f"need {n_layers} layer labels and {n_heads} head labels for patterns {patterns.shape}")
    columns, panel, margin = _grid_shape(n_heads, n_key, tick_labels)
    n_rows = n_layers * (rows_per_layer := math.ceil(n_heads / columns))
    fig = Figure(figsize=(panel * columns + margin, panel * n_rows + 0.9), layout="constrained")
    axes = fig.subplots(n_rows, columns, squeeze=False, sharex=True, sharey=True)
    top = float(np.nanmax(patterns)) if vmax is None else vmax
    image = None
    keys, queries = block_starts(n_key, int(panel * DPI / 4)), block_starts(n_query, int(panel * DPI / 4))
    step = _tick_step(len(keys), panel, 1.6 if tick_labels is None else TOKEN_PITCH)
    for row in range(n_rows):
        for column in range(columns):
            ax = axes[row][column]
            layer, head = divmod(row, rows_per_layer)[0], (row % rows_per_layer) * columns + column
            if head >= n_heads:
                ax.set_axis_off()
                continue
            shown = max_pooled(patterns[layer, head], queries, keys)  # key 0 always a column of its own
            image = ax.imshow(shown, vmin=0.0, vmax=max(top, 1e-9), cmap=cmap, interpolation="nearest")
            name = titles[layer][head] if titles is not None else f"L{layer_labels[layer]} H{head_labels[head]}"
            ax.set_title(name, fontsize=TICK_PT, pad=3)
            ax.set_xticks(*block_ticks(keys, step, tick_labels))
            ax.set_yticks(*block_ticks(queries, step, tick_labels))
            ax.tick_params(labelsize=SMALL_PT, length=2, pad=1)
            if tick_labels is not None and max(len(label) for label in tick_labels) > 2:
                ax.tick_params(axis="x", labelrotation=90)  # tokens: side by side they would overlap
            ax.label_outer()
    fig.supxlabel(key_label(len(keys), n_key), fontsize=LABEL_PT)
    fig.supylabel("query", fontsize=LABEL_PT)
    fig.suptitle(title, fontsize=TITLE_PT)
    if image is not None:
        _colorbar(fig, image, axes, colorbar_label, min(1.0, 4.0 / (panel * n_rows)) if n_rows > 1 else 1.0)
    return save_figure(fig, path)


def _grid_shape(n_heads: int, n_key: int, tick_labels: Sequence[str] | None) -> tuple[int, float, float]:
    """(panels per row, balanced over the rows; a panel's size, the margin, in inches)."""
    margin = 1.9 if tick_labels is None else 1.2 + 0.06 * max(map(len, tick_labels), default=0)  # labels, bar
    wanted = 0.0 if tick_labels is None else n_key * SMALL_PT * TOKEN_PITCH / 72  # a label per key
    fit = max(1, min(n_heads, MAX_GRID_COLUMNS, int((PAGE_WIDTH_IN - margin) // max(wanted, 1e-9))))
    columns = math.ceil(n_heads / math.ceil(n_heads / fit))  # 4 panels as 2 x 2, not 3 + 1
    return columns, min(max(2.3, wanted), (PAGE_WIDTH_IN - margin) / columns), margin


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
    marked: frozenset[tuple[int, int]] = frozenset(),
    marked_label: str = "",
) -> Figure:
    """A ``[rows, columns]`` heatmap with integer ticks (or the given tick labels, one per
    column / row) and each cell annotated (when the cells are large enough to hold a
    legible value), e.g. layer x head, or layer x position for patching effects.
    ``marked`` (row, column) cells are outlined, and a legend says what the outline means
    (``marked_label``, e.g. sink heads)."""
    n_rows, n_columns = values.shape
    cell_w, cell_h = _cell_size(n_rows, n_columns, PAGE_WIDTH_IN - 2.4)
    height = max(2.6, cell_h * n_rows + 1.6 + (0.35 if marked_label else 0.0))
    fig = Figure(figsize=(max(3.6, cell_w * n_columns + 2.4), height), layout="constrained")
    ax = fig.subplots()
    image = _draw_grid(ax, values, vmin, vmax, xlabel, ylabel, cmap, cell_w, cell_h)
    outline_cells(ax, marked)
    if marked_label:
        outline_legend(fig, marked_label, len(marked))
    if x_tick_labels is not None:
        # labels wider than their cell (e.g. 28 heads' "L14H3") stand upright rather than overlap
        widest_in = max((len(label) for label in x_tick_labels), default=0) * 0.6 * TICK_PT / 72
        ax.set_xticks(range(n_columns), list(x_tick_labels), rotation=90 if widest_in > cell_w else 0)
    if y_tick_labels is not None:
        ax.set_yticks(range(n_rows), list(y_tick_labels))
    ax.set_title(title, fontsize=TITLE_PT)
    _colorbar(fig, image, ax, colorbar_label)
    return save_figure(fig, path)


CELL_W, CELL_H = 0.55, 0.4  # inches: room for a value such as 0.93 in SMALL_PT
TEXT_CELL_W, TEXT_CELL_H = 0.36, 0.22  # the smallest cell that still holds such a value (7 pt: 0.1 in high)
TALL_MAP_IN = 9.0  # a map with many rows gets lower cells (down to TEXT_CELL_H), not a page of its own
OUTLINE_COLOUR, OUTLINE_WIDTH = "#0a6cff", 2.0  # sink-head outlines: blue, apart from magma's and viridis's colours


def _cell_size(n_rows: int, n_columns: int, width_in: float) -> tuple[float, float]:
    """A map cell's width and height in inches: ``CELL_W`` x ``CELL_H``, lower when many
    rows would make the map taller than ``TALL_MAP_IN`` (still tall enough for a value),
    narrower (and then unannotated) when ``n_columns`` cells would not fit in ``width_in``."""
    width = min(CELL_W, width_in / max(n_columns, 1))
    if width < TEXT_CELL_W:
        return width, max(0.12, min(CELL_H, width))
    return width, max(TEXT_CELL_H, min(CELL_H, TALL_MAP_IN / max(n_rows, 1)))


def annotates(cell_w: float, cell_h: float) -> bool:
    """Whether cells this size (inches) are drawn with their values written in them."""
    return cell_w >= TEXT_CELL_W and cell_h >= TEXT_CELL_H


def outline_cells(ax: Axes, cells: frozenset[tuple[int, int]]) -> None:
    """A box edge around each (row, column) cell of an ``imshow`` map, drawn over it."""
    for row, column in sorted(cells):
        box = Rectangle((column - 0.5, row - 0.5), 1.0, 1.0, fill=False, gid=f"outline-{row}-{column}")
        box.set(edgecolor=OUTLINE_COLOUR, linewidth=OUTLINE_WIDTH, zorder=3)
        ax.add_patch(box)


def outline_legend(fig: Any, label: str, count: int) -> None:
    """The legend that says what an outline marks, under the maps."""
    handle = Patch(
        facecolor="none", edgecolor=OUTLINE_COLOUR, linewidth=OUTLINE_WIDTH, label=f"outlined: {label} ({count})"
    )
    fig.legend(handles=[handle], loc="outside lower center", fontsize=TICK_PT, frameon=False)


def _colorbar(fig: Any, image: Any, ax: Any, label: str, shrink: float = 1.0) -> None:
    bar = fig.colorbar(image, ax=ax, shrink=shrink)
    bar.set_label(label, fontsize=LABEL_PT)
    bar.ax.tick_params(labelsize=TICK_PT)


def layer_head_maps(
    panels: Sequence[tuple[str, np.ndarray]],
    path: str | os.PathLike,
    title: str,
    colorbar_label: str,
    vmin: float = 0.0,
    vmax: float = 1.0,
    marked: Sequence[frozenset[tuple[int, int]]] = (),
    marked_label: str = "",
) -> Figure:
    """Several layer x head heatmaps, one per ``(name, values [layer, head])`` panel (e.g.
    one per model), on one color scale; panels fill rows as wide as a report's column.
    ``marked[panel]``: the (layer, head) cells outlined, which ``marked_label`` names."""
    if not panels:
        raise InputError("layer_head_maps needs at least one panel")
    margin = 0.9  # a panel's layer ticks and label
    room = PAGE_WIDTH_IN - 1.4  # the colour bar
    sizes = [_cell_size(values.shape[0], values.shape[1], room - margin) for _, values in panels]
    widths = [max(1.6, cell_w * values.shape[1] + margin) for (cell_w, _), (_, values) in zip(sizes, panels)]
    rows: list[list[int]] = [[]]
    for index, width in enumerate(widths):
        if rows[-1] and sum(widths[k] for k in rows[-1]) + width > room:
            rows.append([])
        rows[-1].append(index)
    heights = [max(sizes[k][1] * panels[k][1].shape[0] for k in row) + 1.3 for row in rows]
    row_width = max(sum(widths[k] for k in row) for row in rows)
    fig = Figure(figsize=(row_width + 1.4, sum(heights) + 0.4 + (0.35 if marked_label else 0.0)), layout="constrained")
    figures = fig.subfigures(len(rows), 1, height_ratios=heights, squeeze=False)[:, 0]
    for sub, row in zip(figures, rows):
        pad = row_width - sum(widths[k] for k in row)  # a shorter row keeps its cells' size
        ratios = [widths[k] for k in row] + ([pad] if pad > 0.05 else [])
        axes = sub.subplots(1, len(ratios), squeeze=False, width_ratios=ratios)[0]
        image: Any = None
        for ax, k in zip(axes, row):
            name, values = panels[k]
            image = _draw_grid(ax, values, vmin, vmax, "head", "layer", "magma", *sizes[k])
            outline_cells(ax, marked[k] if k < len(marked) else frozenset())
            ax.set_title(name, fontsize=TICK_PT)
        for ax in axes[len(row) :]:
            ax.set_axis_off()
        _colorbar(sub, image, list(axes[: len(row)]), colorbar_label, shrink=0.9)
    if marked_label:
        outline_legend(fig, marked_label, sum(len(cells) for cells in marked))
    fig.suptitle(title, fontsize=TITLE_PT)
    return save_figure(fig, path)


def draw_head_maps(maps: HeadMaps, path: str | os.PathLike) -> Figure:
    """``maps`` as a PNG: one panel as one layer x head heatmap, several side by side; the
    marked cells (sink heads) outlined on every panel, values written where cells hold them."""
    arrays = [(name, np.array(values, dtype=float).reshape(len(values), -1)) for name, values in maps.panels]
    label = maps.marked_label
    if len(arrays) == 1:
        marked = maps.marked[0] if maps.marked else frozenset()
        title, unit, low, high = maps.title, maps.colorbar_label, maps.vmin, maps.vmax
        return heatmap(arrays[0][1], path, title, unit, "head", "layer", low, high, marked=marked, marked_label=label)
    return layer_head_maps(arrays, path, maps.title, maps.colorbar_label, maps.vmin, maps.vmax, maps.marked, label)


def _draw_grid(
    ax: Axes,
    values: np.ndarray,
    vmin: float,
    vmax: float,
    xlabel: str,
    ylabel: str,
    cmap: str,
    cell_w: float = CELL_W,
    cell_h: float = CELL_H,
):
    """Draw one ``[rows, columns]`` map on ``ax``, each cell's value written in it when the
    cells can hold it (``annotates``); returns the image."""
    n_rows, n_columns = values.shape
    # a cell with no value (a layer that was not probed) is drawn blank grey, not as a number
    colormap = matplotlib.colormaps[cmap].with_extremes(bad=NOT_MEASURED_COLOUR)
    image = ax.imshow(np.ma.masked_invalid(values), vmin=vmin, vmax=vmax, cmap=colormap, aspect="auto")
    if annotates(cell_w, cell_h):
        for row in range(n_rows):
            for column in range(n_columns):
                value = values[row, column]
                if not np.isfinite(value):
                    continue
                ax.text(
                    column,
                    row,
                    f"{value:.2f}",
                    ha="center",
                    va="center",
                    fontsize=SMALL_PT,
                    color=text_colour(colormap(image.norm(value))),
                )
    ax.set_xlabel(xlabel, fontsize=LABEL_PT)
    ax.set_ylabel(ylabel, fontsize=LABEL_PT)
    x_step = _tick_step(n_columns, cell_w * n_columns)
    y_step = _tick_step(n_rows, cell_h * n_rows)
    ax.set_xticks(range(0, n_columns, x_step))
    ax.set_yticks(range(0, n_rows, y_step))
    ax.tick_params(labelsize=TICK_PT)
    return image


def legend_below(fig: Figure, ax: Axes, n_series: int) -> None:
    """The legend under the axes, outside them, so it never covers a bar or a line."""
    handles, labels = ax.get_legend_handles_labels()
    longest = max((len(label) for label in labels), default=0)
    fig.legend(
        handles,
        labels,
        loc="outside lower center",
        ncols=n_series if longest * n_series <= 60 else 1,
        fontsize=TICK_PT,
        frameon=False,
    )


def line_chart(
    x: Sequence[float] | Sequence[str],
    series: Sequence[tuple[str, Sequence[float]]],
    path: str | os.PathLike,
    title: str,
    xlabel: str,
    ylabel: str,
    ylim: tuple[float, float] | None = None,
    break_gaps: bool = False,
) -> Figure:
    """One line with markers per ``(name, values)`` series over ``x`` (numbers or category names).
    With ``break_gaps`` (integer ``x`` such as layer indices), no line joins two points whose
    x differ by more than 1: nothing was measured between them."""
    fig = Figure(figsize=(min(PAGE_WIDTH_IN, max(4.6, 0.45 * len(x) + 2.5)), 3.6), layout="constrained")
    ax = fig.subplots()
    for name, values in series:
        if len(values) != len(x):
            raise InputError(f"series {name!r} has {len(values)} values for {len(x)} x positions")
        xs, ys = _with_gaps(x, values) if break_gaps else (list(x), list(values))  # type: ignore[arg-type]
        ax.plot(xs, ys, marker="o", markersize=3, label=name)  # type: ignore[arg-type]
    ax.set_xlabel(xlabel, fontsize=LABEL_PT)
    ax.set_ylabel(ylabel, fontsize=LABEL_PT)
    ax.tick_params(labelsize=TICK_PT)
    if ylim is not None:
        ax.set_ylim(*ylim)
    if x and isinstance(x[0], str):
        ax.tick_params(axis="x", labelrotation=45)
    elif all(isinstance(value, int) for value in x):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=TITLE_PT)
    if len(series) > 1:
        legend_below(fig, ax, len(series))
    return save_figure(fig, path)


def _with_gaps(x: Sequence[float], values: Sequence[float]) -> tuple[list[float], list[float]]:
    """``x`` and ``values`` with a NaN point in each gap of more than 1 in ``x``, where
    matplotlib ends the line (the NaN draws no marker)."""
    xs: list[float] = []
    ys: list[float] = []
    for index, (position, value) in enumerate(zip(x, values)):
        if index and position - x[index - 1] > 1:
            xs.append((position + x[index - 1]) / 2)
            ys.append(math.nan)
        xs.append(position)
        ys.append(value)
    return xs, ys


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
    fig = Figure(
        figsize=(min(PAGE_WIDTH_IN, max(4.6, 0.35 * len(categories) * len(series) + 2.5)), 3.8),
        layout="constrained",
    )
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
    # rotated when the names, side by side in TICK_PT, would not fit under the axes
    crowded = sum(len(name) + 2 for name in categories) * TICK_PT * 0.6 / 72 > fig.get_figwidth() - 1.5
    ax.set_xticks(positions, list(categories), rotation=30 if crowded else 0, ha="right" if crowded else "center")
    ax.set_ylabel(ylabel, fontsize=LABEL_PT)
    ax.tick_params(labelsize=TICK_PT)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(title, fontsize=TITLE_PT)
    if len(series) > 1:
        legend_below(fig, ax, len(series))
    return save_figure(fig, path)
