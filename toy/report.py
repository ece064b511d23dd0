"""Report content for toy result directories: a probe (``sinkscope toy probe``),
activation patching (``sinkscope toy patch``), a trade-off (``sinkscope toy tradeoff``)
and a sweep (``sinkscope toy sweep``); a reproduction's is in
``sinkscope.toy.reproduction_report``, and ``REPORT_KINDS`` names them all. Each builder reads the directory's JSON back into its dataclasses and
returns a ``ReportDocument`` whose findings are sentences made from the numbers;
``sinkscope.reporting`` renders it."""

from __future__ import annotations

import math
from pathlib import Path

from sinkscope.infra.codec import read_result
from sinkscope.infra.provenance import read_provenance
from sinkscope.interp.attention_kinds import NORMALISED_KINDS
from sinkscope.probes.head_ablation_report import head_ablation_findings, head_ablation_table
from sinkscope.probes.probe import ProbeResult
from sinkscope.probes.report_sections import (
    default_state_chart,
    default_state_finding,
    default_state_table,
    head_table,
    layer_table,
    patching_effects_chart,
    patching_finding,
    patching_table,
    probe_config_block,
    provenance_block,
    sink_head_phrase,
    sink_rate_phrase,
    sink_rules_phrase,
    value_share_phrase,
)
from sinkscope.probes.tables import HEAD_CLASS_NOTE
from sinkscope.reports.document import (
    Paragraph,
    ReportDocument,
    Section,
    config_block,
    sig,
)
from sinkscope.reports.write import ReportKind
from sinkscope.toy.evaluate import ToyDefaultState
from sinkscope.toy.experiment import SUMMARY_FILE
from sinkscope.toy.mitigations import MITIGATIONS_FILE
from sinkscope.toy.mitigations_report import mitigations_report
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
from sinkscope.toy.report_blocks import (
    RUN_FIGURES,
    WHAT,
    citation_section,
    existing_figures,
    predates_copy_note,
    run_configuration,
    sinks_subject,
    source_name,
    task_block,
    tradeoff_blocks,
    tradeoff_findings,
)
from sinkscope.toy.reproduce import REPRODUCE_FILE
from sinkscope.toy.reproduction_report import reproduction_report
from sinkscope.toy.source_run import SourceRun, read_source_run
from sinkscope.toy.sweep import SWEEP_FILE, SweepResult
from sinkscope.toy.sweep_findings import UNNORMALISED_MEANING, sweep_findings
from sinkscope.toy.sweep_plots import figure_captions
from sinkscope.toy.tables import sweep_tables
from sinkscope.toy.tradeoff import (
    TRADEOFF_FILE,
    TradeoffResult,
)
from sinkscope.toy.training_curves import SINK_FORMATION_FIGURE, formation_finding

# drawn by the report from patching.json: the largest effects with their intervals
HEADS_EFFECTS_FIGURE = "patching_heads_effects.png"
FORMATION_CAPTION = (
    "sinks during training, one point per logged step (metrics.jsonl), each on that step's training batch of 128 "
    "sequences: sink rate per ε over (sequence, layer, head), heads with BOS mass >= 0.9, each layer's BOS mass at "
    "non-trigger queries (mean over heads); no interval recorded"
)
POSITIONS_EFFECTS_FIGURE = "patching_positions_effects.png"

# probe ------------------------------------------------------------------------------


def _probe_findings(probe: ProbeResult, state: ToyDefaultState, name: str) -> list[str]:
    """The probe's findings: sink heads, default state, sink rate, value share, cancellation."""
    sinks = [head for head in probe.heads if head.is_sink_head]
    findings = [
        sink_head_phrase(
            probe.heads, probe.config.sink_eps, f"at non-trigger queries, {probe.n_inputs:,} test sequences"
        ),
        (f"{name}: " + default_state_finding(state.all_sink_heads, WHAT, sinks_subject(state), probe.n_inputs))
        if state.all_sink_heads is not None
        else f"Default-state test: {state.note}.",
        f"Sink rate (Gu et al.: the share of (sequence, layer, head) entries whose mean attention on BOS, over "
        f"the queries from BOS on, exceeds ε): {sink_rate_phrase(probe.sink_rates)}.",
        *filter(None, [sink_rules_phrase(probe)]),
        *head_ablation_findings(state.rows, state.all_sink_heads, WHAT, probe.n_inputs),
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
    if probe.model.attention not in NORMALISED_KINDS:
        masses = [head.row_mass for head in probe.heads if not math.isnan(head.row_mass)]
        row_mass = sig(sum(masses) / len(masses)) if masses else "not measured"
        findings.append(UNNORMALISED_MEANING.format(kind=probe.model.attention, row_mass=row_mass))
    return findings + list(probe.notes)


def _probe_default_state(state: ToyDefaultState, name: str, figure_dir: Path, n_inputs: int) -> Section:
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
            *filter(None, [head_ablation_table(state.tested_rows(), WHAT, n_inputs)]),
        ),
    )


def _probe_configuration(source: Path, probe: ProbeResult, run: SourceRun | None) -> Section:
    """The probed model, the probe's settings, the training run's (as copied) and provenance."""
    return run_configuration(
        source, [config_block("Model (as probed)", probe.model), probe_config_block("Probe", probe.config)], run
    )


def probe_report(source: Path, figure_dir: Path) -> ReportDocument:
    probe = read_result(source / PROBE_FILE, ProbeResult, "regenerate it with sinkscope toy probe")
    state = read_result(source / DEFAULT_STATE_FILE, ToyDefaultState, "regenerate it with sinkscope toy probe")
    run = read_source_run(source, "toy probe")  # the run as it was probed: never the run's path again
    name = source_name(source, run)
    findings = _probe_findings(probe, state, name)
    findings += [] if run is not None else [predates_copy_note(source, "toy probe")]
    sink_figures = existing_figures(
        source,
        [
            (ANCHOR_MASS_FIGURE, "BOS mass at non-trigger queries (layer x head)"),
            (SHARE_FIGURE, "value-weighted anchor share (layer x head)"),
        ],
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
                    "on BOS. " + HEAD_CLASS_NOTE,
                ),
            ),
        ),
        Section("Layers", (layer_table(probe),)),
        _probe_default_state(state, name, figure_dir, probe.n_inputs),
    ]
    formation = existing_figures(source, [(SINK_FORMATION_FIGURE, FORMATION_CAPTION)])
    if formation:
        sections.append(Section("Sinks during training", tuple(formation)))
        finding = formation_finding(run.records(), name) if run is not None else None
        findings += [finding] if finding else []
    # the training run's heatmaps as the probe copied them: a report reads only its own directory
    copied = [(figure, f"{name}: {caption}") for figure, caption in RUN_FIGURES if (source / figure).is_file()]
    if copied:  # a run that was never evaluated has no heatmaps to copy
        sections.append(Section("Attention heatmaps", tuple(existing_figures(source, copied))))
    sections += [_probe_configuration(source, probe, run), citation_section()]
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
        f"{name}: triggered inputs patched into copies whose trigger (position {trigger + 1}, counting BOS as "
        f"position 1 as everywhere in this report) is a content token; metric: {TRIGGER_METRIC} (1 = the triggered "
        "output).",
        patching_finding(result.per_head),
        patching_finding(result.per_position),
    ]
    if at_trigger:
        findings.append(
            "resid_pre patched at the trigger position: normalised effect "
            + ", ".join(f"{row.normalised_effect:+.2f} in layer {row.layer}" for row in at_trigger)
            + "."
        )
    # both halves carry the run's notes (each file stands alone): say each once
    return findings + list(dict.fromkeys([*result.per_head.notes, *result.per_position.notes]))


def _patch_configuration(source: Path, result: TriggerPatching, run: SourceRun | None) -> Section:
    """The patched model, the training run's model and task (as copied) and provenance."""
    return run_configuration(source, [config_block("Model", result.per_head.model)], run, with_training=False)


def patch_report(source: Path, figure_dir: Path) -> ReportDocument:
    result = read_result(source / PATCHING_FILE, TriggerPatching, "regenerate it with sinkscope toy patch")
    run = read_source_run(source, "toy patch")  # the run as it was patched: never the run's path again
    name = source_name(source, run)
    findings = _patch_findings(name, result)
    findings += [] if run is not None else [predates_copy_note(source, "toy patch")]
    sections = [
        Section(
            "Heads (z)",
            (
                *existing_figures(source, [(HEADS_FIGURE, f"{name}: z patched per (layer, head), normalised effect")]),
                patching_effects_chart(
                    result.per_head, figure_dir / HEADS_EFFECTS_FIGURE, f"{name}: z patched per head"
                ),
                patching_table(result.per_head, "z patched per head"),
            ),
        ),
        Section(
            "Positions (resid_pre)",
            (
                *existing_figures(
                    source, [(POSITIONS_FIGURE, f"{name}: resid_pre patched per (layer, position), normalised effect")]
                ),
                patching_effects_chart(
                    result.per_position,
                    figure_dir / POSITIONS_EFFECTS_FIGURE,
                    f"{name}: resid_pre patched per position",
                ),
                patching_table(result.per_position, "resid_pre patched per position"),
            ),
        ),
        _patch_configuration(source, result, run),
        citation_section(),
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
        findings=tuple(tradeoff_findings(result)),
        sections=(
            Section("Trade-off", tuple(tradeoff_blocks(result, figure_dir))),
            Section("Configuration", (task_block(result.task), provenance_block(read_provenance(source)))),
            citation_section(),
        ),
    )


def sweep_report(source: Path, figure_dir: Path) -> ReportDocument:
    result = read_result(source / SUMMARY_FILE, SweepResult, "regenerate it with sinkscope toy sweep")
    captions = figure_captions(result.rows, result.figures)
    figures = existing_figures(source, list(captions.items()))
    return ReportDocument(
        title="Toy sweep: how often do heads sink?",
        subtitle=f"sinkscope toy sweep · {source}",
        findings=tuple(sweep_findings(result)),
        sections=(
            Section("Results", (*sweep_tables(result.rows), *figures)),
            Section("Configuration", (config_block("Sweep", result.config), provenance_block(read_provenance(source)))),
            citation_section(),
        ),
    )


REPORT_KINDS: tuple[ReportKind, ...] = (
    ReportKind("toy reproduction", (SUMMARY_FILE, REPRODUCE_FILE), reproduction_report),
    ReportKind("toy mitigations", (SUMMARY_FILE, MITIGATIONS_FILE), mitigations_report),
    ReportKind("toy probe", (PROBE_FILE, DEFAULT_STATE_FILE), probe_report),
    ReportKind("toy patch", (PATCHING_FILE, HEADS_FILE, POSITIONS_FILE), patch_report),
    ReportKind("toy tradeoff", (TRADEOFF_FILE,), tradeoff_report),
    ReportKind("toy sweep", (SUMMARY_FILE, SWEEP_FILE), sweep_report),
)
