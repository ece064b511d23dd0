"""The per-layer tables of a probe, each defined once for every medium: one row per layer
with its attention span (global, a sliding window or chunks), and one per layer without
an attention pattern; and the spans themselves, as the configuration and findings write
them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinkscope.interp.visibility import layer_reach
from sinkscope.probes.tables import LAYER
from sinkscope.reports.document import Column, TableDefinition
from sinkscope.reports.formatting import index_ranges

if TYPE_CHECKING:
    from sinkscope.interp.model_spec import ModelSpec, NoPatternLayer
    from sinkscope.probes.probe import LayerProbe

# a hybrid's layers without an attention pattern (ModelSpec.no_pattern_layers), one row each
NO_PATTERN_TABLE: TableDefinition[NoPatternLayer] = TableDefinition(
    "Layers without an attention pattern",
    (LAYER, Column("layer kind"), Column("attention pattern")),
    lambda row: (row.layer, row.kind, "no pattern"),
    "these layers have no attention weights (linear attention keeps a state, not a pattern over keys): every "
    "probe skips them, and the per-head and per-layer tables, sink heads and sink rates are over the other layers",
)


def attention_span(window: int, chunk: int) -> str:
    """A layer's attention span, as the per-layer table, the configuration and the findings
    write it: the keys a query can see."""
    if window:
        return f"sliding window of {window:,}"
    return f"chunks of {chunk:,}" if chunk else "global"


def span_groups(spec: ModelSpec) -> dict[str, list[int]]:
    """The model's layers grouped by attention span, in order of each span's first layer."""
    groups: dict[str, list[int]] = {}
    for layer in range(spec.n_layers):
        groups.setdefault(attention_span(*layer_reach(spec, layer)), []).append(layer)
    return groups


def span_summary(spec: ModelSpec) -> str:
    """Every layer's span in one line, e.g. "sliding window of 512 in layers 0-4, 6-10 (10);
    global in layers 5, 11 (2)"."""
    return "; ".join(
        f"{span} in layer {layers[0]}"
        if len(layers) == 1
        else f"{span} in layers {index_ranges(layers)} ({len(layers)})"
        for span, layers in span_groups(spec).items()
    )


def layer_definition(spec: ModelSpec) -> TableDefinition[LayerProbe]:
    """The per-layer table of a probe of ``spec``, its attention span beside each layer."""
    return TableDefinition(
        "Per layer",
        (
            LAYER,
            Column("attention span"),
            Column("mean anchor_mass", ".3f", numeric=True),
            Column("queries not seeing the anchor", ".3f", numeric=True),
            Column("mean anchor_mass (all queries)", ".3f", numeric=True),
            Column("sink heads", numeric=True),
            Column("attn_out_norm", ".3g", numeric=True),
            Column("head_out_norm_sum", ".3g", numeric=True),
            Column("anchor_resid_norm", ".3g", numeric=True),
            Column("massive activations", numeric=True),
            Column("massive at anchor", numeric=True),
            Column("max |resid|", ".3g", numeric=True),
            Column("median |resid|", ".3g", numeric=True),
        ),
        lambda layer: (
            layer.layer,
            attention_span(*layer_reach(spec, layer.layer)),
            layer.anchor_mass,
            layer.anchor_hidden_share,
            layer.anchor_mass_all_queries,
            layer.n_sink_heads,
            layer.attn_out_norm,
            layer.head_out_norm_sum,
            layer.anchor_resid_norm,
            layer.massive_count,
            layer.massive_at_anchor,
            layer.max_abs_resid,
            layer.median_abs_resid,
        ),
        "attention span: the keys each query sees (global: all the model lets it see, the earlier tokens in a causal model and every token in an encoder). mean anchor_mass: over the queries "
        "that can see the anchor; queries not seeing the anchor: the share of selected queries that the layer's "
        "sliding window or chunk hides it from (0 in global layers); "
        "mean anchor_mass (all queries): with those queries' zeros included, shown where the share is above 0. "
        "Norms are means over the selected queries; attn_out_norm (norm of the summed heads) far below "
        "head_out_norm_sum means the heads cancel. Massive activations: |x| > 100 and > 1000 x the layer's "
        "median |x| in the residual stream after the layer.",
    )
