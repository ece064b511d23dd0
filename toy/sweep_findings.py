"""The sweep report's findings: the result per attention kind, from converged
configurations only, with the configurations at the step cap named apart, and what a
sink head means under a kind whose rows are not normalised."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinkscope.interp.attention_kinds import NORMALISED_KINDS
from sinkscope.reports.formatting import plural, sig

if TYPE_CHECKING:
    from sinkscope.toy.sweep import SweepResult
    from sinkscope.toy.sweep_cells import SweepRow

# softmax rows (and the gated kinds', which are softmax rows) sum to 1, so a head with nothing
# to add must park its weight somewhere or be gated off (the paper's Theorem 1); the other
# kinds can output zero by giving every key zero weight (NORMALISED_KINDS: one definition)

UNNORMALISED_MEANING = (
    "{kind} rows are not normalised (a row's weights need not sum to 1; mean row mass at default queries: "
    "{row_mass}), so BOS's weight is not a share of the row: a head can output nothing by giving every key "
    '~0 and needs no sink. A "sink head" here (BOS weight >= 0.9) is one that still reads BOS\'s value at '
    "default positions, using BOS as a default value rather than as a place to park attention; BOS's share "
    "of its row is anchor_mass / row mass."
)


def sweep_findings(result: SweepResult) -> list[str]:
    """The sweep's findings: its size, then one per attention kind, then its meaning for
    every non-normalised kind in the grid."""
    config = result.config
    findings = [
        f"{plural(len(result.rows), 'configuration')} x {plural(config.seeds, 'seed')} "
        f"({plural(len(result.models), 'model')}), up to {config.max_steps:,} steps each. A configuration "
        "counts as a result only when every seed converged; the others are reported apart, at the step cap."
    ]
    for attention in config.attentions:
        rows = [r for r in result.rows if r.attention == attention]
        findings.append(kind_finding(attention, rows))
        if attention not in NORMALISED_KINDS:
            findings.append(UNNORMALISED_MEANING.format(kind=attention, row_mass=_row_mass_text(rows)))
    return findings


def _row_mass_text(rows: list[SweepRow]) -> str:
    """The mean row mass of the converged configurations, else of those at the step cap
    (said so), else "not measured" (summaries written before row mass was kept)."""
    for subset, when in (
        (([r for r in rows if r.finished]), ""),
        ([r for r in rows if not r.finished], " at the step cap"),
    ):
        masses = [r.mean_row_mass for r in subset if r.mean_row_mass is not None]
        if masses:
            return sig(sum(masses) / len(masses)) + when
    return "not measured"


def kind_finding(attention: str, rows: list[SweepRow]) -> str:
    """One kind's result over its converged configurations, the surprise when a kind that
    needs no sink forms one anyway, and its configurations at the step cap."""
    finished = [r for r in rows if r.finished]
    capped = [r for r in rows if not r.finished]
    parts = [f"{attention}: "]
    if finished:
        heads = sum(r.seeds * r.n_layers * r.n_heads for r in finished)
        sinks = round(sum(r.sink_fraction * r.seeds * r.n_layers * r.n_heads for r in finished))
        with_sink = sum(r.seeds_with_sink for r in finished)
        models = sum(r.seeds for r in finished)
        parts.append(
            f"in {plural(len(finished), 'converged configuration')}, {sinks} of {plural(heads, 'head')} sink "
            f"({sinks / heads:.0%}); {with_sink} of {plural(models, 'model')} have at least one sink head"
        )
        if attention not in NORMALISED_KINDS and sinks:
            parts.append(" (a sink although this kind needs none)")
        parts.append(".")
    else:
        parts.append("no configuration converged, so there is no result for this kind.")
    if capped:
        parts.append(
            " At the step cap, not converged (numbers not a result): "
            + ", ".join(_capped_cell(r, attention) for r in capped)
            + "."
        )
    return "".join(parts)


def _capped_cell(row: SweepRow, attention: str) -> str:
    """A configuration at the step cap: its converged count and, if heads sank before the
    cap, that sink fraction, said to be read at the cap."""
    sank = f", sink fraction {row.sink_fraction:.2f} at the cap" if row.sink_fraction > 0 else ""
    return f"{row.label.removeprefix(attention + ' ')} ({row.converged}/{row.seeds} converged{sank})"
