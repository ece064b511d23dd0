"""Report content for pretrained-model audits (``audit.json``) and comparisons
(``comparison.json``): the builders read the results back (``read_audit``,
``read_comparison``) and turn them into ``ReportDocument``s whose findings are
sentences made from the numbers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sinkscope.infra.errors import InputError
from sinkscope.pretrained_analysis.ablation import AblationResult
from sinkscope.pretrained_analysis.audit import (
    AUDIT_FILE,
    LAYER_FIGURE,
    MAP_FIGURE,
    AuditResult,
    read_audit,
)
from sinkscope.pretrained_analysis.compare import (
    COMPARISON_JSON,
    SINK_RATE_FIGURE,
    TRAJECTORY_FIGURE,
    Comparison,
    read_comparison,
)
from sinkscope.pretrained_analysis.compare import LAYER_FIGURE as COMPARISON_LAYER_FIGURE
from sinkscope.pretrained_analysis.compare_figures import layer_caption, sink_rate_caption
from sinkscope.pretrained_analysis.examples import example_heads
from sinkscope.pretrained_analysis.findings import LOSS, audit_findings, comparison_findings, removed_words
from sinkscope.pretrained_analysis.geometry_sections import geometry_sections
from sinkscope.pretrained_analysis.tables import ablation_table
from sinkscope.pretrained_analysis.trajectory_figures import trajectory_caption
from sinkscope.probes.head_ablation_report import head_ablation_table
from sinkscope.probes.layer_tables import span_summary
from sinkscope.probes.probe import ProbeResult, layers_setting
from sinkscope.probes.report_sections import (
    default_state_change_chart,
    default_state_table,
    head_table,
    layer_tables,
    sink_head_threshold,
)
from sinkscope.probes.sink_curve_tables import curve_section
from sinkscope.probes.tables import HEAD_CLASS_NOTE
from sinkscope.reports.document import (
    Block,
    Details,
    KeyValues,
    Paragraph,
    ReportDocument,
    Section,
    config_block,
    result_figures,
)
from sinkscope.reports.formatting import confidence_label, plural
from sinkscope.reports.write import ReportKind


def _figures(directory: Path, names_and_captions: list[tuple[str, str]]) -> list[Block]:
    return result_figures(directory, names_and_captions, "re-run the audit to draw it")


def _prompt_block(result: AuditResult) -> KeyValues:
    prompts = result.prompts
    spec = prompts.spec
    return KeyValues(
        "Prompts",
        (
            ("source", spec.source),
            ("kind", spec.kind),
            ("location", prompts.location),
            (
                "prompts",
                f"{prompts.n_prompts} used of {prompts.n_available} available "
                f"(requested {spec.n_prompts}, seed {spec.seed})",
            ),
            ("tokens", f"{prompts.n_tokens:,} in all, {prompts.min_tokens} to {prompts.max_tokens} per prompt"),
            ("max tokens per prompt (BOS included)", str(spec.max_len)),
            ("truncated", str(prompts.n_truncated)),
            (
                "BOS convention",
                "prepend_bos: a BOS first where the tokenizer has one"
                if spec.prepend_bos
                else "no BOS prepended (raw tokenizer)",
            ),
            ("anchor", result.anchor),
            ("text column / split", f"{spec.text_column} / {spec.split}"),
        ),
    )


def _null_and_gate_notes(probe: ProbeResult) -> str:
    """The per-head table's notes on null mass (learned sink logits) and on the gate of a
    doubled q_proj (Qwen3-Next), for the models that have them."""
    learned = not bool(probe.matrix("null_mass").isnan().all())  # a model with learned sink logits
    learned_note = (
        "null_mass: mean of 1 \u2212 row sum over the same queries, the mass the head's learned sink logit "
        "takes from every key; "
        if learned
        else ""
    )
    gated = not bool(probe.matrix("gated_anchor_norm").isnan().all())  # a query gate (Qwen3-Next)
    gate_note = (
        "gate_default: the mean gate \u03c3 over the same queries and the head's output elements; gated_anchor_norm: "
        "mean of A[i, a] \u2016g_i \u2299 v_a\u2016, the anchor's term in the head's output after the gate; "
        if gated
        else ""
    )
    return learned_note + gate_note


def _audit_measurements(source: Path, result: AuditResult) -> list[Section]:
    """The sink map, the per-head and per-layer tables, and the attention heatmaps."""
    probe = result.probe
    learned = not bool(probe.matrix("null_mass").isnan().all())  # a model with learned sink logits
    sections = [
        Section(
            "Sink map",
            tuple(
                _figures(
                    source,
                    [
                        (
                            MAP_FIGURE,
                            "anchor mass"
                            + (" and null mass (the learned sink's)" if learned else "")
                            + " per layer and head",
                        ),
                        (LAYER_FIGURE, "anchor mass per layer: mean and max over heads, share of sink heads"),
                    ],
                )
            ),
        ),
        Section(
            "Heads",
            (
                *_sink_list(result),
                head_table(
                    probe.heads,
                    "Per head",
                    f"anchor_mass: mean attention on the anchor ({result.anchor}) over queries after it that can "
                    f"see it ({probe.n_queries:,} queries after it); {_null_and_gate_notes(probe)}"
                    "alpha: Gu et al.'s alpha over the queries that see the anchor; *_all_queries: over every query, "
                    "shown where a sliding window or chunk hides the anchor from some; value_weighted_anchor_share: share of the head's output norm coming from "
                    "the anchor; row_entropy: normalised by log(#visible keys); dormant: low entropy with mass on the anchor. "
                    + HEAD_CLASS_NOTE,
                ),
            ),
        ),
        Section("Layers", layer_tables(probe)),
        *geometry_sections(source, result),
    ]
    names = [name for name in result.figures if name.startswith("attention_example_")]
    shown = _example_heads_text(result)
    examples = [
        (name, f"attention on prompt {k}{_prompt_excerpt(result, k)} (query y, key x); {shown}")
        for k, name in enumerate(names)
    ]
    if examples:
        sections.append(Section("Attention heatmaps", tuple(_figures(source, examples))))
    return sections


PROMPT_CAPTION_CHARS = 160


def _example_heads_text(result: AuditResult) -> str:
    """Which heads the heatmaps show and why, of how many (as ``example_heads`` chose them)."""
    chosen = example_heads(result.probe)
    n_sinks = sum(head.is_sink_head for head in result.probe.heads)
    top = [f"L{layer}H{head}" for (layer, head), role in chosen if not role.startswith("contrast")]
    contrast = [f"L{layer}H{head}" for (layer, head), role in chosen if role.startswith("contrast")]
    shown = (
        f"the {len(top)} strongest of the {n_sinks} sink heads by anchor mass ({', '.join(top)})"
        if n_sinks
        else f"no head is a sink head, so the {len(top)} with the largest anchor mass ({', '.join(top)})"
    )
    if contrast:
        shown += f" and, for contrast, {contrast[0]} (the head with the least anchor mass)"
    return f"heads shown: {shown}, of {len(result.probe.heads)} heads"


def _sink_list(result: AuditResult) -> list[Block]:
    """Every sink head, strongest first, with its anchor mass: a count and the whole list."""
    sinks = sorted((head for head in result.probe.heads if head.is_sink_head), key=lambda head: -head.anchor_mass)
    if not sinks:
        return []
    items = tuple(f"L{head.layer}H{head.head} ({head.anchor_mass:.3f})" for head in sinks)
    return [
        Details(f"{plural(len(sinks), 'sink head')} of {len(result.probe.heads)}, largest anchor mass first", items)
    ]


def _prompt_excerpt(result: AuditResult, index: int) -> str:
    """``: "the prompt's text"`` for a caption, whitespace collapsed and cut at a word
    near ``PROMPT_CAPTION_CHARS`` (the renderer escapes it); empty when not recorded."""
    if index >= len(result.example_prompts):
        return ""
    text = " ".join(result.example_prompts[index].split())
    if len(text) > PROMPT_CAPTION_CHARS:
        cut = text[:PROMPT_CAPTION_CHARS]
        text = (cut.rsplit(" ", 1)[0] if " " in cut[PROMPT_CAPTION_CHARS // 2 :] else cut) + " …"
    return f': "{text}"'


def _ablation_section(ablation: AblationResult, label: str, figure_dir: Path) -> Section:
    """The loss, the anchor evicted from every head, and sink removal against its control."""
    blocks: list[Block] = []
    test = ablation.default_state
    rows = test.tested_rows()
    if rows:
        blocks.append(
            default_state_change_chart(
                [row.label for row in rows],
                rows,
                LOSS,
                figure_dir / "ablation.png",
                f"{label}: removing sinks vs the matched control",
                test.n_inputs,
                confidence_label(test.confidence),
            )
        )
    blocks.append(ablation_table(ablation))
    if rows:
        _, heads, order = removed_words(ablation)
        caption = (
            f"{'Learned-sink' if ablation.sink == 'learned' else 'Sink'} removal per head ({len(test.rows)} of "
            f"{len(test.sink_heads)} {heads} alone, {order}) and for all of them, on {plural(test.n_inputs, 'prompt')}"
        )
        level = confidence_label(test.confidence)
        blocks.append(default_state_table(rows, LOSS, caption, test.n_inputs, level))
        blocks.extend(filter(None, [head_ablation_table(rows, LOSS, test.n_inputs, "prompt", level)]))
    else:
        blocks.append(Paragraph(f"Sink removal not run: {ablation.default_state.note}."))
    return Section("Ablations", tuple(blocks))


def _model_block(result: AuditResult) -> KeyValues:
    """The model's settings, then every layer's attention span in one row."""
    block = config_block("Model", result.model)
    return replace(block, items=(*block.items, ("attention spans", span_summary(result.probe.model))))


def _audit_configuration(result: AuditResult) -> Section:
    return Section(
        "Configuration",
        (
            _model_block(result),
            _prompt_block(result),
            config_block(
                "Audit",
                result.config,
                {
                    "sink_eps": sink_head_threshold(result.config.sink_eps),
                    "layers": layers_setting(result.config.layers),
                },
            ),
            KeyValues(
                "Provenance",
                (("command", "sinkscope audit"), ("seconds", f"{result.seconds:.1f}"), *result.versions),
            ),
        ),
    )


def audit_report(source: Path, figure_dir: Path) -> ReportDocument:
    result = read_audit(source)
    model = result.model
    sections = _audit_measurements(source, result)
    if result.ablation is not None:
        sections.append(_ablation_section(result.ablation, model.label, figure_dir))
    if result.experiments is not None:
        sections.append(curve_section(result.experiments, figure_dir, model.label))
    sections.append(_audit_configuration(result))
    revision = f" at revision {model.revision}" if model.revision else ""
    return ReportDocument(
        title=f"Attention-sink audit: {model.label}",
        subtitle=f"sinkscope audit · {model.name}{revision} · {source}",
        findings=tuple(audit_findings(result)),
        sections=tuple(sections),
    )


def _check_audit_directories(source: Path, comparison: Comparison) -> None:
    """A report reads only inside its result directory, whatever the JSON says."""
    root = source.resolve()
    for row in comparison.rows:
        if row.directory and root not in (root / row.directory).resolve().parents:
            raise InputError(
                f"{source / COMPARISON_JSON} names an audit directory {row.directory!r} outside {source}; "
                "a comparison's audits live inside it: regenerate it with sinkscope audit"
            )


def comparison_report(source: Path, figure_dir: Path) -> ReportDocument:
    comparison = read_comparison(source)
    _check_audit_directories(source, comparison)
    rows = comparison.rows
    maps = [
        (f"{row.directory}/{MAP_FIGURE}", f"{row.label}: anchor mass per layer and head")
        for row in rows
        if row.directory
    ]
    first_audit = source / rows[0].directory if rows and rows[0].directory else None
    versions = (
        read_audit(first_audit).versions if first_audit is not None and (first_audit / AUDIT_FILE).is_file() else ()
    )
    sections = [
        Section(
            "Models",
            (comparison.table(),),
        ),
        Section(
            "Sink rate and anchor mass",
            tuple(
                _figures(
                    source,
                    [
                        (SINK_RATE_FIGURE, sink_rate_caption(comparison)),
                        (COMPARISON_LAYER_FIGURE, layer_caption(comparison)),
                        *([(TRAJECTORY_FIGURE, trajectory_caption(comparison))] if comparison.trajectories() else []),
                    ],
                )
            ),
        ),
    ]
    if maps:
        sections.append(Section("Sink maps", tuple(_figures(source, maps))))
    sections.append(
        Section(
            "Configuration",
            (
                config_block("Prompts", comparison.prompts),
                KeyValues(
                    "Provenance",
                    (("command", "sinkscope compare, or sinkscope audit of several models or revisions"), *versions),
                ),
            ),
        )
    )
    return ReportDocument(
        title="Attention-sink comparison",
        subtitle=f"sinkscope audit · {len(rows)} models · {source}",
        findings=tuple(comparison_findings(comparison)),
        sections=tuple(sections),
    )


REPORT_KINDS: tuple[ReportKind, ...] = (
    ReportKind("comparison", (COMPARISON_JSON,), comparison_report),
    ReportKind("audit", (AUDIT_FILE,), audit_report),
)
