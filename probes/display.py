"""A probe's inline notebook display: its key numbers, the layer x head sink map and
the per-head table, as ``sinkscope.reports.inline_html`` parts that the audit's display reuses."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from sinkscope.reports.formatting import format_cell, sig
from sinkscope.reports.inline_html import escape, fragment, heat_grid, table

if TYPE_CHECKING:
    from sinkscope.probes.default_state import DefaultStateResult
    from sinkscope.probes.patching import PatchingResult
    from sinkscope.probes.probe import ProbeResult

HEAD_COLUMNS = (
    ("layer", ""),
    ("head", ""),
    ("anchor mass", ".3f"),
    ("sink head", ""),
    ("value-weighted anchor share", ".3f"),
    ("anchor value norm", ".3g"),
    ("row entropy", ".3f"),
    ("dormant", ""),
    ("head output norm", ".3g"),
)


def key_numbers(result: ProbeResult) -> str:
    """Sink heads, sink rates and layer cancellation as a two-column table."""
    sinks = result.sink_heads()
    threshold = 1.0 - result.config.sink_eps
    listed = ", ".join(f"L{layer}H{head}" for layer, head in sinks[:12]) + (", ..." if len(sinks) > 12 else "")
    rates = "; ".join(f"{format_cell(rate.percent, '.1f')}% at \u03b5 = {rate.eps:g}" for rate in result.sink_rates)
    ratio = result.attn_out_norm_of_sum / result.attn_out_sum_of_norms if result.attn_out_sum_of_norms > 0 else math.nan
    rows = [
        (
            "sink heads",
            f"{len(sinks)} of {len(result.heads)} (anchor mass \u2265 {threshold:g}){': ' if sinks else ''}{listed}",
        ),
        ("sink rate (Gu et al., Sink_1^\u03b5)", rates),
        (
            "layer outputs: \u2016\u03a3\u2016 / \u03a3\u2016\u00b7\u2016",
            f"{format_cell(ratio, '.3f')} (1: no cancellation; near 0: the layers cancel each other)",
        ),
        ("inputs / queries measured", f"{result.n_inputs:,} / {result.n_queries:,}"),
    ]
    return table((("measure", ""), ("value", "")), rows)


def sink_map(result: ProbeResult) -> str:
    matrix = result.anchor_mass_matrix().tolist()
    return heat_grid(
        matrix,
        f"Anchor mass per head (outlined: sink heads, anchor mass \u2265 {1.0 - result.config.sink_eps:g})",
        marked=frozenset(result.sink_heads()),
    )


def head_table(result: ProbeResult) -> str:
    rows = [
        (
            row.layer,
            row.head,
            row.anchor_mass,
            row.is_sink_head,
            row.value_weighted_anchor_share,
            row.anchor_value_norm,
            row.row_entropy,
            row.dormant,
            row.head_out_norm,
        )
        for row in sorted(result.heads, key=lambda row: (-_sortable(row.anchor_mass), row.layer, row.head))
    ]
    return table(HEAD_COLUMNS, rows, caption="Per head, by anchor mass", scroll=True)


def probe_parts(result: ProbeResult) -> list[str]:
    return [key_numbers(result), sink_map(result), head_table(result)]


def probe_html(result: ProbeResult) -> str:
    spec = result.model
    subtitle = (
        f"{spec.family} model: {spec.n_layers} layers x {spec.n_heads} heads, {spec.attention} attention; "
        "anchor: each input's first real token"
    )
    return fragment("Attention-sink probe", subtitle, probe_parts(result))


def _sortable(value: float) -> float:
    return -math.inf if math.isnan(value) else value


def default_state_table(result: DefaultStateResult, what: str) -> str:
    """The default-state test: ``what`` (e.g. "next-token loss") before and after each
    removal, beside its matched control."""
    if not result.tested_rows():
        return f"<p>{escape(result.note)}</p>"
    columns = (
        ("heads", ""),
        (f"{what} before", ".4g"),
        ("sink removed", ".4g"),
        ("matched control", ".4g"),
        ("change: sink removed (95% CI)", ""),
        ("change: control", "+.3g"),
    )
    rows = [
        (
            "all sink heads" if row.label == "all_sink_heads" else row.label,
            row.error_before,
            row.error_after_remove,
            row.error_after_control,
            f"{sig(row.remove_increase.mean, 3)} ({sig(row.remove_increase.ci_low, 3)} to "
            f"{sig(row.remove_increase.ci_high, 3)})",
            row.control_increase.mean,
        )
        for row in result.tested_rows()
    ]
    return table(columns, rows, caption=f"Default-state test on {result.n_inputs} inputs")


def default_state_html(result: DefaultStateResult) -> str:
    return fragment(
        "Default-state test", f"{len(result.sink_heads)} sink heads", [default_state_table(result, "error")]
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
                column_name=result.per[1],
            )
        )
    top = sorted(result.rows, key=lambda row: -_sortable(abs(row.normalised_effect)))[:20]
    columns = (
        ("layer", ""),
        ("head", ""),
        ("position (0-indexed)", ""),
        ("normalised effect", ".3f"),
        ("patched metric", ".4g"),
    )
    rows = [(row.layer, row.head, row.position, row.normalised_effect, row.patched) for row in top]
    parts.append(table(columns, rows, caption=f"The {len(top)} sites with the largest effects"))
    subtitle = (
        f"hook {result.hook}, per {' x '.join(result.per)}, {result.n_inputs} inputs; metric: "
        f"source {result.source_metric:.4g}, target {result.target_metric:.4g}"
    )
    return fragment("Activation patching", subtitle, parts)
