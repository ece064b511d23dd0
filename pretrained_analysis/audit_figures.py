"""The figures of one audit, written beside its ``audit.json``: the layers x heads map of
anchor mass with its sink heads outlined, anchor mass per layer, the key geometry per head
(when measured), and the attention patterns of the example heads."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sinkscope.infra.output_files import OutputFiles
from sinkscope.pretrained_analysis.examples import plot_text
from sinkscope.probes.geometry_result import draw_key_geometry
from sinkscope.probes.tables import anchor_mass_map
from sinkscope.reports.formatting import index_ranges
from sinkscope.reports.plots import attention_grid, draw_head_maps, line_chart

if TYPE_CHECKING:
    from sinkscope.pretrained_analysis.audit import AuditResult

MAP_FIGURE = "anchor_mass_map.png"
LAYER_FIGURE = "anchor_mass_by_layer.png"
EXAMPLE_FIGURE = "attention_example_{index}.png"
GEOMETRY_FIGURE = "key_geometry.png"
# every figure draw_audit_figures may write (which ones one audit drew: AuditResult.figures)
AUDIT_FIGURES = OutputFiles((MAP_FIGURE, LAYER_FIGURE, GEOMETRY_FIGURE), numbered=(EXAMPLE_FIGURE,))


def _seeing(result: AuditResult) -> str:
    """What qualifies "queries" in a figure title: where a sliding window or chunk hides the
    anchor from some queries, anchor masses are over the queries that see it."""
    return " that see it" if any(layer.anchor_hidden_share > 0 for layer in result.probe.layers) else ""


def _hidden_series(result: AuditResult) -> list[tuple[str, list[float]]]:
    """The per-layer share of queries that cannot see the anchor, as a line (none when every
    query of every layer sees it)."""
    if not _seeing(result):
        return []
    return [("share of queries not seeing the anchor", [layer.anchor_hidden_share for layer in result.probe.layers])]


def _probed(result: AuditResult) -> str:
    chosen = result.config.restricted_layers(result.model.n_layers)
    if chosen is None:
        return ""
    return f" (probed: {index_ranges(chosen)} of {result.model.n_layers})"


def draw_audit_figures(result: AuditResult, directory: Path) -> None:
    """Every figure of ``result`` into ``directory``."""
    label = plot_text(result.model.label)
    mass = result.probe.anchor_mass_matrix().numpy()
    draw_head_maps(
        anchor_mass_map(result.probe, f"{label}: anchor mass (mean A[i, anchor], queries i > anchor{_seeing(result)})"),
        directory / MAP_FIGURE,
    )
    n_heads = result.model.n_heads
    line_chart(
        [layer.layer for layer in result.probe.layers],
        [
            ("mean over heads", [layer.anchor_mass for layer in result.probe.layers]),
            ("max over heads", [float(np.nanmax(mass[layer.layer])) for layer in result.probe.layers]),
            (
                f"share of sink heads (>= {1.0 - result.config.sink_eps:g})",
                [layer.n_sink_heads / n_heads for layer in result.probe.layers],
            ),
            *_hidden_series(result),
        ],
        directory / LAYER_FIGURE,
        f"{label}: anchor mass per layer" + _probed(result),
        "layer",
        "anchor mass / share of heads" + (" or queries" if _seeing(result) else ""),
        ylim=(0.0, 1.02),
        break_gaps=True,  # a restricted audit: no line across layers it did not probe
    )
    if GEOMETRY_FIGURE in result.figures:
        draw_key_geometry(result.probe.heads, directory / GEOMETRY_FIGURE, f"{label}: key geometry per head")
    for number, example in enumerate(result.examples):
        attention_grid(
            example.patterns[None],
            directory / EXAMPLE_FIGURE.format(index=number),
            f"{label}: attention on prompt {example.prompt_index} (query y, key x)",
            tick_labels=example.labels,
            vmax=1.0,
            titles=[[f"L{layer}H{head}: {role}" for (layer, head), role in zip(example.heads, example.roles)]],
        )
