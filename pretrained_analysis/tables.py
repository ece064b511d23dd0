"""The audits' own tables, each defined once for every medium (the report page and its
Markdown, ``comparison.md``, the inline notebook display, the terminal): the ablations'
losses and the comparison of audits. The per-head, per-layer and default-state tables
are the probes' (``sinkscope.probes.tables``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sinkscope.reports.document import Cell, Column, TableDefinition

if TYPE_CHECKING:
    from sinkscope.pretrained_analysis.ablation import AblationResult
    from sinkscope.pretrained_analysis.compare import ComparisonRow

LOSS = "next-token loss"


def ablation_rows(ablation: AblationResult) -> list[tuple[str, float, float | None]]:
    """(ablation, loss, change from the unablated loss) per ablation the audit ran."""
    return [
        ("none", ablation.base_loss, None),
        ("anchor evicted from every head", ablation.evict_anchor_loss, ablation.evict_anchor_delta),
    ]


ABLATION_TABLE: TableDefinition[tuple[str, float, float | None]] = TableDefinition(
    "Loss",
    (Column("ablation"), Column(LOSS, ".4f", numeric=True), Column("change", "+.4f", numeric=True)),
    lambda row: row,
)


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
