"""The toy results' tables, each defined once (columns, labels, formats, caption, note)
for every medium: the report page and its Markdown, the inline notebook display and the
terminal summary the CLI prints. The models overview, the paper's checks, the sweep's
configurations and the trade-off's points; per-head tables are the probes' own
(``sinkscope.probes.tables.HEAD_TABLE``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sinkscope.probes.sink_metrics import SINK_EPS
from sinkscope.probes.tables import HEAD_TABLE
from sinkscope.reports.document import Cell, Column, Table, TableDefinition
from sinkscope.reports.formatting import value_range
from sinkscope.toy.tradeoff import TradeoffPoint, point_label

if TYPE_CHECKING:
    from sinkscope.probes.probe import HeadProbe
    from sinkscope.toy.evaluate import ModelEvaluation
    from sinkscope.toy.experiment import ModelSummary
    from sinkscope.toy.reproduce import Check
    from sinkscope.toy.sweep import SweepRow

HELDOUT_LINF = Column("held-out L-inf", ".2e", numeric=True)
HELDOUT_MSE = Column("held-out MSE", ".2e", numeric=True)

MODEL_TABLE: TableDefinition[ModelSummary] = TableDefinition(
    "One row per trained model",
    (
        Column("model"),
        Column("attention"),
        Column("layers", numeric=True),
        Column("heads", numeric=True),
        Column("seed", numeric=True),
        Column("converged"),
        Column("steps", numeric=True),
        Column("seconds", ".0f", numeric=True),
        Column("batch L-inf", ".2e", numeric=True),
        HELDOUT_LINF,
        HELDOUT_MSE,
        Column("sink heads", numeric=True),
        Column("paper sink heads", numeric=True),
    ),
    lambda m: (
        m.name,
        m.attention,
        m.n_layers,
        m.n_heads,
        m.seed,
        m.converged,
        m.steps,
        m.wall_seconds,
        m.linf_error,
        m.heldout_linf_error,
        m.heldout_mse,
        m.n_sink_heads,
        m.paper_n_sink_heads,
    ),
    "Held-out errors: fresh sequences from the training distribution. Sink head: mean BOS weight over "
    f"non-trigger queries >= {1 - SINK_EPS:g}.",
)

# every head of every model: the probes' per-head table with the model named first
MODEL_HEAD_TABLE: TableDefinition[tuple[Cell, HeadProbe]] = HEAD_TABLE.labelled(Column("model"))

EVALUATION_TABLE: TableDefinition[ModelEvaluation] = TableDefinition(
    "Errors on the held-out sequences",
    (HELDOUT_LINF, HELDOUT_MSE, Column("default-position MSE", ".2e", numeric=True), Column("sink heads")),
    lambda evaluation: (
        evaluation.heldout_linf_error,
        evaluation.heldout_mse,
        evaluation.default_mse,
        f"{len(evaluation.sink_heads())} of {len(evaluation.heads)}",
    ),
)

CHECK_TABLE: TableDefinition[Check] = TableDefinition(
    "Each claim and what was measured",
    (Column("claim"), Column("passed"), Column("measured")),
    lambda check: (check.claim, check.passed, check.detail),
)


def _range_text(values: tuple[float, float] | None, spec: str) -> str:
    return "\u2013" if values is None else value_range(values[0], values[1], spec)


def _sweep_table(caption: str, at_cap: bool, note: str) -> TableDefinition[SweepRow]:
    """The sweep's configurations table; ``at_cap``: its measured columns say they were read
    at the step cap, so no number of an unfinished model reads as a result."""
    when = " at cap" if at_cap else ""
    return TableDefinition(
        caption,
        (
            Column("configuration"),
            Column("status"),
            Column("mean steps", ".0f", numeric=True),
            Column("steps over seeds"),
            Column(f"sink fraction{when}", ".2f", numeric=True),
            Column(f"sink fraction{when} over seeds"),
            Column(f"seeds with a sink{when}"),
            Column(f"default-position MSE{when}", ".2e", numeric=True),
            Column(f"default MSE{when} over seeds"),
            Column(f"mean anchor_mass_default{when}", ".3f", numeric=True),
            Column(f"mean row mass{when}", ".3f", numeric=True),
        ),
        lambda r: (
            r.label,
            r.status,
            r.mean_steps,
            _range_text(r.steps_range, ".0f"),
            r.sink_fraction,
            _range_text(r.sink_fraction_range, ".2f"),
            f"{r.seeds_with_sink}/{r.seeds}",
            r.mean_default_mse,
            _range_text(r.default_mse_range, ".1e"),
            r.mean_anchor_mass_default,
            r.mean_row_mass,
        ),
        note,
    )


SWEEP_NOTE = (
    'sink fraction: share of all heads over seeds with anchor_mass_default >= 0.9; "over seeds": the '
    "smallest and largest value among the seeds (one value when they agree); default-position MSE: error at "
    "non-trigger positions of the test sequences; row mass: a default query's total attention weight (1 under "
    "softmax; under relu, relu_prefix and sigmoid rows are not normalised, so BOS's share of a row is "
    "anchor_mass / row mass)"
)

SWEEP_TABLE: TableDefinition[SweepRow] = _sweep_table(
    "Converged configurations (every seed converged; aggregated over seeds)", False, SWEEP_NOTE
)

CAPPED_SWEEP_TABLE: TableDefinition[SweepRow] = _sweep_table(
    "At the step cap: configurations with a seed that did not converge (not results)",
    True,
    "These models stopped at the step cap before converging: their numbers are where training stopped, not "
    "what the configuration learns (a sink may still form). Re-run with a higher --max-steps to finish them. "
    + SWEEP_NOTE,
)


def sweep_tables(rows: Sequence[SweepRow]) -> list[Table]:
    """The converged configurations' table, then (when any) the step-capped ones' apart."""
    finished = [row for row in rows if row.finished]
    capped = [row for row in rows if not row.finished]
    tables = [SWEEP_TABLE.table(finished)] if finished or not capped else []
    return tables + ([CAPPED_SWEEP_TABLE.table(capped)] if capped else [])


TRADEOFF_TABLE: TableDefinition[tuple[str, TradeoffPoint]] = TableDefinition(
    "Trade-off points",
    (
        Column("series"),
        Column("point"),
        Column("label in the figure"),
        Column("scale", "g", numeric=True),
        Column("anchor_mass_default", ".4f", numeric=True),
        Column("default_mse", ".3g", numeric=True),
        Column("default_linf", ".3g", numeric=True),
        Column("trigger_mse", ".3g", numeric=True),
    ),
    lambda pair: (
        pair[0],
        pair[1].label,
        point_label(pair[0], pair[1]),
        pair[1].scale,
        pair[1].anchor_mass_default,
        pair[1].default_mse,
        pair[1].default_linf,
        pair[1].trigger_mse,
    ),
    "anchor_mass_default: mean BOS weight over non-trigger queries; MSE and L-inf at those positions; "
    "scale: the construction's score scale or the factor on the trained W_Q.",
)
