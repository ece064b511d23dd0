"""The sink-circuit battery, presented once for every medium: its table (each edit beside
its control), its figure (the share of anchor mass left per sink head and edit), its
findings, the report document and the inline notebook display."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from sinkscope.infra.codec import read_result
from sinkscope.infra.intervals import MIN_INTERVAL_UNITS, interval_possible
from sinkscope.probes.circuit_edits import control_label
from sinkscope.probes.circuit_result import CircuitRun, EditOutcome
from sinkscope.probes.circuit_transplant import TransplantResult
from sinkscope.probes.default_state import Estimate
from sinkscope.reports.document import Column, Figure, KeyValues, Paragraph, ReportDocument, Section, TableDefinition
from sinkscope.reports.formatting import plural
from sinkscope.reports.html import bullets_html, fragment, inline_table
from sinkscope.reports.plots import heatmap
from sinkscope.reports.write import ReportKind

RESULT_FILE = "circuit.json"
FIGURE_FILE = "circuit_share_left.png"
REMOVES = 0.5  # an edit that leaves under half of the sink's anchor mass is named as removing it
LEAVES = 0.95  # a control that leaves at least this share is named as leaving the sink in place


def _measured(outcomes: list[tuple[str, EditOutcome]]) -> list[tuple[str, EditOutcome]]:
    return [(label, outcome) for label, outcome in outcomes if outcome.applicable and outcome.share_left is not None]


def _outcomes(run: CircuitRun) -> list[tuple[str, EditOutcome]]:
    """Every edit with its row label, controls after their intervention."""
    pairs = []
    for row in run.battery.rows:
        pairs.append((row.label, row.intervention))
        if row.control is not None:
            pairs.append((f"control: {control_label(row.control.edit)}", row.control))
    return pairs


def circuit_findings(run: CircuitRun) -> tuple[str, ...]:
    """What was measured, what removes the sink, what its controls leave, what was not applicable."""
    battery = run.battery
    n, heads = battery.n_inputs, len(battery.sink_heads)
    few = "" if interval_possible(n) else f"; from fewer than {MIN_INTERVAL_UNITS} inputs none is given"
    measured = (
        f"{run.model} on {run.inputs}: {plural(heads, 'sink head')} ({run.sink_rule}), baseline anchor mass "
        f"{battery.baseline_anchor_mass:.3f} (mean over the sink heads of each input's mean over its real queries "
        f"after the anchor, then over the {plural(n, 'input')}). Each edit's share left is the sum over inputs of "
        f"its anchor mass over the baseline's; intervals are 95% paired bootstrap intervals over the inputs "
        f"(n = {n} inputs{few})."
    )
    removing, kept = [], []
    for row in battery.rows:
        share = row.intervention.share_left
        if share is not None and share.mean < REMOVES:
            removing.append(f"{row.label} ({100 * share.mean:.1f}% left)")
        control = row.control
        if control is not None and control.share_left is not None and control.share_left.mean < LEAVES:
            kept.append(f"{control_label(control.edit)} ({100 * control.share_left.mean:.1f}% left)")
    found = (
        "Removes most of the sink: " + "; ".join(removing) + "."
        if removing
        else f"No edit leaves less than {100 * REMOVES:.0f}% of the sink's anchor mass."
    )
    controls = (
        "Every applicable control leaves at least 95% of it."
        if not kept
        else "Controls that moved the sink too (read their rows with care): " + "; ".join(kept) + "."
    )
    missing = sorted({outcome.why_not or "" for _, outcome in _outcomes(run) if not outcome.applicable})
    absent = (
        [f"Not applicable to this model: the edits that need what it lacks ({', '.join(missing)})."] if missing else []
    )
    transplant = transplant_finding(battery.transplant, battery.transplant_note)
    return (measured, found, controls, transplant, *absent)


def _mass(estimate: Estimate) -> str:
    if math.isnan(estimate.ci_low):
        return f"{estimate.mean:.3f}"
    return f"{estimate.mean:.3f} [{estimate.ci_low:.3f}, {estimate.ci_high:.3f}]"


TRANSPLANT_TABLE: TableDefinition[tuple[str, Estimate, int]] = TableDefinition(
    caption="Sink transplant: attention on the transplanted position from later queries",
    columns=(
        Column("setting"),
        Column("mass on the position [95% CI]"),
        Column("heads passing the sink rule on it", numeric=True),
    ),
    cells=lambda row: (row[0], _mass(row[1]), row[2]),
    note=(
        "Mass on the position: the mean of A[i, p] over real queries i > p, per head of the layers after the "
        "edited ones, then over those heads, then over inputs; 95% percentile bootstrap over inputs."
    ),
)


def transplant_rows(result: TransplantResult) -> list[tuple[str, Estimate, int]]:
    return [
        ("baseline", result.baseline, result.sink_heads_baseline),
        (
            f"position {result.position} attends only to itself in the first {plural(result.n_layers, 'layer')}",
            result.transplant,
            result.sink_heads_transplant,
        ),
        (
            f"control: its residual scaled by {result.norm_factor:.3g} (the transplant's norm change)",
            result.control,
            result.sink_heads_control,
        ),
    ]


def transplant_finding(result: TransplantResult | None, note: str) -> str:
    if result is None:
        return f"No sink transplant: {note}."
    new = ", ".join(f"L{layer}H{head}" for layer, head in result.new_sink_heads) or "none"
    return (
        f"Sink transplant: position {result.position}, made to attend only to itself in the first "
        f"{plural(result.n_layers, 'layer')}, then holds {result.transplant.mean:.3f} of each later query's attention "
        f"(mean over the {result.n_heads_read} heads of the later layers; baseline {result.baseline.mean:.3f}, the norm "
        f"control {result.control.mean:.3f}); {result.sink_heads_transplant} of those heads pass the sink rule on it "
        f"(baseline {result.sink_heads_baseline}, control {result.sink_heads_control}); new sink heads: {new}."
    )


def circuit_figure(run: CircuitRun, path: Path) -> Any:
    """Share of anchor mass left: one row per applicable edit, one column per sink head."""
    measured = _measured(_outcomes(run))
    heads = run.battery.sink_heads
    values = np.full((len(measured), len(heads)), math.nan)
    for row, (_, outcome) in enumerate(measured):
        for column, share in enumerate(outcome.heads):
            values[row, column] = share.share_left.mean
    top = max(1.0, float(np.nanmax(values))) if values.size and not np.isnan(values).all() else 1.0
    return heatmap(
        values,
        path,
        f"Share of anchor mass left: {run.model}",
        "share of baseline anchor mass left",
        "sink head",
        "edit",
        vmin=0.0,
        vmax=top,
        cmap="viridis",
        x_tick_labels=[f"L{layer}H{head}" for layer, head in heads],
        y_tick_labels=[label for label, _ in measured],
    )


def _run_facts(run: CircuitRun) -> KeyValues:
    config = run.battery.config
    return KeyValues(
        "What was run",
        (
            ("model", run.model),
            ("inputs", run.inputs),
            ("sink heads", " ".join(f"L{layer}H{head}" for layer, head in run.battery.sink_heads)),
            ("error", run.error_name or "none (no error readout for this model)"),
            ("write layer; key dimensions per sink layer", f"{config.write_layer}; {config.k_dims}"),
            ("later position (position edits)", str(config.position)),
            ("seed (controls, bootstrap); resamples", f"{config.seed}; {config.n_bootstrap}"),
            ("cost", f"{run.seconds:.1f} s"),
        ),
    )


def circuit_document(run: CircuitRun, figure_dir: Path) -> ReportDocument:
    """The report: findings, the table of edits and controls, the per-head figure, the run."""
    figure = []
    if _measured(_outcomes(run)):
        circuit_figure(run, figure_dir / FIGURE_FILE)
        caption = (
            "Share of each sink head's baseline anchor mass left under each applicable edit (sum over inputs "
            "of edited over baseline mass; colour capped at the largest share). Rows: interventions, each "
            "followed by its control."
        )
        figure = [Section("Per sink head", (Figure(figure_dir / FIGURE_FILE, caption, figure_dir),))]
    transplant = run.battery.transplant
    moved = (
        []
        if transplant is None
        else [Section("Sink transplant", (TRANSPLANT_TABLE.table(transplant_rows(transplant)),))]
    )
    sections = (
        Section("Edits and their controls", (run.battery.table(), Paragraph(EDITS_NOTE))),
        *figure,
        *moved,
        Section("Run", (_run_facts(run),)),
    )
    return ReportDocument("Sink circuit", f"{run.model} on {run.inputs}", circuit_findings(run), sections)


EDITS_NOTE = (
    "Edits act on activations through hooks: the query bias is subtracted at hook_q (its control adds a "
    "random vector of the same norm per head); position embeddings are edited at hook_pos_embed (control: "
    "two later positions swapped); a write into the anchor is zeroed at the MLP's or attention's output "
    "(control: the same write at one random later position per input); key dimensions are removed at hook_k "
    "as x[dims] W_K[dims] (control: as many random other dimensions); the anchor's token embedding is "
    "replaced by the input's last real token's at hook_embed. An edit the model has no part for is listed as not applicable."
)


def circuit_html(run: CircuitRun) -> str:
    """Inline notebook display: the findings and the table."""
    return fragment(
        f"Sink circuit: {run.model}",
        run.inputs,
        [bullets_html(list(circuit_findings(run))), inline_table(run.battery.table())],
    )


def _build(result_dir: Path, figure_dir: Path) -> ReportDocument:
    return circuit_document(read_result(result_dir / RESULT_FILE, CircuitRun), figure_dir)


REPORT_KINDS: tuple[ReportKind, ...] = (ReportKind("circuit", (RESULT_FILE,), _build),)
