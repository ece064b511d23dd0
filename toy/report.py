"""Report content for toy result directories: a reproduction (``sinkscope toy
reproduce``), a probe (``sinkscope toy probe``), activation patching (``sinkscope toy
patch``) and a trade-off (``sinkscope toy tradeoff``). Each builder reads the directory's JSON back into its dataclasses and
returns a ``ReportDocument`` whose findings are sentences made from the numbers;
``sinkscope.reporting`` renders it."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from sinkscope.infra.codec import read_result
from sinkscope.infra.provenance import read_provenance
from sinkscope.probes.probe import ProbeResult
from sinkscope.probes.report_sections import (
    default_state_chart,
    default_state_finding,
    default_state_table,
    head_table,
    layer_table,
    patching_finding,
    patching_table,
    probe_config_block,
    provenance_block,
    sink_head_phrase,
    sink_rate_phrase,
    value_share_phrase,
)
from sinkscope.reports.document import (
    Block,
    Figure,
    KeyValues,
    Paragraph,
    ReportDocument,
    Section,
    config_block,
    sig,
)
from sinkscope.reports.plots import draw_head_maps
from sinkscope.reports.write import ReportKind
from sinkscope.toy.display import anchor_mass_maps
from sinkscope.toy.evaluate import MEAN_FIGURE, STD_FIGURE, ToyDefaultState
from sinkscope.toy.experiment import SUMMARY_FILE, ModelSummary
from sinkscope.toy.patching import (
    HEADS_FIGURE,
    HEADS_FILE,
    PATCHING_FILE,
    POSITIONS_FIGURE,
    POSITIONS_FILE,
    TRIGGER_METRIC,
    TriggerPatching,
)
from sinkscope.toy.probe_run import ANCHOR_MASS_FIGURE, DEFAULT_STATE_FILE, PROBE_FILE, SHARE_FIGURE
from sinkscope.toy.reproduce import REPRODUCE_FILE, ReproduceConfig, ReproduceSummary
from sinkscope.toy.run_dir import CONFIG_FILE, RunConfig, read_config
from sinkscope.toy.sweep import SWEEP_FILE, SweepResult
from sinkscope.toy.tables import CHECK_TABLE, MODEL_HEAD_TABLE, MODEL_TABLE, SWEEP_TABLE, TRADEOFF_TABLE
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.tradeoff import (
    CONSTRUCTION_SERIES,
    RELU_SERIES,
    RUN_SERIES_SUFFIX,
    TRADEOFF_FIGURE,
    TRADEOFF_FILE,
    TradeoffResult,
)

WHAT = "default-position MSE"
RUN_FIGURES = (
    (MEAN_FIGURE, "mean attention over the test sequences"),
    (STD_FIGURE, "std of attention over the test sequences"),
)


def _existing_figures(paths_and_captions: list[tuple[Path, str]]) -> list[Block]:
    """Figures that exist; a line naming each missing one (a report never fails on a
    deleted PNG)."""
    blocks: list[Block] = []
    for path, caption in paths_and_captions:
        if path.is_file():
            blocks.append(Figure(path, caption))
        else:
            blocks.append(
                Paragraph(f"Figure {path.name} is missing from {path.parent}; re-run the command that wrote it.")
            )
    return blocks


def _sinks_subject(state: ToyDefaultState) -> str:
    n = len(state.sink_heads)
    return "the sink head" if n == 1 else f"all {n} sink heads"


def task_block(task: TaskConfig) -> KeyValues:
    """The task's settings, its trigger positions counted from 1 as the figures count
    them (the config's fields are 0-indexed, and say so)."""

    def position(label: str, field: str, value: int) -> tuple[str, str]:
        return (f"{label} (1-indexed)", f"{value + 1} ({field} {value}, 0-indexed)")

    return config_block(
        "Task",
        task,
        {
            "train_trigger_min": position(
                "first training trigger position", "train_trigger_min", task.train_trigger_min
            ),
            "train_trigger_max": position("last training trigger position", "train_trigger_max", task.trigger_max),
            "eval_trigger_position": position(
                "eval trigger position", "eval_trigger_position", task.eval_trigger_position
            ),
        },
    )


# reproduction ------------------------------------------------------------------------


def _model_sentence(models: list[ModelSummary]) -> str:
    parts = []
    for m in models:
        paper = "" if m.paper_n_sink_heads is None else f" (paper {m.paper_n_sink_heads})"
        parts.append(f"{m.name} {m.n_sink_heads}/{len(m.heads)}{paper}")
    return "; ".join(parts)


def _tradeoff_findings(result: TradeoffResult) -> list[str]:
    findings = []
    series = result.series
    construction = series.get(CONSTRUCTION_SERIES, ())
    if construction:
        low, high = construction[0], construction[-1]
        findings.append(
            f"Trade-off (Theorem 1): the softmax construction's default-position MSE falls from {sig(low.default_mse)} "
            f"at BOS mass {low.anchor_mass_default:.3f} (scale {low.scale:g}) to {sig(high.default_mse)} at BOS mass "
            f"{high.anchor_mass_default:.4f} (scale {high.scale:g}): small error only with the sink."
        )
    for point in series.get(RELU_SERIES, ()):
        findings.append(
            f"The exact ReLU construction reaches default-position MSE {sig(point.default_mse)} with BOS "
            f"mass {point.anchor_mass_default:.3f}: no sink needed."
        )
    for name, points in result.series.items():
        trained = [p for p in points if p.scale == 1.0]
        if name.endswith(RUN_SERIES_SUFFIX) and trained:
            run = name.removesuffix(RUN_SERIES_SUFFIX)
            findings.append(
                f"{run} as trained: BOS mass {trained[0].anchor_mass_default:.4f}, default-position MSE "
                f"{sig(trained[0].default_mse)}."
            )
    return findings


def _tradeoff_blocks(source: Path, result: TradeoffResult) -> list[Block]:
    points = [(name, point) for name, points in result.series.items() for point in points]
    return [
        *_existing_figures([(source / TRADEOFF_FIGURE, "default-position MSE against BOS mass at default queries")]),
        TRADEOFF_TABLE.table(points),
    ]


def _reproduction_findings(summary: ReproduceSummary, tradeoff: TradeoffResult | None) -> list[str]:
    """The reproduction's findings: training, checks, sink heads, default state, trade-off."""
    config, models = summary.config, summary.models
    converged = [m for m in models if m.converged]
    passed = [c for c in summary.checks if c.passed]
    failed = [c for c in summary.checks if not c.passed]
    softmax = [m for m in models if m.attention == "softmax"]
    others = [m for m in models if m.attention != "softmax"]
    findings = [
        f"{len(models)} models trained ({', '.join(config.attentions)} attention; "
        f"{', '.join(f'{layers}x{heads}' for layers, heads in config.architectures)} layers x heads; "
        f"{config.seeds} seed{'s' if config.seeds > 1 else ''} each); "
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
            findings.append(f"{m.name}: " + default_state_finding(state.all_sink_heads, WHAT, _sinks_subject(state)))
    if tradeoff is not None:
        findings += _tradeoff_findings(tradeoff)
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
        (source / name, f"{m.name}: {caption}")
        for name, caption in ((figure, Path(figure).stem.replace("_", " ")) for figure in m.figures)
    ]
    return Section(
        m.name,
        (
            Paragraph(
                f"{m.status} after {m.steps:,} steps; {m.n_sink_heads} of {len(m.heads)} heads sink. Paper: {m.paper}."
            ),
            *_existing_figures(figures),
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
                Figure(sink_figure, "layer x head sink map of every model: mean BOS weight over non-trigger queries"),
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
        sections.append(Section("Trade-off (Theorem 1)", tuple(_tradeoff_blocks(source, tradeoff))))
    sections.append(_reproduction_configuration(source, summary.config))
    return ReportDocument(
        title="Toy reproduction: trigger-conditional tasks and attention sinks",
        subtitle=f"sinkscope toy reproduce · {source}",
        findings=tuple(findings),
        sections=tuple(sections),
    )


# probe ------------------------------------------------------------------------------


def _source_run_dir(source: Path) -> Path | None:
    """The run a probe or patch directory came from: its provenance's source, else the
    parent (the default layouts ``RUN_DIR/probe`` and ``RUN_DIR/patch``)."""
    provenance = read_provenance(source)
    candidates = [Path(provenance.source)] if provenance is not None and provenance.source else []
    candidates.append(source.resolve().parent)
    return next((path for path in candidates if (path / CONFIG_FILE).is_file()), None)


def _probe_findings(probe: ProbeResult, state: ToyDefaultState, name: str) -> list[str]:
    """The probe's findings: sink heads, default state, sink rate, value share, cancellation."""
    sinks = [head for head in probe.heads if head.is_sink_head]
    findings = [
        sink_head_phrase(
            probe.heads, probe.config.sink_eps, f"at non-trigger queries, {probe.n_inputs:,} test sequences"
        ),
        (f"{name}: " + default_state_finding(state.all_sink_heads, WHAT, _sinks_subject(state)))
        if state.all_sink_heads is not None
        else f"Default-state test: {state.note}.",
        f"Sink rate (Gu et al., alpha over queries from BOS on > sink-rate threshold ε): "
        f"{sink_rate_phrase(probe.sink_rates)} of (sequence, layer, head) entries.",
    ]
    if sinks:
        findings.append(value_share_phrase(sinks, "BOS"))
    if probe.model.n_layers > 1 and probe.attn_out_sum_of_norms > 0:
        ratio = probe.attn_out_norm_of_sum / probe.attn_out_sum_of_norms
        findings.append(
            f"Attention outputs at non-trigger positions: norm of the sum over layers "
            f"{sig(probe.attn_out_norm_of_sum)} vs sum of norms {sig(probe.attn_out_sum_of_norms)} "
            f"(ratio {ratio:.2f}{': the layers cancel' if ratio < 0.1 else ''})."
        )
    return findings + list(probe.notes)


def _probe_default_state(state: ToyDefaultState, name: str, figure_dir: Path) -> Section:
    """The default-state test of the probed run (its chart written into ``figure_dir``), or
    why it was not run."""
    if not state.tested_rows():
        return Section("Default-state test", (Paragraph(f"Not run: {state.note}."),))
    labels = [row.label for row in state.tested_rows()]
    return Section(
        "Default-state test",
        (
            default_state_chart(
                labels,
                state.tested_rows(),
                WHAT,
                figure_dir / "default_state.png",
                f"{name}: removing sinks vs the matched control",
            ),
            default_state_table(state.tested_rows(), WHAT),
        ),
    )


def _run_configuration(
    source: Path, blocks: list[Block], run_config: RunConfig | None, with_training: bool = True
) -> Section:
    """``blocks`` (what the result measured), then the training run's model, task and (if
    ``with_training``) optimisation settings when the run is found, then provenance."""
    if run_config is not None:
        blocks = [
            *blocks,
            config_block("Toy model (training run)", run_config.model),
            task_block(run_config.task),
        ]
        if with_training:
            blocks.append(config_block("Training", run_config.train))
    return Section("Configuration", (*blocks, provenance_block(read_provenance(source))))


def _probe_configuration(source: Path, probe: ProbeResult, run_config: RunConfig | None) -> Section:
    """The probed model, the probe's settings, the training run's (when found) and provenance."""
    return _run_configuration(
        source, [config_block("Model (as probed)", probe.model), probe_config_block("Probe", probe.config)], run_config
    )


def probe_report(source: Path, figure_dir: Path) -> ReportDocument:
    probe = read_result(source / PROBE_FILE, ProbeResult, "regenerate it with sinkscope toy probe")
    state = read_result(source / DEFAULT_STATE_FILE, ToyDefaultState, "regenerate it with sinkscope toy probe")
    run_dir = _source_run_dir(source)
    run_config: RunConfig | None = read_config(run_dir) if run_dir is not None else None
    name = run_dir.name if run_dir is not None else source.name
    findings = _probe_findings(probe, state, name)
    sink_figures = _existing_figures(
        [
            (source / ANCHOR_MASS_FIGURE, "BOS mass at non-trigger queries (layer x head)"),
            (source / SHARE_FIGURE, "value-weighted anchor share (layer x head)"),
        ]
    )
    sections = [
        Section("Sink map", tuple(sink_figures)),
        Section(
            "Heads",
            (
                head_table(
                    probe.heads,
                    "Per head",
                    "anchor_mass: mean BOS weight over non-trigger queries; anchor_mass_other: at the trigger query; alpha: "
                    "Gu et al.'s alpha_0 (mean over all queries); value_weighted_anchor_share: share of the head's output "
                    "norm coming from BOS; row_entropy: normalised by log(#visible keys); dormant: low entropy with mass "
                    "on BOS.",
                ),
            ),
        ),
        Section("Layers", (layer_table(probe.layers),)),
        _probe_default_state(state, name, figure_dir),
    ]
    if run_dir is not None:
        sections.append(
            Section(
                "Attention heatmaps",
                tuple(_existing_figures([(run_dir / figure, f"{name}: {caption}") for figure, caption in RUN_FIGURES])),
            )
        )
    sections.append(_probe_configuration(source, probe, run_config))
    return ReportDocument(
        title=f"Sink probes: {name}",
        subtitle=f"sinkscope toy probe · {source}",
        findings=tuple(findings),
        sections=tuple(sections),
    )


# activation patching ----------------------------------------------------------------


def _patch_findings(name: str, result: TriggerPatching) -> list[str]:
    """The patching findings: the setup, the strongest heads and positions, the trigger's effect."""
    trigger = result.trigger_position
    at_trigger = [
        row for row in result.per_position.rows if row.position == trigger and not math.isnan(row.normalised_effect)
    ]
    findings = [
        f"{name}: triggered inputs patched into copies whose trigger (position {trigger + 1}) is a content "
        f"token; metric: {TRIGGER_METRIC} (1 = the triggered output).",
        patching_finding(result.per_head),
        patching_finding(result.per_position),
    ]
    if at_trigger:
        findings.append(
            "resid_pre patched at the trigger position: normalised effect "
            + ", ".join(f"{row.normalised_effect:+.2f} in layer {row.layer}" for row in at_trigger)
            + "."
        )
    return findings + [*result.per_head.notes, *result.per_position.notes]


def _patch_configuration(source: Path, result: TriggerPatching, run_dir: Path | None) -> Section:
    """The patched model, the training run's model and task (when found) and provenance."""
    run_config = read_config(run_dir) if run_dir is not None else None
    return _run_configuration(source, [config_block("Model", result.per_head.model)], run_config, with_training=False)


def patch_report(source: Path, figure_dir: Path) -> ReportDocument:
    result = read_result(source / PATCHING_FILE, TriggerPatching, "regenerate it with sinkscope toy patch")
    run_dir = _source_run_dir(source)
    name = run_dir.name if run_dir is not None else source.name
    findings = _patch_findings(name, result)
    sections = [
        Section(
            "Heads (z)",
            (
                *_existing_figures(
                    [(source / HEADS_FIGURE, f"{name}: z patched per (layer, head), normalised effect")]
                ),
                patching_table(result.per_head, "z patched per head"),
            ),
        ),
        Section(
            "Positions (resid_pre)",
            (
                *_existing_figures(
                    [(source / POSITIONS_FIGURE, f"{name}: resid_pre patched per (layer, position), normalised effect")]
                ),
                patching_table(result.per_position, "resid_pre patched per position"),
            ),
        ),
        _patch_configuration(source, result, run_dir),
    ]
    return ReportDocument(
        title=f"Activation patching: {name}",
        subtitle=f"sinkscope toy patch · {source}",
        findings=tuple(findings),
        sections=tuple(sections),
    )


# trade-off --------------------------------------------------------------------------


def tradeoff_report(source: Path, figure_dir: Path) -> ReportDocument:
    result = read_result(source / TRADEOFF_FILE, TradeoffResult, "regenerate it with sinkscope toy tradeoff")
    return ReportDocument(
        title="Theorem 1: default-position error vs sink mass",
        subtitle=f"sinkscope toy tradeoff · {source}",
        findings=tuple(_tradeoff_findings(result)),
        sections=(
            Section("Trade-off", tuple(_tradeoff_blocks(source, result))),
            Section("Configuration", (task_block(result.task), provenance_block(read_provenance(source)))),
        ),
    )


def _sweep_findings(result: SweepResult) -> list[str]:
    config = result.config
    findings = [
        f"{len(result.rows)} configurations x {config.seeds} seeds ({len(result.models)} models), "
        f"up to {config.max_steps} steps each."
    ]
    for attention in config.attentions:
        rows = [r for r in result.rows if r.attention == attention]
        heads = sum(r.seeds * r.n_layers * r.n_heads for r in rows)
        sinks = sum(r.sink_fraction * r.seeds * r.n_layers * r.n_heads for r in rows)
        with_sink = sum(r.seeds_with_sink for r in rows)
        converged = sum(r.converged for r in rows)
        seeds = sum(r.seeds for r in rows)
        findings.append(
            f"{attention}: {round(sinks)} of {heads} heads sink ({sinks / heads:.0%}); {with_sink} of {seeds} "
            f"models have at least one sink head; {converged} of {seeds} converged."
        )
    return findings


def sweep_report(source: Path, figure_dir: Path) -> ReportDocument:
    result = read_result(source / SUMMARY_FILE, SweepResult, "regenerate it with sinkscope toy sweep")
    table = SWEEP_TABLE.table(result.rows)
    figures = _existing_figures(
        [(source / name, name.removesuffix(".png").replace("_", " ")) for name in result.figures]
    )
    return ReportDocument(
        title="Toy sweep: how often do heads sink?",
        subtitle=f"sinkscope toy sweep · {source}",
        findings=tuple(_sweep_findings(result)),
        sections=(
            Section("Results", (table, *figures)),
            Section("Configuration", (config_block("Sweep", result.config), provenance_block(read_provenance(source)))),
        ),
    )


REPORT_KINDS: tuple[ReportKind, ...] = (
    ReportKind("toy reproduction", (SUMMARY_FILE, REPRODUCE_FILE), reproduction_report),
    ReportKind("toy probe", (PROBE_FILE, DEFAULT_STATE_FILE), probe_report),
    ReportKind("toy patch", (PATCHING_FILE, HEADS_FILE, POSITIONS_FILE), patch_report),
    ReportKind("toy tradeoff", (TRADEOFF_FILE,), tradeoff_report),
    ReportKind("toy sweep", (SUMMARY_FILE, SWEEP_FILE), sweep_report),
)
