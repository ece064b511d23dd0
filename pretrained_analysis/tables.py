"""The audits' own tables, each defined once for every medium (the report page and its
Markdown, ``comparison.md``, the inline notebook display, the terminal): the ablations'
losses and the comparison of audits. The per-head, per-layer and default-state tables
are the probes' (``sinkscope.probes.tables``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sinkscope.reports.document import Cell, Column, Table, TableDefinition

if TYPE_CHECKING:
    from sinkscope.pretrained_analysis.ablation import AblationResult
    from sinkscope.pretrained_analysis.compare import ComparisonRow

LOSS = "next-token loss"


AblationRow = tuple[str, float, float | None, float | None, float | None]


def ablation_rows(ablation: AblationResult) -> list[AblationRow]:
    """(ablation, loss, change from the unablated loss, the change's 95% interval over
    prompts) per ablation the audit ran; no interval from one prompt or from an audit that
    did not record one."""
    increase = ablation.evict_anchor_increase
    low, high = (increase.ci_low, increase.ci_high) if increase is not None else (None, None)
    return [
        ("none", ablation.base_loss, None, None, None),
        ("anchor evicted from every head", ablation.evict_anchor_loss, ablation.evict_anchor_delta, low, high),
    ]


LOSS_COLUMNS = (Column("ablation"), Column(LOSS, ".4f", numeric=True), Column("change", "+.4f", numeric=True))
LOSS_NOTE = "Losses: per-prompt mean next-token loss, averaged over prompts"


def ablation_table(ablation: AblationResult) -> Table:
    """The loss table: with the change's interval columns where one was measured (two
    prompts or more), without them otherwise (no empty interval to read as one)."""
    rows = ablation_rows(ablation)
    increase = ablation.evict_anchor_increase
    if increase is None or not math.isfinite(increase.ci_low):
        return TableDefinition[AblationRow]("Loss", LOSS_COLUMNS, lambda row: row[:3], note=LOSS_NOTE + ".").table(rows)
    columns = (
        *LOSS_COLUMNS,
        Column("change 95% CI low", "+.4f", numeric=True),
        Column("change 95% CI high", "+.4f", numeric=True),
    )
    note = f"{LOSS_NOTE}; the change's interval is a percentile bootstrap over the prompts (paired)."
    return TableDefinition[AblationRow]("Loss", columns, lambda row: row, note=note).table(rows)


def comparison_definition(epsilons: Sequence[str], with_step: bool = False) -> TableDefinition[ComparisonRow]:
    """One row per audit, a sink-rate column per sink-rate threshold ε in ``epsilons``; the
    training step of each checkpoint ``with_step`` (some audit's step is known)."""

    def cells(row: ComparisonRow) -> tuple[Cell, ...]:
        return (
            row.label,
            row.revision,
            *([row.step] if with_step else []),
            row.n_layers,
            row.n_heads,
            row.n_params,
            *[row.sink_rate[eps] for eps in epsilons],
            row.n_sink_heads,
            row.mean_anchor_mass,
            row.base_loss,
            row.all_sink_heads_loss_delta,
            row.evict_anchor_loss_delta,
            row.directory,
        )

    return TableDefinition(
        "Audits compared",
        (
            Column("model"),
            Column("revision"),
            *([Column("step", ",d", numeric=True)] if with_step else []),
            Column("layers", numeric=True),
            Column("heads", numeric=True),
            Column("parameters", ",d", numeric=True),
            *[Column(f"sink rate ε={eps}", ".1f", numeric=True, unit="%") for eps in epsilons],
            Column("sink heads", numeric=True),
            Column("mean anchor mass", ".3f", numeric=True),
            Column(LOSS, ".3f", numeric=True),
            Column("loss change: all sinks removed", "+.4f", numeric=True),
            Column("loss change: anchor evicted", "+.4f", numeric=True),
            Column("audit directory"),
        ),
        cells,
        "Run `sinkscope report` on an audit directory for its full report.",
    )
