"""The toy results' tables, each defined once (columns, labels, formats, caption, note)
for every medium: the report page and its Markdown, the inline notebook display and the
terminal summary the CLI prints. The models overview, the paper's checks, the sweep's
configurations and the trade-off's points; per-head tables are the probes' own
(``sinkscope.probes.tables.HEAD_TABLE``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinkscope.probes.sink_metrics import SINK_EPS
from sinkscope.probes.tables import HEAD_TABLE
from sinkscope.reports.document import Cell, Column, TableDefinition

if TYPE_CHECKING:
    from sinkscope.probes.probe import HeadProbe
    from sinkscope.toy.evaluate import ModelEvaluation
    from sinkscope.toy.experiment import ModelSummary
    from sinkscope.toy.reproduce import Check
    from sinkscope.toy.sweep import SweepRow
    from sinkscope.toy.tradeoff import TradeoffPoint

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
    return "-" if values is None else f"{values[0]:{spec}}..{values[1]:{spec}}"


SWEEP_TABLE: TableDefinition[SweepRow] = TableDefinition(
    "Configurations (aggregated over seeds)",
    (
        Column("configuration"),
        Column("converged"),
        Column("mean steps", ".0f", numeric=True),
        Column("steps over seeds"),
        Column("sink fraction", ".2f", numeric=True),
        Column("sink fraction over seeds"),
        Column("seeds with a sink"),
        Column("default-position MSE", ".2e", numeric=True),
        Column("default MSE over seeds"),
        Column("mean anchor_mass_default", ".3f", numeric=True),
    ),
    lambda r: (
        r.label,
        f"{r.converged}/{r.seeds}",
        r.mean_steps,
        _range_text(r.steps_range, ".0f"),
        r.sink_fraction,
        _range_text(r.sink_fraction_range, ".2f"),
        f"{r.seeds_with_sink}/{r.seeds}",
        r.mean_default_mse,
        _range_text(r.default_mse_range, ".1e"),
        r.mean_anchor_mass_default,
    ),
    'sink fraction: share of all heads over seeds with anchor_mass_default >= 0.9; "over seeds": the '
    "smallest and largest value among the seeds; default-position MSE: error at non-trigger positions "
    "of the test sequences",
)

TRADEOFF_TABLE: TableDefinition[tuple[str, TradeoffPoint]] = TableDefinition(
    "Trade-off points",
    (
        Column("series"),
        Column("point"),
        Column("scale", "g", numeric=True),
        Column("anchor_mass_default", ".4f", numeric=True),
        Column("default_mse", ".3g", numeric=True),
        Column("default_linf", ".3g", numeric=True),
        Column("trigger_mse", ".3g", numeric=True),
    ),
    lambda pair: (
        pair[0],
        pair[1].label,
        pair[1].scale,
        pair[1].anchor_mass_default,
        pair[1].default_mse,
        pair[1].default_linf,
        pair[1].trigger_mse,
    ),
    "anchor_mass_default: mean BOS weight over non-trigger queries; MSE and L-inf at those positions; "
    "scale: the construction's score scale or the factor on the trained W_Q.",
)
