"""Report content for the side-by-side comparison of toy and pretrained models
(``mechanism.json``, ``sinkscope.probes.mechanism``): its findings, tables, figure and Markdown.

The findings answer the paper's mechanism question from the numbers: where the sink
heads' output comes mostly from the anchor (value-weighted anchor share >= 0.5) and where
it does not (the anchor's value is small), and whether the layers cancel (the norm of the
summed attention outputs far below the sum of their norms).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure as MplFigure
from sinkscope.probes.mechanism import MECHANISM_FILE, MechanismComparison, read_mechanism
from sinkscope.probes.mechanism_findings import mechanism_findings
from sinkscope.probes.mechanism_rules import CANCELS_BELOW, KINDS, WRITES_ANCHOR_SHARE
from sinkscope.reports.document import Column, Figure, KeyValues, Paragraph, ReportDocument, Section, Table, format_cell
from sinkscope.reports.markdown import md_escape
from sinkscope.reports.plots import LABEL_PT, PAGE_WIDTH_IN, SMALL_PT, TICK_PT, TITLE_PT, save_figure
from sinkscope.reports.write import ReportKind

MECHANISM_FIGURE = "mechanism.png"
MECHANISM_MD = "mechanism.md"
MARKERS = {"toy": "o", "pretrained": "^"}
KIND_COLOURS = {"toy": "C0", "pretrained": "C3"}
MAX_COLOURED_SOURCES = 10  # beyond this, colours cannot be told apart: colour by kind
MAX_BAR_LABELS = 30  # bar labels that fit under the axes at TICK_PT


HEAD_COLUMNS = (
    Column("source"),
    Column("kind"),
    Column("model"),
    Column("layer", numeric=True),
    Column("head", numeric=True),
    Column("anchor_mass", ".3f", numeric=True),
    Column("value_weighted_anchor_share", ".3f", numeric=True),
    Column("anchor_value_norm", ".3g", numeric=True),
    Column("head_out_norm", ".3g", numeric=True),
    Column("dormant"),
    Column("layer attn_out_norm", ".3g", numeric=True),
    Column("layer head_out_norm_sum", ".3g", numeric=True),
    Column("model attn_out_norm_of_sum", ".3g", numeric=True),
    Column("model attn_out_sum_of_norms", ".3g", numeric=True),
    Column("cancellation", ".3f", numeric=True),
)


def head_rows(comparison: MechanismComparison) -> tuple[tuple, ...]:
    """One row of ``HEAD_COLUMNS`` per sink head."""
    by_source = {model.source: model for model in comparison.models}
    return tuple(
        (
            head.source,
            head.kind,
            by_source[head.source].model,
            head.layer,
            head.head,
            head.anchor_mass,
            head.value_weighted_anchor_share,
            head.anchor_value_norm,
            head.head_out_norm,
            head.dormant,
            head.layer_attn_out_norm,
            head.layer_head_out_norm_sum,
            by_source[head.source].attn_out_norm_of_sum,
            by_source[head.source].attn_out_sum_of_norms,
            by_source[head.source].cancellation,
        )
        for head in comparison.heads
    )


def head_table(comparison: MechanismComparison) -> Table:
    note = (
        "One row per sink head. value_weighted_anchor_share: ||A[i,a] v_a W_O|| / sum_j ||A[i,j] v_j W_O||; "
        "anchor_value_norm: ||v_a|| of the head's value (before W_O); layer attn_out_norm vs layer "
        "head_out_norm_sum: the head's layer (far apart: its heads cancel); model attn_out_norm_of_sum vs "
        "attn_out_sum_of_norms: all layers (cancellation = their ratio; far below 1: the layers cancel). "
        "Means over the probe's selected queries (toy: non-trigger positions)."
    )
    return Table("Sink heads, toy and pretrained", HEAD_COLUMNS, head_rows(comparison), note)


def models_table(comparison: MechanismComparison) -> Table:
    columns = (
        Column("source"),
        Column("kind"),
        Column("model"),
        Column("attention"),
        Column("layers", numeric=True),
        Column("heads", numeric=True),
        Column("inputs", numeric=True),
        Column("sink heads", numeric=True),
        Column("dormant sink heads", numeric=True),
        Column("mean value_weighted_anchor_share", ".3f", numeric=True),
        Column("attn_out_norm_of_sum", ".3g", numeric=True),
        Column("attn_out_sum_of_norms", ".3g", numeric=True),
        Column("cancellation", ".3f", numeric=True),
        Column("probe"),
        Column("directory"),
    )
    rows = tuple(
        (
            m.source,
            m.kind,
            m.model,
            m.attention,
            m.n_layers,
            m.n_heads,
            m.n_inputs,
            m.n_sink_heads,
            m.n_dormant_sink_heads,
            m.sink_value_weighted_anchor_share,
            m.attn_out_norm_of_sum,
            m.attn_out_sum_of_norms,
            m.cancellation,
            m.origin,
            m.directory,
        )
        for m in comparison.models
    )
    return Table("Models compared", columns, rows, "Models without sink heads are listed here only.")


def mechanism_figure(comparison: MechanismComparison, path: str | os.PathLike) -> MplFigure:
    """Left: anchor mass against value-weighted anchor share, one point per sink head
    (circles toy, triangles pretrained), coloured by source, or by kind when there are
    too many sources to tell apart. Right: each model's cancellation ratio (1: the layers
    add up; near 0: they cancel); a model whose ratio was not measured gets no bar."""
    models = comparison.models
    by_kind = len(models) > MAX_COLOURED_SOURCES
    colours = {
        model.source: (KIND_COLOURS[model.kind] if by_kind else f"C{index % 10}") for index, model in enumerate(models)
    }
    fig = MplFigure(figsize=(PAGE_WIDTH_IN, 4.4), layout="constrained")
    scatter, bars = fig.subplots(1, 2, width_ratios=(1.0, 1.3))
    for model in models:
        heads = [head for head in comparison.heads if head.source == model.source]
        if heads:
            scatter.scatter(
                [head.anchor_mass for head in heads],
                [head.value_weighted_anchor_share for head in heads],
                color=colours[model.source],
                marker=MARKERS.get(model.kind, "o"),
                s=28,
                alpha=0.8,
                label=model.kind if by_kind else f"{model.source} ({model.kind})",
            )
    if not comparison.heads:
        scatter.text(0.5, 0.5, "no sink heads", ha="center", va="center", transform=scatter.transAxes)
    else:
        handles, labels = scatter.get_legend_handles_labels()
        unique = dict(zip(labels, handles))  # by kind: one entry per kind
        fig.legend(
            unique.values(),
            unique.keys(),
            loc="outside lower center",
            ncols=min(3, len(unique)),
            fontsize=TICK_PT,
            frameon=False,
        )
    scatter.axhline(WRITES_ANCHOR_SHARE, color="grey", linewidth=0.8, linestyle="--")
    scatter.set_xlim(-0.02, 1.02)
    scatter.set_ylim(-0.02, 1.02)
    scatter.set_xlabel("attention on the anchor (anchor mass)", fontsize=LABEL_PT)
    scatter.set_ylabel("value-weighted anchor share", fontsize=LABEL_PT)
    scatter.set_title("sink heads: attention vs what they write from the anchor", fontsize=TITLE_PT)
    scatter.tick_params(labelsize=TICK_PT)
    scatter.grid(alpha=0.3)
    positions = np.arange(len(models))
    ratios = [model.cancellation for model in models]
    measured = [k for k, ratio in enumerate(ratios) if not math.isnan(ratio)]
    bars.bar(positions[measured], [ratios[k] for k in measured], color=[colours[models[k].source] for k in measured])
    for k in sorted(set(range(len(models))) - set(measured)):
        bars.text(k, 0.02, "n/a", ha="center", va="bottom", fontsize=SMALL_PT, rotation=90)
    bars.axhline(CANCELS_BELOW, color="grey", linewidth=0.8, linestyle="--")
    step = max(1, math.ceil(len(models) / MAX_BAR_LABELS))  # a sweep holds hundreds of runs
    bars.set_xticks(positions[::step], [model.source for model in models][::step], rotation=30, ha="right")
    bars.tick_params(labelsize=TICK_PT)
    bars.set_ylim(0.0, 1.05)
    bars.set_ylabel("\u2016\u03a3 layer outputs\u2016 / \u03a3 \u2016layer output\u2016", fontsize=LABEL_PT)
    bars.set_title("cancellation across layers (1: none)", fontsize=TITLE_PT)
    bars.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def mechanism_markdown(comparison: MechanismComparison) -> str:
    """The findings and the sink-head table as Markdown (every name escaped)."""
    rows = head_rows(comparison)
    header = [column.name for column in HEAD_COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [
            md_escape(format_cell(value, column.fmt)) if isinstance(value, str) else format_cell(value, column.fmt)
            for value, column in zip(row, HEAD_COLUMNS)
        ]
        lines.append("| " + " | ".join(cells) + " |")
    findings = "\n".join(f"- {md_escape(finding)}" for finding in mechanism_findings(comparison))
    return "# Toy and pretrained sink heads side by side\n\n" + findings + "\n\n" + "\n".join(lines) + "\n"


def mechanism_report(source: Path, figure_dir: Path) -> ReportDocument:
    comparison = read_mechanism(source)
    figure = figure_dir / MECHANISM_FIGURE
    mechanism_figure(comparison, figure)
    sections = (
        Section(
            "Sink heads",
            (
                Figure(figure, "anchor mass vs value-weighted anchor share per sink head; cancellation per model"),
                head_table(comparison),
            ),
        ),
        Section("Models", (models_table(comparison),)),
        Section(
            "How to read it",
            (
                Paragraph(
                    "A sink head whose value-weighted anchor share is near 1 writes the anchor's value; in the toy "
                    "trigger task the layers then cancel it at the default positions. A share near 0 means the "
                    "anchor takes the attention while its value is small, so the head writes little."
                ),
                KeyValues(
                    "Thresholds",
                    (
                        ("writes the anchor's value", f"value_weighted_anchor_share >= {WRITES_ANCHOR_SHARE:g}"),
                        ("layers cancel", f"cancellation < {CANCELS_BELOW:g} (models with 2 or more layers)"),
                    ),
                ),
            ),
        ),
    )
    kinds = " + ".join(f"{sum(m.kind == kind for m in comparison.models)} {kind}" for kind in KINDS)
    return ReportDocument(
        title="Toy and pretrained sink heads side by side",
        subtitle=f"sinkscope compare · {kinds} · {source}",
        findings=tuple(mechanism_findings(comparison)),
        sections=sections,
    )


REPORT_KINDS: tuple[ReportKind, ...] = (ReportKind("mechanism", (MECHANISM_FILE,), mechanism_report),)
