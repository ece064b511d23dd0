"""What the sink-circuit battery is asked and what it returns: ``CircuitConfig``, one
``EditOutcome`` per edit (the share of baseline anchor mass it leaves, per head and over
the sink heads, and the error change), ``CircuitRow`` (an edit beside its control) and
``CircuitBattery`` (persisted as ``circuit.json``). The main table has the literature's
shape: each intervention, the share left and the error change with their intervals, and
its control beside it."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from sinkscope.infra.arguments import check_seed
from sinkscope.infra.bounds import COUNT, K_DIMS, NONNEGATIVE, POSITIVE, UNBOUNDED, Bound, Problem
from sinkscope.infra.errors import InputError
from sinkscope.probes.circuit_edits import control_label
from sinkscope.probes.circuit_transplant import TransplantResult
from sinkscope.probes.default_state import Estimate
from sinkscope.reports.document import Column, Table, TableDefinition

if TYPE_CHECKING:
    import pandas

MAX_K_DIMS = K_DIMS.high


@dataclass(frozen=True)
class CircuitConfig:
    """``write_layer``: the layer whose MLP and attention writes into the anchor are zeroed;
    ``k_dims``: how many key input dimensions the key edit zeroes per sink layer;
    ``position``: the later position of the position edits (None: half the shortest
    input); ``transplant_layers``: the first layers in which the transplant makes that
    position attend only to itself (None: two, or one in a two-layer model); ``n_bootstrap``
    resamples of the inputs; ``seed`` fixes the controls' draws and the bootstrap;
    ``batch_size``: inputs per forward pass."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "write_layer": COUNT,
        "k_dims": K_DIMS,
        "n_bootstrap": POSITIVE,
        "batch_size": POSITIVE,
    }

    write_layer: int = 0
    k_dims: int = 3
    position: int | None = None
    transplant_layers: int | None = None
    n_bootstrap: int = 1000
    seed: int = 0
    batch_size: int = 8

    def __post_init__(self) -> None:
        check_seed(self.seed)
        for name, bound in self.BOUNDS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not bound.admits(value):
                raise InputError(f"{name} must be an integer in {bound}, got {value!r}", field=name)
        if self.position is not None and (
            isinstance(self.position, bool) or not isinstance(self.position, int) or self.position < 1
        ):
            raise InputError(
                f"position must be a later position (an integer >= 1) or None, got {self.position!r}", field="position"
            )
        layers = self.transplant_layers
        if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
            raise InputError(
                f"transplant_layers must be an integer >= 1 or None, got {layers!r}", field="transplant_layers"
            )


@dataclass(frozen=True)
class HeadShare:
    """One sink head under one edit: its baseline anchor mass (mean over inputs) and the
    share of it the edit leaves."""

    BOUNDS: ClassVar[dict[str, Bound]] = {"layer": COUNT, "head": COUNT, "baseline": NONNEGATIVE}

    layer: int
    head: int
    baseline: float
    share_left: Estimate


@dataclass(frozen=True)
class EditOutcome:
    """One edit: ``edit`` its kind; ``why_not`` what the model lacks when not applicable
    (then nothing is measured); ``share_left``: sum of edited over sum of baseline anchor
    mass, averaged over the sink heads per input first; ``error_change``: mean of edited
    minus baseline error (None without an error readout)."""

    edit: str
    applicable: bool
    why_not: str | None
    share_left: Estimate | None
    error_change: Estimate | None
    heads: tuple[HeadShare, ...]

    def inconsistencies(self) -> Iterator[Problem]:
        if self.applicable == (self.why_not is not None):
            yield ("why_not", self.why_not, "given exactly when the edit is not applicable")
        if not self.applicable and (self.share_left is not None or self.heads):
            yield ("share_left", self.share_left, "measured only for an applicable edit")
        if self.applicable and self.share_left is None:
            yield ("share_left", None, "measured for an applicable edit")
        shares = [self.share_left] if self.share_left is not None else []
        for share in shares + [head.share_left for head in self.heads]:
            if not share.mean >= 0 or share.ci_low < 0:  # NaN ends (no interval) pass the second test
                yield ("share_left", share.mean, "a share >= 0 (anchor mass is never negative)")


@dataclass(frozen=True)
class CircuitRow:
    """An intervention (``label`` says what it does) beside its matched control (None: the
    row is itself a control, as replacing the anchor's token embedding is, or a check of
    theory, as a rotary offset is)."""

    label: str
    intervention: EditOutcome
    control: EditOutcome | None


def _cell(estimate: Estimate | None, percent: bool) -> str:
    if estimate is None:
        return "-"
    scale, unit = (100.0, "%") if percent else (1.0, "")
    text = f"{scale * estimate.mean:.1f}{unit}" if percent else f"{estimate.mean:+.4f}"
    if math.isnan(estimate.ci_low):
        return text
    low, high = scale * estimate.ci_low, scale * estimate.ci_high
    return f"{text} [{low:.1f}, {high:.1f}]" if percent else f"{text} [{low:+.4f}, {high:+.4f}]"


def _outcome_cells(outcome: EditOutcome | None) -> tuple[str, str]:
    if outcome is None:  # a control itself (the anchor's token), or a check of theory (a rotary offset)
        return "-", "-"
    if not outcome.applicable:
        return f"not applicable: {outcome.why_not}", "-"
    return _cell(outcome.share_left, percent=True), _cell(outcome.error_change, percent=False)


def _row_cells(row: CircuitRow) -> tuple[str, ...]:
    share, change = _outcome_cells(row.intervention)
    control_share, control_change = _outcome_cells(row.control)
    control = "-" if row.control is None else control_label(row.control.edit)
    return (row.label, share, change, control, control_share, control_change)


CIRCUIT_TABLE: TableDefinition[CircuitRow] = TableDefinition(
    caption="What builds the sink: each edit beside its matched control",
    columns=(
        Column("intervention"),
        Column("anchor mass left [95% CI]"),
        Column("error change [95% CI]"),
        Column("control"),
        Column("control: anchor mass left [95% CI]"),
        Column("control: error change [95% CI]"),
    ),
    cells=_row_cells,
    note=(
        "anchor mass left: the sink heads' anchor mass under the edit as a share of the baseline "
        "(sum over inputs, each input's mass the mean over sink heads of the mean over its real queries "
        "after the anchor); error change: mean over inputs of edited minus baseline error; "
        "95% percentile bootstrap over inputs, paired."
    ),
)


@dataclass(frozen=True)
class CircuitBattery:
    """The battery on one model: ``n_inputs`` inputs, ``sink_heads`` read, their baseline
    anchor mass (mean over heads and inputs) and baseline error (mean over inputs)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "n_inputs": POSITIVE,
        "baseline_anchor_mass": NONNEGATIVE,
        "baseline_error": UNBOUNDED,
    }

    config: CircuitConfig
    n_inputs: int
    sink_heads: tuple[tuple[int, int], ...]
    baseline_anchor_mass: float
    baseline_error: float | None
    rows: tuple[CircuitRow, ...]
    transplant: TransplantResult | None = None
    transplant_note: str = ""  # why there is no transplant (a one-layer model, read-only patterns)

    def inconsistencies(self) -> Iterator[Problem]:
        if not self.rows:
            yield ("rows", 0, "at least one edit (a battery always has its rows)")
        if not self.sink_heads or len(set(self.sink_heads)) != len(self.sink_heads):
            yield ("sink_heads", len(self.sink_heads), "distinct sink heads, at least one")

    def table(self) -> Table:
        """The main table: each intervention and its control, share left and error change."""
        return CIRCUIT_TABLE.table(self.rows)

    def to_dataframe(self) -> pandas.DataFrame:
        """One row per edit (controls included): role, applicability, share left and error
        change with their intervals."""
        from sinkscope.reports.frames import dataframe

        return dataframe(_frame_row(row.label, role, outcome) for row in self.rows for role, outcome in _roles(row))

    def heads_dataframe(self) -> pandas.DataFrame:
        """One row per (edit, sink head): the head's baseline anchor mass and share left."""
        from sinkscope.reports.frames import dataframe

        return dataframe(
            {
                "intervention": row.label,
                "role": role,
                "edit": outcome.edit,
                "layer": head.layer,
                "head": head.head,
                "baseline_anchor_mass": head.baseline,
                **_estimate_columns("share_left", head.share_left),
            }
            for row in self.rows
            for role, outcome in _roles(row)
            for head in outcome.heads
        )


def _roles(row: CircuitRow) -> list[tuple[str, EditOutcome]]:
    return [("intervention", row.intervention)] + ([] if row.control is None else [("control", row.control)])


def _estimate_columns(name: str, estimate: Estimate | None) -> dict[str, float]:
    if estimate is None:
        return {f"{name}_{part}": math.nan for part in ("mean", "ci_low", "ci_high")}
    return {f"{name}_{part}": getattr(estimate, part) for part in ("mean", "ci_low", "ci_high")}


def _frame_row(label: str, role: str, outcome: EditOutcome) -> dict[str, Any]:
    return {
        "intervention": label,
        "role": role,
        "edit": outcome.edit,
        "applicable": outcome.applicable,
        "why_not": outcome.why_not,
        **_estimate_columns("share_left", outcome.share_left),
        **_estimate_columns("error_change", outcome.error_change),
    }


@dataclass(frozen=True)
class CircuitRun:
    """The battery as a command ran it: ``model`` (its label), ``inputs`` (what they were,
    e.g. "64 prompts of the packaged set, 16-32 tokens"), ``error_name`` (None: no error
    readout), ``sink_rule`` (how the sink heads were chosen), ``seconds`` of wall time.
    Persisted as ``circuit.json``."""

    SCHEMA: ClassVar[str] = "circuit"
    SCHEMA_VERSION: ClassVar[int] = 1
    BOUNDS: ClassVar[dict[str, Bound]] = {"seconds": NONNEGATIVE}

    model: str
    inputs: str
    error_name: str | None
    sink_rule: str
    battery: CircuitBattery
    seconds: float

    def to_dataframe(self) -> pandas.DataFrame:
        frame = self.battery.to_dataframe()
        frame.insert(0, "model", self.model)
        return frame

    def _repr_html_(self) -> str:
        from sinkscope.probes.circuit_report import circuit_html

        return circuit_html(self)
