"""The head ablations' table and findings, for every medium: each tested head set's sink
removal beside the zero- and mean-ablation of its output, and the reading the numbers
support (``head_ablation_reading``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from sinkscope.infra.intervals import interval_possible
from sinkscope.probes.default_state import ALL_SINK_HEADS, DefaultStateRow, Estimate
from sinkscope.probes.head_ablations import (
    HEAD_ABLATION_READINGS,
    HEAD_MATTERS,
    MEAN_OUTPUT_MATTERS,
    SINK_BREAKS_IT,
    head_ablation_reading,
)
from sinkscope.reports.document import Column, Table, TableDefinition
from sinkscope.reports.formatting import estimate_text, plural

# a set of heads' reading, in the plural
READINGS_FOR_SEVERAL = {
    SINK_BREAKS_IT: "removing their sinks breaks them",
    HEAD_MATTERS: "the heads matter",
    MEAN_OUTPUT_MATTERS: "their mean output matters",
}
# what a reading says, after it in a finding
MEANINGS = {
    SINK_BREAKS_IT: ": without its sink {the_head} writes something worse than its average output",
    HEAD_MATTERS: ": losing what {the_head} says about its input raises the error",
}

HEAD_ABLATION_NOTE = (
    "Zero-ablation sets each head's output z (before W_O) to 0 at every position; mean-ablation replaces it "
    "by its mean at that position over the same inputs. 'removal - mean' is sink removal's change minus the "
    "mean-ablation's, input by input (sink removal's interval is in the table above). Reading, the first rule "
    "that holds, from the intervals: 'removing its sink breaks it' when removal costs more than the "
    "mean-ablation and than the matched control (without its sink the head writes something worse than its "
    "average output); 'the head matters' when the mean-ablation's interval "
    "lies above 0; 'its mean output matters' when only the zero-ablation's does; 'inconclusive' when only "
    "sink removal's does; else 'no ablation raises the error' (docs/metrics.md)."
)


def _ends(estimate: Estimate | None, n_inputs: int) -> tuple[float, float, float]:
    if estimate is None:
        return math.nan, math.nan, math.nan
    if not interval_possible(n_inputs):  # a file written before the small-n rule may hold ends
        return estimate.mean, math.nan, math.nan
    return estimate.mean, estimate.ci_low, estimate.ci_high


def head_ablation_definition(what: str, n_inputs: int, level: str = "95%") -> TableDefinition[DefaultStateRow]:
    """Sink removal beside the head ablations, one row per tested head set."""
    return TableDefinition(
        "Head ablations beside sink removal",
        (
            Column("heads"),
            Column(f"sink removal: {what} change", ".3g", numeric=True),
            *[
                Column(f"{change}: {part}", ".3g", numeric=True)
                for change in ("zero-ablation", "mean-ablation", "removal - mean")
                for part in ("change", f"{level} CI low", f"{level} CI high")
            ],
            Column("reading"),
        ),
        lambda row: (
            row.label,
            row.remove_increase.mean,
            *_ends(row.zero_increase, n_inputs),
            *_ends(row.mean_increase, n_inputs),
            *_ends(row.remove_minus_mean, n_inputs),
            reading_text(row),
        ),
        HEAD_ABLATION_NOTE,
    )


def head_ablation_table(
    tested: Sequence[DefaultStateRow], what: str, n_inputs: int, unit: str = "input", level: str = "95%"
) -> Table | None:
    """The table of the ``tested`` head sets that were ablated (None: none was, e.g. an
    older file), over ``n_inputs`` inputs, each a ``unit`` ("prompt" in an audit)."""
    rows = [row for row in tested if head_ablation_reading(row) is not None]
    if not rows:
        return None
    caption = f"Head ablations beside sink removal, on {plural(n_inputs, unit)}"
    table = head_ablation_definition(what, n_inputs, level).table(rows, caption)
    return table.without_empty_columns() if not interval_possible(n_inputs) else table


def reading_text(row: DefaultStateRow) -> str:
    """The row's reading, worded for one head or for a set of them."""
    reading = head_ablation_reading(row)
    several = len(row.head_set) > 1
    return READINGS_FOR_SEVERAL.get(reading, reading) if several and reading else str(reading)


def _signed(value: float) -> str:
    """A change with 3 significant digits, trailing zeros kept (+1.00, -0.0100)."""
    return f"{value:+#.3g}"


def _named(rows: Sequence[DefaultStateRow]) -> str:
    return ", ".join(row.label for row in rows)


def _ablations(row: DefaultStateRow, n: int, level: str) -> str:
    assert row.zero_increase is not None and row.mean_increase is not None  # rows with a reading have both
    parts = (("zero-ablation", row.zero_increase), ("mean-ablation", row.mean_increase))
    return ", ".join(f"{name} {estimate_text(e.mean, e.ci_low, e.ci_high, n, level=level)}" for name, e in parts)


def _singles_finding(singles: Sequence[DefaultStateRow], what: str, n: int, unit: str) -> str:
    readings = [head_ablation_reading(row) for row in singles]
    head = (
        f"Head ablations (each head's output zero- or mean-ablated beside its sink removal; {what} change, mean over "
        f"{plural(n, unit)}): "
    )
    if len(set(readings)) == 1:
        count = len(singles)
        shown = {1: "the one sink head tested alone", 2: "both sink heads tested alone"}.get(
            count, f"all {count} sink heads tested alone"
        )
        meaning = MEANINGS.get(str(readings[0]), "").format(the_head="the head" if count == 1 else "each head")
        return f"{head}{shown} ({_named(singles)}) {'reads' if count == 1 else 'read'} '{readings[0]}'{meaning}."
    counts = "; ".join(
        f"{readings.count(reading)} '{reading}' ({_named([r for r in singles if head_ablation_reading(r) == reading])})"
        for reading in HEAD_ABLATION_READINGS
        if reading in readings
    )
    return f"{head}of {plural(len(singles), 'sink head')} tested alone, {counts}."


def head_ablation_findings(
    alone: Sequence[DefaultStateRow],
    together: DefaultStateRow | None,
    what: str,
    n: int,
    unit: str = "input",
    level: str = "95%",
) -> list[str]:
    """How many heads tested ``alone`` support each reading; the ablations and reading of
    all sink heads ``together``; and, where one head's sink removal costs more than all of
    theirs together, that head's ablations (an empty list where nothing was ablated);
    ``n``: the inputs, each a ``unit``."""
    singles = [row for row in alone if head_ablation_reading(row) is not None]
    findings = [_singles_finding(singles, what, n, unit)] if singles else []
    if together is None or together.label != ALL_SINK_HEADS or head_ablation_reading(together) is None:
        return findings
    count = len(together.head_set)
    findings.append(
        f"All {count} sink heads together: {_ablations(together, n, level)}, beside their sink removal's "
        f"{_signed(together.remove_increase.mean)}; reading: {reading_text(together)}."
    )
    costliest = max(singles, key=lambda row: row.remove_increase.mean, default=None)
    # only where the costliest removal does raise the error: a comparison of losses, not of gains
    if (
        costliest is not None
        and costliest.remove_increase.ci_low > 0
        and costliest.remove_increase.mean > together.remove_increase.mean
    ):
        alone_sum = sum(row.remove_increase.mean for row in singles)
        adds = (
            f" and less than the {_signed(alone_sum)} that the {len(singles)} single removals add up to (a sum of means)"
            if len(singles) > 1 and alone_sum > together.remove_increase.mean
            else ""
        )
        findings.append(
            f"{costliest.label}, the costliest sink removal alone ({_signed(costliest.remove_increase.mean)}): "
            f"{_ablations(costliest, n, level)}. All {count} removed together cost {_signed(together.remove_increase.mean)}, "
            f"less than {costliest.label} alone{adds}."
        )
    return findings
