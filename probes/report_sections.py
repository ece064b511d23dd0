"""Report content for the probes' results, shared by toy and pretrained reports: the
per-head and per-layer tables of a probe (defined in ``sinkscope.probes.tables``), the
sentences that summarise them, the default-state test's table, chart and one-sentence
finding, and the table and finding of an activation-patching result. Made here, above
the presentation layer (``sinkscope.reports``), which never imports the probes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from sinkscope.infra.intervals import interval_possible
from sinkscope.infra.provenance import PROVENANCE_FILE, Provenance
from sinkscope.probes.default_state import DefaultStateRow, Estimate
from sinkscope.probes.head_classes import HEAD_CLASSES
from sinkscope.probes.layer_tables import NO_PATTERN_TABLE, layer_definition
from sinkscope.probes.patching import PatchingResult, PatchingRow
from sinkscope.probes.probe import HeadProbe, LayerProbe, ProbeConfig, ProbeResult, SinkRate, layers_setting
from sinkscope.probes.tables import (
    HEAD_TABLE,
    default_state_definition,
    patch_site,
    patching_definition,
)
from sinkscope.reports.bars import (
    CONTROL_COLOUR,
    EFFECT_COLOUR,
    IntervalSeries,
    effect_control_chart,
    interval_bar_chart,
)
from sinkscope.reports.document import Figure, KeyValues, Table, config_block, percent, sig
from sinkscope.reports.formatting import common_decimals, estimate_text, interval_text, plural, sig_kept


def head_table(heads: Sequence[HeadProbe], caption: str, note: str) -> Table:
    """One row per head; a metric that was measured for no head (all NaN) is left out."""
    return HEAD_TABLE.table(heads, caption, note).without_empty_columns()


def layer_table(probe: ProbeResult) -> Table:
    """One row per layer, with its attention span; a column measured for no layer (all NaN)
    is left out."""
    return layer_definition(probe.model).table(probe.layers).without_empty_columns()


def layer_tables(probe: ProbeResult) -> tuple[Table, ...]:
    """The per-layer table, then one row per layer without an attention pattern (if any)."""
    skipped = probe.model.no_pattern_layers
    return (layer_table(probe), *((NO_PATTERN_TABLE.table(skipped),) if skipped else ()))


def sink_rate_phrase(rates: Sequence[SinkRate]) -> str:
    """Sink rates as e.g. "43.8% at ε = 0.3 and 12.0% at ε = 0.8" (ε: the sink-rate
    threshold, not the sink-head threshold sink_eps); where a sliding window or chunk hides
    the anchor from some queries, each is followed by its value over every query."""
    return " and ".join(
        f"{percent(rate.percent)} at ε = {rate.eps:g}"
        + ("" if math.isnan(rate.percent_all_queries) else f" ({percent(rate.percent_all_queries)} over every query)")
        for rate in rates
    )


def hidden_anchor_phrase(layers: Sequence[LayerProbe]) -> str | None:
    """A finding on the layers whose sliding window or chunk hides the anchor from some
    queries (None when no layer does)."""
    narrowed = [layer for layer in layers if layer.anchor_hidden_share > 0]
    if not narrowed:
        return None
    low, high = (percent(100.0 * f(layer.anchor_hidden_share for layer in narrowed)) for f in (min, max))
    return (
        f"In {plural(len(narrowed), 'layer')} ({', '.join(f'L{layer.layer}' for layer in narrowed)}) a sliding "
        f"window or chunk hides the anchor from {low if low == high else f'{low} to {high}'} "
        "of the queries after it; anchor mass, alpha and the sink rate are over the queries that can see it, and the "
        "tables give them over every query too (Gu et al.'s alpha averages over every query)."
    )


def sink_head_threshold(sink_eps: float) -> tuple[str, str]:
    """A config block's line for ``sink_eps``, named apart from the sink rate's ε: a sink
    head has anchor mass >= 1 - sink_eps."""
    return ("sink-head threshold", f"anchor mass ≥ {1.0 - sink_eps:g} (sink_eps {sink_eps:g})")


def probe_config_block(caption: str, config: ProbeConfig) -> KeyValues:
    """A probe's settings, with its two thresholds named apart."""
    return config_block(
        caption,
        config,
        {
            "sink_eps": sink_head_threshold(config.sink_eps),
            "sink_rate_eps": (
                "sink-rate thresholds ε (Gu et al.)",
                ", ".join(f"{eps:g}" for eps in config.sink_rate_eps),
            ),
            "layers": layers_setting(config.layers),
        },
    )


def sink_head_phrase(heads: Sequence[HeadProbe], sink_eps: float, where: str) -> str:
    """The headline count, e.g. "7 of 16 heads are sink heads (anchor mass >= 0.9 ...)";
    without sink heads, the head that comes closest."""
    sinks = [head for head in heads if head.is_sink_head]
    rule = f"anchor mass >= {1.0 - sink_eps:g} {where}"
    if sinks:
        strongest = sorted(sinks, key=lambda head: -head.anchor_mass)  # every one: a list is never cut
        names = ", ".join(f"L{head.layer}H{head.head}" for head in strongest)
        verb = "is a sink head" if len(sinks) == 1 else "are sink heads"
        order = "" if len(sinks) == 1 else ", strongest first"
        return f"{len(sinks)} of {len(heads)} heads {verb} ({rule}){order}: {names}."
    measured = [head for head in heads if not math.isnan(head.anchor_mass)]
    if not measured:
        return f"No head could be measured ({rule})."
    top = max(measured, key=lambda head: head.anchor_mass)
    return (
        f"{'The one head is not' if len(heads) == 1 else f'None of the {len(heads):,} heads is'} a sink head "
        f"({rule}); the largest anchor mass is "
        f"{top.anchor_mass:.3f} (L{top.layer}H{top.head})."
    )


def sink_rules_phrase(probe: ProbeResult) -> str | None:
    """How many heads pass each sink rule, the fixed sink_eps and the random-key null, and
    the sink heads' classes (docs/metrics.md); None for a probe without the null (older files)."""
    heads = [head for head in probe.heads if not math.isnan(head.anchor_mass)]
    if math.isnan(probe.random_key_p99) or not heads:
        return None
    n_eps = sum(head.is_sink_head for head in heads)
    n_null = sum(bool(head.above_random_key_p99) for head in heads)
    both = sum(head.is_sink_head and bool(head.above_random_key_p99) for head in heads)
    classes = [head.sink_class for head in heads if head.is_sink_head and head.sink_class is not None]
    kinds = ", ".join(f"{classes.count(kind)} {kind}" for kind in HEAD_CLASSES if kind in classes)
    return (
        f"Sink rules: {n_eps} of {len(heads)} heads pass the fixed rule (anchor mass >= "
        f"{1.0 - probe.config.sink_eps:g}); {n_null} pass the random-key null (anchor mass above "
        f"{probe.random_key_p99:.4f}, the 99th percentile of the mass on one random real key per prompt over "
        f"every (head, prompt)); {both} pass both." + (f" Sink-head classes: {kinds}." if kinds else "")
    )


def default_state_finding(row: DefaultStateRow, what: str, subject: str, n: int, level: str = "95%") -> str:
    """One sentence from the default-state test's row for all sink heads (or the only one),
    e.g. "Removing the sinks of all 9 sink heads raises default-position MSE from 6.7e-09 to
    0.12 while the matched control leaves it at 6.4e-09 (...)"; ``n``: the inputs the
    interval is over (none from fewer than two)."""
    control_change = row.error_after_control - row.error_before
    remove_change = row.error_after_remove - row.error_before
    # one rounding for the sentence: at least the 3 significant digits the rest of a report gives
    # and one number of decimals for the three errors where fixed decimals read (4.10 to 5.68, not 4.1 to 5.68)
    digits = next((k for k in range(3, 7) if sig(row.error_before, k) != sig(row.error_after_remove, k)), 6)
    errors = (row.error_before, row.error_after_remove, row.error_after_control)
    fixed = common_decimals(errors, digits)
    if fixed is None or any(float(text) == 0 != error for text, error in zip(fixed, errors, strict=True)):
        fixed = [sig_kept(error, digits) for error in errors]  # an error that would print as 0.000 keeps its digits
    before, after, after_control = fixed
    leaves = abs(control_change) <= 0.1 * abs(remove_change) or abs(control_change) <= 0.5 * abs(row.error_before)
    control = f"leaves it at {after_control}" if leaves else f"moves it to {after_control}"
    verb = "raises" if remove_change > 0 else "lowers"
    removed, matched = row.remove_increase, row.control_increase
    return (
        f"Removing the sinks of {subject} {verb} {what} from {before} to "
        f"{after} while the matched control {control} (change "
        f"{estimate_text(remove_change, removed.ci_low, removed.ci_high, n, level=level)}; the control's "
        f"{estimate_text(control_change, matched.ci_low, matched.ci_high, n, level=level)})."
    )


def value_share_phrase(sinks: Sequence[HeadProbe], anchor: str) -> str:
    """How much of what the sink heads write comes from the anchor (mass vs value), and how
    many of them write little at all (``no-op``): a share is of what a head writes, however small."""
    mass = float(np.nanmean([head.anchor_mass for head in sinks]))
    shares = [head.value_weighted_anchor_share for head in sinks if not math.isnan(head.value_weighted_anchor_share)]
    no_op = sum(head.sink_class == "no-op" for head in sinks)
    small = (
        f"; {no_op} of {len(sinks)} are no-op heads (the anchor's value writes under a fifth of a typical "
        "token's), so for them that is most of very little"
        if no_op
        else ""
    )
    if not shares:
        return (
            f"Sink heads put {mass:.3f} of their attention on {anchor} and write almost nothing "
            "there, so they have no value-weighted anchor share."
        )
    share = float(np.mean(shares))
    reading = (
        "the sink takes their attention but carries little of what they write"
        if share < 0.5
        else "the anchor also carries most of what they write"
    )
    counted = "" if len(shares) == len(sinks) else f" (over the {len(shares)} of {len(sinks)} that write anything)"
    return (
        f"Sink heads put {mass:.3f} of their attention on {anchor}, and {anchor} carries {share:.3f} of their "
        f"output norm{counted} (value-weighted anchor share): {reading}{small}."
    )


def default_state_table(
    rows: Sequence[DefaultStateRow],
    what: str,
    caption: str = "Per sink head and for all sink heads together",
    n_inputs: int | None = None,
    level: str = "95%",
) -> Table:
    table = default_state_definition(what, n_inputs, level).table(rows, caption)
    return table.without_empty_columns() if n_inputs is not None and not interval_possible(n_inputs) else table


def default_state_chart(
    labels: Sequence[str], rows: Sequence[DefaultStateRow], what: str, path: Path, title: str
) -> Figure:
    """Grouped bars, log scale, of the error before, after ``remove_sink`` and after the
    control, each change's bootstrap interval over inputs as a whisker: for errors that
    grow by orders of magnitude (the toy task's MSE)."""
    interval_bar_chart(
        labels,
        [
            IntervalSeries("no ablation", [row.error_before for row in rows], *_no_intervals(len(rows))),
            _shifted(
                "sink removed", rows, [row.error_after_remove for row in rows], [row.remove_increase for row in rows]
            ),
            _shifted(
                "matched control",
                rows,
                [row.error_after_control for row in rows],
                [row.control_increase for row in rows],
            ),
        ],
        path,
        title,
        what + " (log scale)",
        log=True,
    )
    return Figure(
        path,
        f"{title}: {what} before, after removing the sinks and after the matched control; whiskers: the "
        "bootstrap interval over inputs of each change, added to the error before (the no-ablation bar is the "
        "reference, without one)",
        path.parent,
    )


def _shifted(
    name: str, rows: Sequence[DefaultStateRow], after: Sequence[float], changes: Sequence[Estimate]
) -> IntervalSeries:
    """The errors ``after`` an ablation, each with its change's interval added to the error
    before (NaN ends where a change has none)."""
    return IntervalSeries(
        name,
        after,
        [row.error_before + change.ci_low for row, change in zip(rows, changes)],
        [row.error_before + change.ci_high for row, change in zip(rows, changes)],
    )


def _no_intervals(n: int) -> tuple[list[float], list[float]]:
    return [math.nan] * n, [math.nan] * n


def default_state_change_chart(
    labels: Sequence[str],
    rows: Sequence[DefaultStateRow],
    what: str,
    path: Path,
    title: str,
    n_inputs: int,
    level: str = "95%",
) -> Figure:
    """The change in the error under ``remove_sink`` (left) and under its matched control
    (right, on its own scale, values written beside the bars), each bar with its interval
    over the ``n_inputs`` inputs (none from fewer than ``MIN_INTERVAL_UNITS``): for errors whose changes are
    small next to their level (a loss)."""

    def series(name: str, estimates: Sequence[Estimate]) -> IntervalSeries:
        bounded = interval_possible(n_inputs)
        return IntervalSeries(
            name,
            [estimate.mean for estimate in estimates],
            [estimate.ci_low if bounded else math.nan for estimate in estimates],
            [estimate.ci_high if bounded else math.nan for estimate in estimates],
        )

    effect = replace(series("sink removed", [row.remove_increase for row in rows]), colour=EFFECT_COLOUR)
    control = replace(series("matched control", [row.control_increase for row in rows]), colour=CONTROL_COLOUR)
    effect_control_chart(labels, effect, control, path, title, f"change in {what}")
    whiskers = (
        f"whiskers: {level} bootstrap intervals over {plural(n_inputs, 'input')}"
        if interval_possible(n_inputs)
        else (f"n = {n_inputs}, no interval")
    )
    return Figure(
        path,
        f"{title}: change in {what} when the sinks are removed (left) and under the matched control (right, on "
        f"its own scale); {whiskers}",
        path.parent,
    )


# activation patching ------------------------------------------------------------------


# the sites a patching chart shows: the largest effects, as many as a page's width labels
MAX_CHART_SITES = 12


def _shown_value(result: PatchingResult) -> str:
    """The normalised effect where one is defined (source and target differ), else the effect."""
    return "normalised_effect" if any(not math.isnan(row.normalised_effect) for row in result.rows) else "effect"


def _ranked(result: PatchingResult, value: str) -> list[PatchingRow]:
    """The sites with a value, the largest in size first."""
    measured = (row for row in result.rows if not math.isnan(getattr(row, value)))
    return sorted(measured, key=lambda row: -abs(getattr(row, value)))


def patching_finding(result: PatchingResult) -> str:
    """The sites with the largest effects, in one sentence, the largest with its interval."""
    value = _shown_value(result)
    ranked = _ranked(result, value)
    largest = abs(getattr(ranked[0], value)) if ranked else 0.0
    strong = [row for row in ranked[:4] if abs(getattr(row, value)) >= 0.1 * largest] or ranked[:1]
    parts = [f"{patch_site(row)} {getattr(row, value):+.2f}" for row in strong]
    if strong:
        top = strong[0]
        low, high = getattr(top, f"{value}_ci_low"), getattr(top, f"{value}_ci_high")
        parts[0] = f"{patch_site(top)} {estimate_text(getattr(top, value), low, high, result.n_inputs)}"
    sites = plural(len(result.rows), "site")
    return (
        f"Patching {result.hook} per {' x '.join(result.per)} ({sites}, {plural(result.n_inputs, 'input pair')}; "
        f"metric {sig(result.target_metric, 3)} on the target, {sig(result.source_metric, 3)} on the "
        f"source): the largest {value} is at {', '.join(parts) or 'no site'}."
    )


def patching_table(result: PatchingResult, caption: str) -> Table:
    """One row per patched site (columns for the axes ``per`` iterates; interval columns
    only where there are intervals)."""
    return patching_definition(result.per).table(result.rows, caption).without_empty_columns()


def patching_effects_chart(result: PatchingResult, path: Path, title: str) -> Figure:
    """The sites with the largest effects (at most ``MAX_CHART_SITES``), each bar with its
    interval over input pairs as a whisker (none from fewer than two pairs)."""
    value = _shown_value(result)
    shown = _ranked(result, value)[:MAX_CHART_SITES]
    series = IntervalSeries(
        value.replace("_", " "),
        [getattr(row, value) for row in shown],
        [getattr(row, f"{value}_ci_low") for row in shown],
        [getattr(row, f"{value}_ci_high") for row in shown],
        colour=EFFECT_COLOUR,
    )
    interval_bar_chart([patch_site(row) for row in shown], [series], path, title, value.replace("_", " "))
    bounded = any(math.isfinite(low) for low in series.lows)
    if bounded:
        whiskers = f"whiskers: 95% bootstrap intervals over {plural(result.n_inputs, 'input pair')}"
    elif not interval_possible(result.n_inputs):
        whiskers = interval_text(math.nan, math.nan, result.n_inputs)
    else:
        whiskers = f"n = {result.n_inputs:,}, no intervals (the table's note says why)"
    what = f"the {len(shown)} of {plural(len(result.rows), 'site')} with the largest {value.replace('_', ' ')}"
    return Figure(path, f"{title}: {what}; {whiskers}", path.parent)


def provenance_block(provenance: Provenance | None) -> KeyValues:
    """The report's provenance table (what wrote the directory, when, with which versions)."""
    if provenance is None:
        return KeyValues(
            "Provenance",
            (
                (
                    "recorded",
                    f"no {PROVENANCE_FILE}: the directory predates provenance records; "
                    "re-run its command to record one",
                ),
            ),
        )
    items = [("command", provenance.command)]
    if provenance.source:
        items.append(("source", provenance.source))
    items += [("created", provenance.created), ("platform", provenance.platform), *provenance.versions]
    return KeyValues("Provenance", tuple(items))
