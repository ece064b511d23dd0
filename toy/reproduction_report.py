"""The report of a toy reproduction (``summary.json`` of ``sinkscope toy reproduce``): its
findings, the models and their sink maps, the checks against the paper, the default-state
test, the trade-off and each model's heatmaps."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sinkscope.infra.codec import read_result
from sinkscope.infra.provenance import read_provenance
from sinkscope.probes.report_sections import (
    default_state_chart,
    default_state_finding,
    default_state_table,
    provenance_block,
)
from sinkscope.reports.document import (
    Block,
    Figure,
    KeyValues,
    Paragraph,
    ReportDocument,
    Section,
)
from sinkscope.reports.formatting import plural
from sinkscope.reports.plots import draw_head_maps
from sinkscope.toy.display import anchor_mass_maps
from sinkscope.toy.experiment import SUMMARY_FILE, ModelSummary
from sinkscope.toy.report_blocks import (
    WHAT,
    citation_section,
    existing_figures,
    sinks_subject,
    task_block,
    tradeoff_blocks,
    tradeoff_findings,
)
from sinkscope.toy.reproduce import ReproduceConfig, ReproduceSummary
from sinkscope.toy.tables import CHECK_TABLE, MODEL_HEAD_TABLE, MODEL_TABLE
from sinkscope.toy.tradeoff import (
    TRADEOFF_FILE,
    TradeoffResult,
)


def _model_sentence(models: list[ModelSummary]) -> str:
    parts = []
    for m in models:
        paper = "" if m.paper_n_sink_heads is None else f" (paper {m.paper_n_sink_heads})"
        parts.append(f"{m.name} {m.n_sink_heads}/{len(m.heads)}{paper}")
    return "; ".join(parts)


def _reproduction_findings(summary: ReproduceSummary, tradeoff: TradeoffResult | None) -> list[str]:
    """The reproduction's findings: training, checks, sink heads, default state, trade-off."""
    config, models = summary.config, summary.models
    converged = [m for m in models if m.converged]
    passed = [c for c in summary.checks if c.passed]
    failed = [c for c in summary.checks if not c.passed]
    softmax = [m for m in models if m.attention == "softmax"]
    others = [m for m in models if m.attention != "softmax"]
    findings = [
        f"{plural(len(models), 'model')} trained ({', '.join(config.attentions)} attention; "
        f"{', '.join(f'{layers}x{heads}' for layers, heads in config.architectures)} layers x heads; "
        f"{plural(config.seeds, 'seed')} each); "
        f"{len(converged)} of {len(models)} reached the stopping error within {config.max_steps:,} steps.",
        f"{len(passed)} of {len(summary.checks)} checks against the paper pass"
        + (
            f"; failing: {'; '.join(c.claim for c in failed[:3])}{' ...' if len(failed) > 3 else ''}."
            if failed
            else "."
        ),
    ]
    if softmax:
        findings.append(f"Sink heads in softmax models: {_model_sentence(softmax)}.")
    if others:
        n_sink = sum(m.n_sink_heads for m in others)
        n_heads = sum(len(m.heads) for m in others)
        worst = max(row.row_mass for m in others for row in m.heads)
        reading = " (no sink needed: they attend to nothing off-trigger)" if worst <= 0.05 else ""
        findings.append(
            f"Models without softmax: {n_sink} of {n_heads} heads sink; the largest off-trigger row mass "
            f"of any head is {worst:.3f}{reading}."
        )
    for m in models:
        state = m.default_state
        if state is not None and state.all_sink_heads is not None:
            findings.append(
                f"{m.name}: "
                + default_state_finding(state.all_sink_heads, WHAT, sinks_subject(state), config.n_sequences)
            )
    if tradeoff is not None:
        findings += tradeoff_findings(tradeoff)
    return findings


def _reproduction_default_state(models: list[ModelSummary], figure_dir: Path) -> Section | None:
    """The default-state test of every model that had sink heads (its chart written into
    ``figure_dir``); None when no model was tested."""
    tests = {m.name: m.default_state for m in models if m.default_state is not None}
    together = {name: test.all_sink_heads for name, test in tests.items() if test.all_sink_heads is not None}
    tested = [m for m in models if m.name in together]
    if not tested:
        return None
    chart = default_state_chart(
        [m.name for m in tested],
        [together[m.name] for m in tested],
        WHAT,
        figure_dir / "default_state.png",
        "Removing every sink head's sink",
    )
    rows = [replace(row, label=f"{m.name} {row.label}") for m in tested for row in tests[m.name].tested_rows()]
    untested = [m.name for m in models if m not in tested]
    blocks: list[Block] = [chart, default_state_table(rows, WHAT)]
    if untested:
        blocks.append(Paragraph(f"Not tested (no sink heads, so no sink to remove): {', '.join(untested)}."))
    return Section("Default-state test", tuple(blocks))


def _model_section(source: Path, m: ModelSummary) -> Section:
    """One model's outcome and the figures its run wrote."""
    figures = [
        (name, f"{m.name}: {caption}")
        for name, caption in ((figure, Path(figure).stem.replace("_", " ")) for figure in m.figures)
    ]
    return Section(
        m.name,
        (
            Paragraph(
                f"{m.status} after {plural(m.steps, 'step')}; sink heads: {m.n_sink_heads} of {len(m.heads)}. "
                f"Paper: {m.paper}."
            ),
            *existing_figures(source, figures),
        ),
    )


def _reproduction_configuration(source: Path, config: ReproduceConfig) -> Section:
    """The reproduction's settings, its task and the run's provenance."""
    return Section(
        "Configuration",
        (
            KeyValues(
                "Reproduction",
                (
                    ("seeds", f"{config.seeds} (first {config.first_seed})"),
                    (
                        "architectures (layers x heads)",
                        ", ".join(f"{layers}x{heads}" for layers, heads in config.architectures),
                    ),
                    ("attentions", ", ".join(config.attentions)),
                    ("max steps", f"{config.max_steps:,}"),
                    ("test sequences", f"{config.n_sequences:,}"),
                    ("workers", str(config.workers)),
                ),
            ),
            task_block(config.task),
            provenance_block(read_provenance(source)),
        ),
    )


def reproduction_report(source: Path, figure_dir: Path) -> ReportDocument:
    summary = read_result(source / SUMMARY_FILE, ReproduceSummary, "regenerate it with sinkscope toy reproduce")
    tradeoff = (
        read_result(source / TRADEOFF_FILE, TradeoffResult, "regenerate it with sinkscope toy reproduce")
        if (source / TRADEOFF_FILE).is_file()
        else None
    )
    models = summary.models
    findings = _reproduction_findings(summary, tradeoff)
    sink_figure = figure_dir / "sink_maps.png"
    draw_head_maps(anchor_mass_maps([(m.name, m.heads) for m in models]), sink_figure)
    checks = CHECK_TABLE.table(summary.checks)
    sections = [
        Section(
            "Models",
            (
                MODEL_TABLE.table(models),
                Figure(
                    sink_figure,
                    "layer x head sink map of every model: mean BOS weight over non-trigger queries",
                    figure_dir,
                ),
            ),
        ),
        Section("Checks against the paper", (checks,)),
        Section(
            "Heads",
            (
                MODEL_HEAD_TABLE.table(
                    [(m.name, head) for m in models for head in m.heads],
                    "Every head of every model",
                    "anchor_mass: mean BOS weight over non-trigger queries; anchor_mass_other: BOS weight at the "
                    "trigger query; row_mass: total weight of non-trigger rows (1 for softmax; for ReLU, rows need "
                    "not sum to one and this shows whether the head attends off-trigger at all). A metric measured "
                    "for no head is left out.",
                ).without_empty_columns(),
            ),
        ),
    ]
    default_state = _reproduction_default_state(models, figure_dir)
    if default_state is not None:
        sections.append(default_state)
    sections += [_model_section(source, m) for m in models]
    if tradeoff is not None:
        sections.append(Section("Trade-off (Theorem 1)", tuple(tradeoff_blocks(tradeoff, figure_dir))))
    sections += [_reproduction_configuration(source, summary.config), citation_section()]
    return ReportDocument(
        title="Toy reproduction: trigger-conditional tasks and attention sinks",
        subtitle=f"sinkscope toy reproduce · {source}",
        findings=tuple(findings),
        sections=tuple(sections),
    )
