"""The head ablations' table and findings, for every medium: each tested head set's sink
removal beside the zero- and mean-ablation of its output, and the reading the numbers
support (``head_ablation_reading``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from sinkscope.infra.intervals import interval_possible
from sinkscope.probes.default_state import ALL_SINK_HEADS, DefaultStateRow, Estimate
from sinkscope.probes.head_ablations import HEAD_ABLATION_READINGS, head_ablation_reading
from sinkscope.reports.document import Column, Table, TableDefinition
from sinkscope.reports.formatting import estimate_text, plural

HEAD_ABLATION_NOTE = (
    "Zero-ablation sets each head's output z (before W_O) to 0 at every position; mean-ablation replaces it "
    "by its mean at that position over the same inputs. 'removal - mean' is sink removal's change minus the "
    "mean-ablation's, input by input. Reading, from the intervals: 'removing its sink breaks it' when removal "
    "costs more than the mean-ablation and than the matched control; 'the head matters' when the "
    "mean-ablation's interval lies above 0; 'its mean output matters' when only the zero-ablation's does; "
    "'inconclusive' when only sink removal's does (docs/metrics.md)."
)


def _ends(estimate: Estimate | None, n_inputs: int) -> tuple[float, float, float]:
    if estimate is None:
        return math.nan, math.nan, math.nan
    if not interval_possible(n_inputs):  # a file written before the small-n rule may hold ends
        return estimate.mean, math.nan, math.nan
    return estimate.mean, estimate.ci_low, estimate.ci_high


def head_ablation_definition(what: str, n_inputs: int) -> TableDefinition[DefaultStateRow]:
    """Sink removal beside the head ablations, one row per tested head set."""
    return TableDefinition(
        "Head ablations beside sink removal",
        (
            Column("heads"),
            Column(f"sink removal: {what} change", ".3g", numeric=True),
            *[
                Column(f"{change}: {part}", ".3g", numeric=True)
                for change in ("zero-ablation", "mean-ablation", "removal - mean")
                for part in ("change", "95% CI low", "95% CI high")
            ],
            Column("reading"),
        ),
        lambda row: (
            row.label,
            row.remove_increase.mean,
            *_ends(row.zero_increase, n_inputs),
            *_ends(row.mean_increase, n_inputs),
            *_ends(row.remove_minus_mean, n_inputs),
            head_ablation_reading(row),
        ),
        HEAD_ABLATION_NOTE,
    )


def head_ablation_table(tested: Sequence[DefaultStateRow], what: str, n_inputs: int) -> Table | None:
    """The table of the ``tested`` head sets that were ablated (None: none was, e.g. an
    older file), over ``n_inputs`` inputs."""
    rows = [row for row in tested if head_ablation_reading(row) is not None]
    if not rows:
        return None
    caption = f"Head ablations beside sink removal, on {plural(n_inputs, 'input')}"
    table = head_ablation_definition(what, n_inputs).table(rows, caption)
    return table.without_empty_columns() if not interval_possible(n_inputs) else table


def _named(rows: Sequence[DefaultStateRow]) -> str:
    return ", ".join(row.label for row in rows)


def _numbers(row: DefaultStateRow, n: int) -> str:
    assert row.zero_increase is not None and row.mean_increase is not None  # rows with a reading have both
    parts = (
        ("sink removal", row.remove_increase),
        ("zero-ablation", row.zero_increase),
        ("mean-ablation", row.mean_increase),
    )
    return ", ".join(f"{name} {estimate_text(e.mean, e.ci_low, e.ci_high, n)}" for name, e in parts)


def head_ablation_findings(
    alone: Sequence[DefaultStateRow], together: DefaultStateRow | None, what: str, n: int
) -> list[str]:
    """How many heads tested ``alone`` support each reading, the reading of all sink heads
    ``together``, and, where one head's sink removal costs more than all of theirs together,
    that head's ablations beside it (an empty list where nothing was ablated); ``n``: the
    inputs."""
    singles = [row for row in alone if head_ablation_reading(row) is not None]
    if not singles and (together is None or head_ablation_reading(together) is None):
        return []
    findings = []
    if singles:
        readings = [head_ablation_reading(row) for row in singles]
        counts = "; ".join(
            f"{readings.count(reading)} '{reading}' ({_named([r for r in singles if head_ablation_reading(r) == reading])})"
            for reading in HEAD_ABLATION_READINGS
            if reading in readings
        )
        findings.append(
            f"Head ablations ({what} change, mean over {plural(n, 'input')}): of {plural(len(singles), 'sink head')} "
            f"tested alone, {counts}."
        )
    if together is not None and together.label == ALL_SINK_HEADS and head_ablation_reading(together) is not None:
        findings.append(
            f"All {len(together.head_set)} sink heads together: {_numbers(together, n)}; reading: "
            f"{head_ablation_reading(together)}."
        )
        costliest = max(singles, key=lambda row: row.remove_increase.mean, default=None)
        if costliest is not None and costliest.remove_increase.mean > together.remove_increase.mean:
            alone_sum = sum(row.remove_increase.mean for row in singles)
            adds = (
                f" The sink removals of the {plural(len(singles), 'head')} tested alone add up to {alone_sum:+.3g} "
                f"(a sum of the means): removed together, they cost less than the sum of their parts."
                if len(singles) > 1 and alone_sum > together.remove_increase.mean
                else ""
            )
            findings.append(
                f"{costliest.label}'s sink removal alone costs more than all {len(together.head_set)} together's "
                f"({costliest.remove_increase.mean:+.3g} against {together.remove_increase.mean:+.3g}): "
                f"{_numbers(costliest, n)}; reading: {head_ablation_reading(costliest)}.{adds}"
            )
    return findings
