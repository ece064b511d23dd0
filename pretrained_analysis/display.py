"""Inline notebook display (``_repr_html_``) of an audit and of a comparison of audits:
the findings, then the probe's sink map and per-head table, the ablations; for a
comparison, its table and the per-layer anchor mass of every model as one heat map."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinkscope.pretrained_analysis.findings import LOSS, audit_findings, comparison_findings
from sinkscope.pretrained_analysis.geometry_sections import geometry_parts
from sinkscope.pretrained_analysis.tables import ablation_table
from sinkscope.probes.display import default_state_table, probe_parts
from sinkscope.probes.head_ablation_report import head_ablation_table
from sinkscope.probes.sink_curve_tables import curve_tables
from sinkscope.reports.formatting import confidence_label, plural
from sinkscope.reports.html import bullets_html, escape, fragment, heat_grid, inline_table

if TYPE_CHECKING:
    from sinkscope.pretrained_analysis.audit import AuditResult
    from sinkscope.pretrained_analysis.compare import Comparison


def audit_html(result: AuditResult) -> str:
    model = result.model
    subtitle = (
        f"{model.name}{f' @ {model.revision}' if model.revision else ''}: {model.architecture}, "
        f"{model.n_layers} layers x {model.heads_text}; {plural(result.prompts.n_prompts, 'prompt')}; "
        f"anchor: {result.anchor}"
    )
    parts = [bullets_html(audit_findings(result)), *probe_parts(result.probe), *geometry_parts(result)]
    if result.examples:  # in memory only: an audit read back from disk has none
        example = result.examples[0]
        parts.append(
            f"<p>Tokens of prompt {example.prompt_index} (the first attention example; heat maps in the report): "
            f"<code>{escape(' | '.join(example.labels))}</code></p>"
        )
    if result.experiments is not None:
        parts.extend(inline_table(table) for table in curve_tables(result.experiments))
    if result.ablation is not None:
        ablation = result.ablation
        parts.append(inline_table(ablation_table(ablation)))
        parts.append(default_state_table(ablation.default_state, LOSS))
        test = ablation.default_state
        ablations = head_ablation_table(
            test.tested_rows(), LOSS, test.n_inputs, "prompt", confidence_label(test.confidence)
        )
        parts.extend([inline_table(ablations)] if ablations is not None else [])
    return fragment(f"Attention-sink audit: {model.label}", subtitle, parts)


def comparison_html(comparison: Comparison) -> str:
    layer_map = heat_grid(
        [list(row.layer_anchor_mass) for row in comparison.rows],
        "Anchor mass per layer (mean over heads)",
        row_name="model",
        column_name="layer",
        row_labels=[f"{row.label} @ {row.revision}" if row.revision else row.label for row in comparison.rows],
    )
    parts = [bullets_html(comparison_findings(comparison)), inline_table(comparison.table()), layer_map]
    return fragment("Attention-sink comparison", f"{len(comparison.rows)} audits", parts)
