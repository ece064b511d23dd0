"""Inline notebook display (``_repr_html_``) of the side-by-side comparison: its findings,
one row per model (what its sink heads write, whether its layers cancel) and one row per
sink head, the tables the report shows (``sinkscope.probes.tables``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinkscope.probes.mechanism_distance import DISTANCE_TABLE, toy_distances
from sinkscope.probes.mechanism_findings import mechanism_findings
from sinkscope.probes.mechanism_rules import KINDS
from sinkscope.probes.tables import MECHANISM_HEAD_TABLE, MECHANISM_MODEL_TABLE
from sinkscope.reports.html import bullets_html, fragment, inline_table

if TYPE_CHECKING:
    from sinkscope.probes.mechanism import MechanismComparison


def mechanism_html(comparison: MechanismComparison) -> str:
    distances = toy_distances(comparison)
    parts = [
        bullets_html(mechanism_findings(comparison)),
        *([inline_table(DISTANCE_TABLE.table(distances))] if distances else []),
        inline_table(MECHANISM_MODEL_TABLE.table(comparison.models)),
        inline_table(MECHANISM_HEAD_TABLE.table(comparison.head_pairs())),
    ]
    kinds = ", ".join(f"{sum(m.kind == kind for m in comparison.models)} {kind}" for kind in KINDS)
    return fragment("Toy and pretrained side by side", f"{kinds} models; {len(comparison.heads)} sink heads", parts)
