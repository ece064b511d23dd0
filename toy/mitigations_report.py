"""The mitigation comparison's table, findings, figure, report and notebook display: one
definition each, rendered to every medium."""

from __future__ import annotations

from pathlib import Path

from sinkscope.infra.codec import read_result
from sinkscope.infra.provenance import read_provenance
from sinkscope.probes.report_sections import provenance_block
from sinkscope.reports.document import Column, Figure, ReportDocument, Section, TableDefinition, config_block
from sinkscope.reports.html import bullets_html, fragment, inline_table
from sinkscope.reports.plots import bar_chart
from sinkscope.toy.experiment import SUMMARY_FILE
from sinkscope.toy.mitigations import CostRange, KindFinding, MitigationsSummary
from sinkscope.toy.report_blocks import citation_section
from sinkscope.toy.tables import MODEL_HEAD_TABLE, MODEL_TABLE

FIGURE = "mitigations.png"


def cost_text(cost: CostRange | None) -> str:
    """``+mean (range low to high, n runs)``; empty where the test did not apply."""
    if cost is None:
        return ""
    if cost.n_runs == 1:
        return f"{cost.mean:+.2e} (1 run)"
    return f"{cost.mean:+.2e} (runs {cost.low:+.2e} to {cost.high:+.2e}, n = {cost.n_runs})"


def _agreement(kind: KindFinding) -> str:
    if kind.agrees is None:
        return "no converged run"
    return "agrees" if kind.agrees else "DISAGREES"


KIND_TABLE: TableDefinition[KindFinding] = TableDefinition(
    "Where each kind's default state lives: predicted and measured",
    (
        Column("kind"),
        Column("predicted"),
        Column("measured"),
        Column("verdict"),
        Column("converged"),
        Column("median steps", ",.0f", numeric=True),
        Column("heads by source"),
        Column("anchor mass", ".3f", numeric=True),
        Column("null mass", ".3f", numeric=True),
        Column("gate default", ".3f", numeric=True),
        Column("gate trigger", ".3f", numeric=True),
    ),
    lambda k: (
        k.kind,
        k.predicted_source,
        k.measured_source,
        _agreement(k),
        f"{k.n_converged} of {k.n_runs}",
        k.median_steps,
        ", ".join(f"{source} {n}" for source, n in k.sources.items() if n),
        k.anchor_mass,
        k.null_mass,
        k.gate_default,
        k.gate_trigger,
    ),
    "Over each kind's converged runs (every architecture and seed). Heads by source: each head's default "
    "source (docs/metrics.md: gate if its mean gate at default queries is at most 0.1, anchor if its anchor mass "
    "is at least 0.9, null if its null mass is, anchor and null if the two together are, quiet rows if an "
    "unnormalised row sums to at most 0.1, else none); measured: the source of most heads other than none. "
    "Masses and gate default: means over the heads at default (non-trigger) queries; gate trigger: at the trigger.",
)

COST_TABLE: TableDefinition[KindFinding] = TableDefinition(
    "What removing each home of the default state costs",
    (
        Column("kind"),
        Column("remove anchor sinks"),
        Column("remove null"),
        Column("open gate"),
        Column("control"),
    ),
    lambda k: (
        k.kind,
        cost_text(k.remove_anchor) or "–",
        cost_text(k.remove_null) or "–",
        cost_text(k.open_gate) or "–",
        cost_text(k.control) or "–",
    ),
    "The increase in default-position MSE when every sink head's anchor is removed, every head's null removed "
    "(kinds with a null slot), every gate forced open (gated kinds), and the matched control (one random visible "
    "non-anchor key masked per query): the mean over converged runs with the range of the runs' means, n runs. "
    "Each run's 95% bootstrap interval over its test sequences is in its summary.json row. – : the test does "
    "not apply (no sink head, anchor mass below 0.9, so no anchor to remove; no null slot; no gate).",
)


def kind_findings(summary: MitigationsSummary) -> list[str]:
    """One sentence per kind: the prediction, the measurement with its n, and the verdict."""
    sentences = []
    for kind in summary.kinds:
        if kind.agrees is None:
            sentences.append(f"{kind.kind}: no run converged ({kind.n_runs} trained); nothing to compare.")
            continue
        counted = kind.sources.get(kind.predicted_source, 0)
        verdict = "as predicted" if kind.agrees else f"DISAGREES with the prediction ({kind.predicted_source})"
        costs = [
            f"{name} {cost_text(cost)}"
            for name, cost in (
                ("removing the anchor sinks", kind.remove_anchor),
                ("removing the null", kind.remove_null),
                ("opening the gate", kind.open_gate),
            )
            if cost is not None
        ]
        cost = f"; default-position MSE change: {', '.join(costs)}" if costs else ""
        control = f" against {cost_text(kind.control)} for the control" if costs and kind.control else ""
        sentences.append(
            f"{kind.kind}: the default state lives in the {kind.measured_source}, {verdict}: "
            f"{counted} of {kind.n_heads} heads measure as {kind.predicted_source}, over {kind.n_converged} of "
            f"{kind.n_runs} runs (converged){cost}{control}."
        )
    return sentences


def draw_mitigation_figure(kinds: list[KindFinding], path: Path) -> None:
    """Anchor mass, null mass and gate at default queries, one group per kind (measured
    kinds only: a kind with no converged run has no bar)."""
    measured = [kind for kind in kinds if kind.n_heads]
    bar_chart(
        [kind.kind for kind in measured],
        [
            ("anchor mass", [kind.anchor_mass for kind in measured]),
            ("null mass", [kind.null_mass for kind in measured]),
            ("gate at default", [kind.gate_default for kind in measured]),
        ],
        path,
        "Where the default state goes: means over heads of converged runs, default queries",
        "mean over heads",
    )


def mitigations_report(source: Path, figure_dir: Path) -> ReportDocument:
    summary = read_result(source / SUMMARY_FILE, MitigationsSummary, "regenerate it with sinkscope toy mitigations")
    n_heads = {kind.kind: kind.n_heads for kind in summary.kinds}
    figures: tuple[Figure, ...] = ()
    if any(n_heads.values()):  # a kind with no converged run has nothing measured to draw
        figure = figure_dir / FIGURE
        draw_mitigation_figure(summary.kinds, figure)
        caption = "mean anchor mass, null mass and gate at default queries per kind; heads per kind: " + ", ".join(
            f"{kind} {n}" for kind, n in n_heads.items() if n
        )
        figures = (Figure(figure, caption + " (no bar where a kind has no null or no gate)", figure_dir),)
    return ReportDocument(
        title="Sink mitigations on the trigger task: where does the default state go?",
        subtitle=f"sinkscope toy mitigations · {source}",
        findings=tuple(kind_findings(summary)),
        sections=(
            Section(
                "Kinds",
                (KIND_TABLE.table(summary.kinds), COST_TABLE.table(summary.kinds), *figures),
            ),
            Section("Models", (MODEL_TABLE.table(summary.models),)),
            Section(
                "Heads",
                (
                    MODEL_HEAD_TABLE.table(
                        [(m.name, head) for m in summary.models for head in m.heads],
                        "Every head of every model",
                        "Over non-trigger (default) queries; default_source per docs/metrics.md. A metric measured "
                        "for no head is left out.",
                    ).without_empty_columns(),
                ),
            ),
            Section(
                "Configuration",
                (config_block("Comparison", summary.config), provenance_block(read_provenance(source))),
            ),
            citation_section(),
        ),
    )


def mitigations_html(summary: MitigationsSummary) -> str:
    """Inline display in a notebook: one finding per kind, then the kinds table."""
    return fragment(
        "Sink mitigations on the trigger task",
        f"{len(summary.models)} models",
        (
            bullets_html(kind_findings(summary)),
            inline_table(KIND_TABLE.table(summary.kinds)),
            inline_table(COST_TABLE.table(summary.kinds)),
        ),
    )
