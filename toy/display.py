"""Inline notebook display (``_repr_html_``) of toy results: an evaluated model, a
reproduction (the paper's checks first) and a sweep, with the tables the reports show
(``sinkscope.toy.tables``); every model's anchor mass per (layer, head) as one sink map
with sink heads outlined (``anchor_mass_maps``, which the reproduction's report draws too)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sinkscope.probes.sink_metrics import SINK_EPS
from sinkscope.reports.document import HeadMaps
from sinkscope.reports.formatting import plural
from sinkscope.reports.html import bullets_html, fragment, head_maps_html, inline_table
from sinkscope.toy.paper_reference import PAPER_CITATION
from sinkscope.toy.tables import EVALUATION_TABLE, MODEL_TABLE, sweep_tables

if TYPE_CHECKING:
    from sinkscope.probes.probe import HeadProbe
    from sinkscope.toy.evaluate import ModelEvaluation
    from sinkscope.toy.experiment import ModelSummary
    from sinkscope.toy.reproduce import ReproduceSummary
    from sinkscope.toy.sweep import SweepResult


def anchor_mass_maps(models: Sequence[tuple[str, Sequence[HeadProbe]]]) -> HeadMaps:
    """The sink map of toy models: one layer x head panel per model, BOS mass over
    non-trigger queries; ``models`` are (name, per-head rows) pairs."""
    panels = []
    for name, rows in models:
        width = max((row.head + 1 for row in rows), default=0)
        values = [[float("nan")] * width for _ in range(max((row.layer + 1 for row in rows), default=0))]
        for row in rows:
            values[row.layer][row.head] = row.anchor_mass
        panels.append((name, tuple(tuple(layer) for layer in values)))
    return HeadMaps(
        "BOS mass over non-trigger queries (layer x head)",
        "mean attention on BOS",
        tuple(panels),
        tuple(frozenset((row.layer, row.head) for row in rows if row.is_sink_head) for _, rows in models),
        f"sink heads, \u2265 {1 - SINK_EPS:g}",
    )


def model_html(model: ModelSummary) -> str:
    subtitle = (
        f"{model.attention} attention, {plural(model.n_layers, 'layer')} x {plural(model.n_heads, 'head')}, "
        f"seed {model.seed}"
    )
    parts = [
        inline_table(MODEL_TABLE.table([model])),
        head_maps_html(anchor_mass_maps([(model.name, model.heads)])),
    ]
    return fragment(f"Toy model {model.name}", subtitle, [*parts, citation_html()])


def evaluation_html(evaluation: ModelEvaluation) -> str:
    name = f"{evaluation.attention}-{evaluation.n_layers}x{evaluation.n_heads}"
    subtitle = (
        f"{evaluation.n_sequences:,} held-out sequences, trigger at 1-indexed position "
        f"{evaluation.trigger_position_1indexed}"
    )
    parts = [
        inline_table(EVALUATION_TABLE.table([evaluation])),
        head_maps_html(anchor_mass_maps([(name, evaluation.heads)])),
    ]
    return fragment(f"Toy model {name}", subtitle, [*parts, citation_html()])


def reproduction_html(summary: ReproduceSummary) -> str:
    passed = sum(check.passed for check in summary.checks)
    findings = [f"{passed} of {len(summary.checks)} checks of the paper's claims pass."] + [
        f"FAILED: {check.claim} ({check.detail})" for check in summary.checks if not check.passed
    ]
    subtitle = f"{plural(len(summary.models), 'model')}, {summary.wall_seconds:.0f} s"
    parts = [
        bullets_html(findings),
        inline_table(MODEL_TABLE.table(summary.models)),
        head_maps_html(anchor_mass_maps([(m.name, m.heads) for m in summary.models])),
    ]
    return fragment("Toy reproduction", subtitle, [*parts, citation_html()])


def sweep_html(result: SweepResult) -> str:
    subtitle = (
        f"{plural(len(result.rows), 'configuration')}, {plural(len(result.models), 'model')}, "
        f"{result.wall_seconds:.0f} s"
    )
    tables = [inline_table(table) for table in sweep_tables(result.rows)]
    return fragment("Toy sweep", subtitle, [*tables, citation_html()])


def citation_html() -> str:
    """The paper the toy task comes from, as the last line of every toy display."""
    return f'<p class="sub">{html.escape(PAPER_CITATION)}</p>'
