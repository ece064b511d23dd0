"""The sweep's figures: sink fraction and steps to converge per configuration, heatmaps
over sequence length x width, and phase diagrams over layers x heads."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sinkscope.reports.plots import bar_chart, heatmap
from sinkscope.toy.sweep_cells import Cell, SweepRow, find_row

if TYPE_CHECKING:  # typing only: sinkscope.toy.sweep calls sweep_plots
    from sinkscope.toy.sweep import SweepConfig


def sweep_plots(config: SweepConfig, rows: list[SweepRow], out_dir: Path) -> list[str]:
    """Write every sweep figure into ``out_dir``; their file names, in writing order."""
    return [
        *_summary_bars(config, rows, out_dir),
        *_size_heatmaps(config, rows, out_dir),
        *_phase_diagrams(config, rows, out_dir),
    ]


def _summary_bars(config: SweepConfig, rows: list[SweepRow], out_dir: Path) -> list[str]:
    """Bar charts of the sink fraction and of the mean training steps per configuration."""
    labels = [row.label for row in rows]
    bar_chart(
        labels,
        [("sink fraction", [row.sink_fraction for row in rows])],
        out_dir / "sink_fraction.png",
        "fraction of sink heads per configuration",
        "sink fraction",
    )
    bar_chart(
        labels,
        [("mean steps", [row.mean_steps for row in rows])],
        out_dir / "steps_to_converge.png",
        f"mean training steps (cap {config.max_steps})",
        "steps",
    )
    return ["sink_fraction.png", "steps_to_converge.png"]


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
    """The phase diagram: sink fraction over layers x heads, one heatmap per kind, block
    and size (none unless layers or heads vary)."""
    figures: list[str] = []
    if len(config.layers) <= 1 and len(config.heads) <= 1:
        return figures
    for attention, layer_norm, mlp, d_model, seq_len in itertools.product(
        config.attentions, config.layer_norms, config.mlps, config.d_models, config.seq_lens
    ):
        grid = np.array(
            [
                [
                    find_row(rows, attention, layers, heads, d_model, seq_len, layer_norm, mlp).sink_fraction
                    for heads in config.heads
                ]
                for layers in config.layers
            ]
        )
        cell = Cell(attention, 0, 0, d_model, seq_len, layer_norm, mlp)
        name = f"phase_{attention}_d{d_model}_L{seq_len}{cell.extras.replace('-', '_')}.png"
        heatmap(
            grid,
            out_dir / name,
            f"{attention}{cell.extras.replace('-', ' +')}: sink fraction by layers x heads",
            "sink fraction",
            xlabel="heads",
            ylabel="layers",
            vmin=0.0,
            vmax=1.0,
            x_tick_labels=[str(h) for h in config.heads],
            y_tick_labels=[str(n) for n in config.layers],
        )
        figures.append(name)
    return figures
