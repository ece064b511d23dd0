"""Report content for the side-by-side comparison of toy and pretrained models
(``mechanism.json``, ``sinkscope.probes.mechanism``): its findings, tables
(``sinkscope.probes.tables``), figure and Markdown.

The findings answer the paper's mechanism question from the numbers: where the sink
heads' output comes mostly from the anchor (value-weighted anchor share >= 0.5) and where
it does not (the anchor's value is small), and whether the layers cancel (the norm of the
summed attention outputs far below the sum of their norms).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure as MplFigure

from sinkscope.probes.mechanism import MECHANISM_FILE, MechanismComparison, MechanismModel, read_mechanism
from sinkscope.probes.mechanism_distance import DISTANCE_TABLE, toy_distances
from sinkscope.probes.mechanism_findings import mechanism_findings
from sinkscope.probes.mechanism_rules import (
    CANCELLATION_CLOSE_FACTOR,
    CANCELS_BELOW,
    KINDS,
    MEANINGS,
    SHARE_CLOSE,
    WRITES_ANCHOR_SHARE,
)
from sinkscope.probes.tables import MECHANISM_HEAD_TABLE, MECHANISM_MODEL_TABLE
from sinkscope.reports.document import Figure, KeyValues, Paragraph, ReportDocument, Section
from sinkscope.reports.formatting import sig
from sinkscope.reports.markdown import md_escape, table_markdown
from sinkscope.reports.plots import LABEL_PT, PAGE_WIDTH_IN, SMALL_PT, TICK_PT, TITLE_PT, save_figure
from sinkscope.reports.write import ReportKind

MECHANISM_FIGURE = "mechanism.png"
MECHANISM_MD = "mechanism.md"
MARKERS = {"toy": "o", "pretrained": "^"}
KIND_COLOURS = {"toy": "C0", "pretrained": "C3"}
MAX_COLOURED_SOURCES = 10  # beyond this, colours cannot be told apart: colour by kind
MAX_BAR_LABELS = 30  # bar labels that fit under the axes at TICK_PT


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
    _cancellation_bars(bars, models, colours)
    return save_figure(fig, path)


def _cancellation_bars(bars: Axes, models: Sequence[MechanismModel], colours: dict[str, str]) -> None:
    """Each model's cancellation ratio on a log axis, so a toy's 0.0005 and a pretrained
    model's 0.4 are both visible and their distance reads as a factor; each bar carries its
    value. A model whose ratio was not measured gets "n/a"."""
    positions = np.arange(len(models))
    ratios = [model.cancellation for model in models]
    measured = [k for k, ratio in enumerate(ratios) if not math.isnan(ratio) and ratio > 0]
    floor = min([ratios[k] for k in measured] + [0.01]) / 3
    bars.bar(
        positions[measured],
        [ratios[k] - floor for k in measured],
        bottom=floor,
        color=[colours[models[k].source] for k in measured],
    )
    labelled = len(models) <= MAX_BAR_LABELS
    for k in range(len(models)):
        text = "n/a" if k not in measured else sig(ratios[k], 2) if labelled else ""
        y = floor * 1.1 if k not in measured else ratios[k] * 1.1
        bars.text(k, y, text, ha="center", va="bottom", fontsize=SMALL_PT, rotation=90 if k not in measured else 0)
    bars.axhline(CANCELS_BELOW, color="grey", linewidth=0.8, linestyle="--")
    step = max(1, math.ceil(len(models) / MAX_BAR_LABELS))  # a sweep holds hundreds of runs
    bars.set_xticks(positions[::step], [model.source for model in models][::step], rotation=30, ha="right")
    bars.tick_params(labelsize=TICK_PT)
    bars.set_yscale("log")
    bars.set_ylim(floor, 2.0)
    bars.set_ylabel("\u2016\u03a3 layer outputs\u2016 / \u03a3 \u2016layer output\u2016 (log)", fontsize=LABEL_PT)
    bars.set_title("cancellation across layers (1: none; log scale)", fontsize=TITLE_PT)
    bars.grid(axis="y", alpha=0.3)


def mechanism_markdown(comparison: MechanismComparison) -> str:
    """The findings and the sink-head table as Markdown (every name escaped)."""
    findings = "\n".join(f"- {md_escape(finding)}" for finding in mechanism_findings(comparison))
    tables = [MECHANISM_HEAD_TABLE.table(comparison.head_pairs())]
    distances = toy_distances(comparison)
    if distances:
        tables.insert(0, DISTANCE_TABLE.table(distances))
    body = "\n\n".join(table_markdown(table) for table in tables)
    return "# Toy and pretrained sink heads side by side\n\n" + findings + "\n\n" + body + "\n"


def distance_section(comparison: MechanismComparison) -> list[Section]:
    """Each pretrained model's quantities beside the toy's, when both kinds are compared."""
    distances = toy_distances(comparison)
    if not distances:
        return []
    return [Section("Distance from the toy", (DISTANCE_TABLE.table(distances),))]


def mechanism_report(source: Path, figure_dir: Path) -> ReportDocument:
    comparison = read_mechanism(source)
    figure = figure_dir / MECHANISM_FIGURE
    mechanism_figure(comparison, figure)
    sections = (
        Section(
            "Sink heads",
            (
                Figure(
                    figure,
                    "anchor mass vs value-weighted anchor share per sink head; cancellation per model",
                    figure_dir,
                ),
                MECHANISM_HEAD_TABLE.table(comparison.head_pairs()),
            ),
        ),
        *distance_section(comparison),
        Section("Models", (MECHANISM_MODEL_TABLE.table(comparison.models),)),
        Section(
            "How to read it",
            (
                Paragraph(
                    "A sink head whose value-weighted anchor share is near 1 writes the anchor's value; in the toy "
                    "trigger task the layers then cancel it at the default positions. A share near 0 means the "
                    "anchor takes the attention while its value is small, so the head writes little."
                ),
                KeyValues("Quantities", MEANINGS),
                KeyValues(
                    "Thresholds",
                    (
                        ("writes the anchor's value", f"value_weighted_anchor_share >= {WRITES_ANCHOR_SHARE:g}"),
                        ("layers cancel", f"cancellation < {CANCELS_BELOW:g} (models with 2 or more layers)"),
                        ("share close to the toy's", f"|difference of the means| <= {SHARE_CLOSE:g}"),
                        (
                            "cancellation close to the toy's",
                            f"within a factor of {CANCELLATION_CLOSE_FACTOR:g} of the nearest toy model's",
                        ),
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
