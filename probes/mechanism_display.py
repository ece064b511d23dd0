"""Inline notebook display (``_repr_html_``) of the side-by-side comparison: its findings,
one row per model (what its sink heads write, whether its layers cancel) and one row per
sink head."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinkscope.probes.mechanism_findings import mechanism_findings
from sinkscope.probes.mechanism_rules import KINDS
from sinkscope.reports.inline_html import bullets, fragment, table

if TYPE_CHECKING:
    from sinkscope.probes.mechanism import MechanismComparison

MODEL_COLUMNS = (
    ("source", ""),
    ("kind", ""),
    ("model", ""),
    ("layers x heads", ""),
    ("sink heads", ""),
    ("value-weighted anchor share (sink heads)", ".3f"),
    ("anchor value norm (sink heads)", ".3g"),
    ("cancellation \u2016\u03a3\u2016 / \u03a3\u2016\u00b7\u2016", ".3g"),
    ("writes the anchor's value", ""),
    ("layers cancel", ""),
)
HEAD_COLUMNS = (
    ("source", ""),
    ("layer", ""),
    ("head", ""),
    ("anchor mass", ".3f"),
    ("value-weighted anchor share", ".3f"),
    ("anchor value norm", ".3g"),
    ("head output norm", ".3g"),
    ("dormant", ""),
)


def mechanism_html(comparison: MechanismComparison) -> str:
    models = [
        (
            m.source,
            m.kind,
            m.model,
            f"{m.n_layers} x {m.n_heads}",
            m.n_sink_heads,
            m.sink_value_weighted_anchor_share,
            m.sink_anchor_value_norm,
            m.cancellation,
            m.writes_anchor,
            m.layers_cancel,
        )
        for m in comparison.models
    ]
    heads = [
        (
            h.source,
            h.layer,
            h.head,
            h.anchor_mass,
            h.value_weighted_anchor_share,
            h.anchor_value_norm,
            h.head_out_norm,
            h.dormant,
        )
        for h in comparison.heads
    ]
    parts = [
        bullets(mechanism_findings(comparison)),
        table(MODEL_COLUMNS, models, caption="Per model"),
        table(HEAD_COLUMNS, heads, caption="Every sink head", scroll=len(heads) > 12),
    ]
    kinds = ", ".join(f"{sum(m.kind == kind for m in comparison.models)} {kind}" for kind in KINDS)
    return fragment("Toy and pretrained side by side", f"{kinds} models; {len(comparison.heads)} sink heads", parts)
