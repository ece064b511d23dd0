"""The sweep's figures: sink fraction and steps to converge per configuration, heatmaps
over sequence length x width, and phase diagrams over layers x heads."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.patches import Rectangle

from sinkscope.reports.plots import SMALL_PT, bar_chart, heatmap, save_figure
from sinkscope.toy.sweep_cells import Cell, SweepRow, find_row

if TYPE_CHECKING:  # typing only: sinkscope.toy.sweep calls sweep_plots
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from sinkscope.toy.sweep import SweepConfig

CONVERGED_LABEL = "every seed converged"
CAPPED_LABEL = "at step cap (not converged)"
CAPPED_MARK = "at step cap"


def sweep_plots(config: SweepConfig, rows: list[SweepRow], out_dir: Path) -> list[str]:
    """Write every sweep figure into ``out_dir``; their file names, in writing order."""
    return [
        *_summary_bars(config, rows, out_dir),
        *_size_heatmaps(config, rows, out_dir),
        *_phase_diagrams(config, rows, out_dir),
    ]


def _summary_bars(config: SweepConfig, rows: list[SweepRow], out_dir: Path) -> list[str]:
    """Bar charts of the sink fraction and of the mean training steps per configuration;
    configurations at the step cap are a series of their own, never a converged value."""
    labels = [row.label if row.finished else f"{row.label} (at step cap)" for row in rows]
    fractions = bar_chart(
        labels,
        _finished_and_capped([row.sink_fraction for row in rows], rows),
        out_dir / "sink_fraction.png",
        "fraction of sink heads per configuration",
        "sink fraction",
    )
    fractions.axes[0].set_ylim(0.0, 1.0)  # a fraction: all-zero bars would otherwise get a +-0.05 axis
    save_figure(fractions, out_dir / "sink_fraction.png")
    bar_chart(
        labels,
        _finished_and_capped([row.mean_steps for row in rows], rows),
        out_dir / "steps_to_converge.png",
        f"mean training steps (cap {config.max_steps:,})",
        "steps",
    )
    return ["sink_fraction.png", "steps_to_converge.png"]


def _finished_and_capped(values: list[float], rows: list[SweepRow]) -> list[tuple[str, list[float]]]:
    """``values`` split into a converged series and an at-step-cap series (NaN where the
    other holds the row); a series with no value is left out."""
    nan = float("nan")
    series = [
        (CONVERGED_LABEL, [v if row.finished else nan for v, row in zip(values, rows)]),
        (CAPPED_LABEL, [nan if row.finished else v for v, row in zip(values, rows)]),
    ]
    return [(name, column) for name, column in series if not all(np.isnan(column))]


def _size_heatmaps(config: SweepConfig, rows: list[SweepRow], out_dir: Path) -> list[str]:
    """Sink fraction over d_model x seq_len, one heatmap per kind, shape and block (none
    unless both sizes vary)."""
    figures = []
    for attention, layers, heads, layer_norm, mlp in itertools.product(
        config.attentions, config.layers, config.heads, config.layer_norms, config.mlps
    ):
        if len(config.d_models) == 1 or len(config.seq_lens) == 1:
            break
        grid = np.array(
            [
                [find_row(rows, attention, layers, heads, d, L, layer_norm, mlp).sink_fraction for L in config.seq_lens]
                for d in config.d_models
            ]
        )
        extras = Cell(attention, layers, heads, 0, 0, layer_norm, mlp).extras.replace("-", "_")
        name = f"sink_fraction_{attention}_{layers}x{heads}{extras}.png"
        heatmap(
            grid,
            out_dir / name,
            f"{attention} {layers}x{heads}{extras}: sink fraction",
            "sink fraction",
            xlabel="seq_len",
            ylabel="d_model",
            x_tick_labels=[str(L) for L in config.seq_lens],
            y_tick_labels=[str(d) for d in config.d_models],
        )
        figures.append(name)
    return figures


def _phase_diagrams(config: SweepConfig, rows: list[SweepRow], out_dir: Path) -> list[str]:
    """The phase diagrams, one per kind, block and size (none unless layers or heads vary)."""
    figures: list[str] = []
    if len(config.layers) <= 1 and len(config.heads) <= 1:
        return figures
    for attention, layer_norm, mlp, d_model, seq_len in itertools.product(
        config.attentions, config.layer_norms, config.mlps, config.d_models, config.seq_lens
    ):
        cell = Cell(attention, 0, 0, d_model, seq_len, layer_norm, mlp)
        name = phase_figure_name(attention, d_model, seq_len, layer_norm, mlp)
        draw_phase_diagram(config, rows, cell, out_dir / name)
        figures.append(name)
    return figures


def draw_phase_diagram(config: SweepConfig, rows: list[SweepRow], cell: Cell, path: Path) -> Figure:
    """Sink fraction over layers x heads for ``cell``'s kind, block and size. A
    configuration with a seed at the step cap shows no sink fraction: its cell is hatched
    grey and says "at step cap" with how many seeds converged."""
    cells = [
        [
            find_row(rows, cell.attention, layers, heads, cell.d_model, cell.seq_len, cell.layer_norm, cell.mlp)
            for heads in config.heads
        ]
        for layers in config.layers
    ]
    grid = np.array([[row.sink_fraction if row.finished else np.nan for row in line] for line in cells])
    fig = heatmap(
        grid,
        path,
        f"{cell.attention}{cell.extras.replace('-', ' +')}: sink fraction by layers x heads",
        "sink fraction",
        xlabel="heads",
        ylabel="layers",
        vmin=0.0,
        vmax=1.0,
        x_tick_labels=[str(h) for h in config.heads],
        y_tick_labels=[str(n) for n in config.layers],
    )
    if not all(row.finished for line in cells for row in line):
        _mark_capped(fig.axes[0], cells)
        save_figure(fig, path)
    return fig


def phase_figure_name(attention: str, d_model: int, seq_len: int, layer_norm: bool, mlp: bool) -> str:
    extras = Cell(attention, 0, 0, d_model, seq_len, layer_norm, mlp).extras.replace("-", "_")
    return f"phase_{attention}_d{d_model}_L{seq_len}{extras}.png"


def _mark_capped(ax: Axes, cells: list[list[SweepRow]]) -> None:
    """Hatch every cell with a seed at the step cap grey, with "at step cap" and its
    converged count in place of a value (the heatmap left it blank: its value is NaN)."""
    for text in list(ax.texts):
        if text.get_text() == "nan":
            text.remove()
    for y, line in enumerate(cells):
        for x, row in enumerate(line):
            if row.finished:
                continue
            ax.add_patch(
                Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor="0.82", edgecolor="0.45", hatch="///", linewidth=0.5)
            )
            ax.text(
                x,
                y,
                f"{CAPPED_MARK}\n{row.converged}/{row.seeds} conv.",
                ha="center",
                va="center",
                fontsize=SMALL_PT,
                color="black",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
            )


def figure_captions(rows: list[SweepRow], names: list[str]) -> dict[str, str]:
    """The caption of each sweep figure: its name in words and, when some configuration is
    at the step cap, which (so the page's alt text says so too)."""
    captions = {name: name.removesuffix(".png").replace("_", " ") for name in names}
    captions |= {
        name: caption
        for name, caption in (
            ("sink_fraction.png", "sink fraction per configuration"),
            ("steps_to_converge.png", "mean training steps per configuration (steps to converge where it converged)"),
        )
        if name in captions
    }
    capped = [row for row in rows if not row.finished]
    for name in ("sink_fraction.png", "steps_to_converge.png"):
        if name in captions and capped:
            captions[name] += (
                f"; bars '{CAPPED_LABEL}' did not converge: their values are where training stopped, not results"
            )
    for name in captions:
        marked = [
            f"{row.n_layers}x{row.n_heads} {row.status}"
            for row in capped
            if phase_figure_name(row.attention, row.d_model, row.seq_len, row.layer_norm, row.mlp) == name
        ]
        if marked:
            captions[name] += "; hatched grey cells, at the step cap, not a result: " + ", ".join(marked)
    return captions
