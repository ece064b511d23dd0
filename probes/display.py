"""A probe's inline notebook display: its key numbers, the layer x head sink map and
the per-head table, as ``sinkscope.reports.html`` parts that the audit's display reuses;
the tables are the ones the reports show (``sinkscope.probes.tables``)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from sinkscope.infra.intervals import interval_possible
from sinkscope.probes.head_ablation_report import head_ablation_table
from sinkscope.probes.report_sections import sink_rate_phrase
from sinkscope.probes.tables import (
    HEAD_TABLE,
    POSITION_COLUMN,
    SINK_RATE_NAME,
    anchor_mass_map,
    default_state_definition,
    patching_definition,
    shown_position,
)
from sinkscope.reports.document import Column, Table
from sinkscope.reports.formatting import confidence_label, format_cell, plural
from sinkscope.reports.html import escape, fragment, head_maps_html, heat_grid, inline_table

if TYPE_CHECKING:
    from sinkscope.probes.default_state import DefaultStateResult
    from sinkscope.probes.patching import PatchingResult
    from sinkscope.probes.probe import ProbeResult


def key_numbers(result: ProbeResult) -> str:
    """Sink heads, sink rates and layer cancellation as a two-column table."""
    sinks = result.sink_heads()
    threshold = 1.0 - result.config.sink_eps
    listed = ", ".join(f"L{layer}H{head}" for layer, head in sinks)  # all of them: a list is never cut
    rates = sink_rate_phrase(result.sink_rates)
    ratio = result.attn_out_norm_of_sum / result.attn_out_sum_of_norms if result.attn_out_sum_of_norms > 0 else math.nan
    rows = [
        (
            "sink heads",
            f"{len(sinks)} of {len(result.heads)} (anchor mass \u2265 {threshold:g}){': ' if sinks else ''}{listed}",
        ),
        (f"sink rate (Gu et al., {SINK_RATE_NAME})", rates),
        (
            "layer outputs: \u2016\u03a3\u2016 / \u03a3\u2016\u00b7\u2016",
            f"{format_cell(ratio, '.3f')} (1: no cancellation; near 0: the layers cancel each other)",
        ),
        ("inputs / queries measured", f"{result.n_inputs:,} / {result.n_queries:,}"),
    ]
    return inline_table(Table("", (Column("measure"), Column("value")), tuple(rows)))


def sink_map(result: ProbeResult) -> str:
    return head_maps_html(anchor_mass_map(result, "Anchor mass per head"))


def head_table(result: ProbeResult) -> str:
    return inline_table(HEAD_TABLE.table(result.heads).without_empty_columns())


def probe_parts(result: ProbeResult) -> list[str]:
    return [key_numbers(result), sink_map(result), head_table(result)]


def probe_html(result: ProbeResult) -> str:
    spec = result.model
    subtitle = (
        f"{spec.family} model: {plural(spec.n_layers, 'layer')} x {plural(spec.n_heads, 'head')}, {spec.attention} attention; "
        "anchor: each input's first real token"
    )
    return fragment("Attention-sink probe", subtitle, probe_parts(result))


def default_state_table(result: DefaultStateResult, what: str) -> str:
    """The default-state test: ``what`` (e.g. "next-token loss") before and after each
    removal, beside its matched control."""
    if not result.tested_rows():
        return f"<p>{escape(result.note)}</p>"
    definition = default_state_definition(what, result.n_inputs, confidence_label(result.confidence))
    caption = f"Default-state test on {plural(result.n_inputs, 'input')}"
    table = definition.table(result.tested_rows(), caption)
    return inline_table(table.without_empty_columns() if not interval_possible(result.n_inputs) else table)


def default_state_html(result: DefaultStateResult) -> str:
    ablations = head_ablation_table(
        result.tested_rows(), "error", result.n_inputs, level=confidence_label(result.confidence)
    )
    return fragment(
        "Default-state test",
        plural(len(result.sink_heads), "sink head"),
        [default_state_table(result, "error"), *([inline_table(ablations)] if ablations is not None else [])],
    )


def patching_html(result: PatchingResult) -> str:
    """A heat map of the normalised effect over the two ``per`` axes when there are two
    (layer x head or layer x position), then the sites with the largest effects."""
    parts = []
    if len(result.per) == 2:
        matrix = result.matrix("normalised_effect").tolist()
        parts.append(
            heat_grid(
                matrix,
                "Normalised effect, (patched - target) / (source - target)",
                row_name=result.per[0],
                column_name=POSITION_COLUMN if result.per[1] == "position" else result.per[1],
                column_labels=[str(shown_position(c)) for c in range(len(matrix[0]))]
                if result.per[1] == "position" and matrix
                else (),
                signed=True,  # an effect may be negative: a diverging scale, white at 0
            )
        )
    sites = patching_definition(result.per).table(result.rows, limit=20).without_empty_columns()
    parts.append(inline_table(replace(sites, caption=f"The {len(sites.rows)} sites with the largest effects")))
    subtitle = (
        f"hook {result.hook}, per {' x '.join(result.per)}, {plural(result.n_inputs, 'input')}; metric: "
        f"source {result.source_metric:.4g}, target {result.target_metric:.4g}"
    )
    return fragment("Activation patching", subtitle, parts)
