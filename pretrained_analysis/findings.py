"""The findings of an audit and of a comparison of audits: sentences made from the
numbers, shared by the report (``sinkscope.pretrained_analysis.report``) and the inline notebook
display (``sinkscope.pretrained_analysis.display``)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from sinkscope.interp.visibility import layer_reach
from sinkscope.pretrained_analysis.geometry_sections import geometry_findings
from sinkscope.pretrained_analysis.tables import LOSS
from sinkscope.probes.default_state import Estimate
from sinkscope.probes.head_ablation_report import head_ablation_findings
from sinkscope.probes.layer_tables import span_summary
from sinkscope.probes.probe import HeadProbe, LayerProbe, ProbeResult
from sinkscope.probes.report_sections import (
    default_state_finding,
    hidden_anchor_phrase,
    sink_head_phrase,
    sink_rate_phrase,
    sink_rules_phrase,
    value_share_phrase,
)
from sinkscope.probes.sink_curve_tables import curve_findings
from sinkscope.probes.tables import SINK_RATE_NAME
from sinkscope.reports.document import percent, sig
from sinkscope.reports.formatting import confidence_label, estimate_text, index_ranges, plural

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sinkscope.pretrained_analysis.ablation import AblationResult
    from sinkscope.pretrained_analysis.audit import AuditResult
    from sinkscope.pretrained_analysis.compare import Comparison, ComparisonRow


def probed_layers_phrase(result: AuditResult) -> str | None:
    """For a restricted audit: which layers it probed, and that every per-layer finding is
    among them (None for an audit of every layer)."""
    chosen = result.config.restricted_layers(result.model.n_layers)
    if chosen is None:
        return None
    return (
        f"Only layers {index_ranges(chosen)} were probed ({len(chosen)} of {result.model.n_layers}): every per-layer "
        "finding, sink head and massive activation here is among the probed layers."
    )


def span_phrase(result: AuditResult) -> str | None:
    """Each layer's attention span, for a model with windowed or chunked layers (None for a
    fully causal one), whether any window or chunk is shorter than the longest prompt, and
    where the sink heads sit: in global layers or in local ones."""
    spec = result.probe.model
    if not (spec.sliding_windows or spec.attention_chunks):
        return None
    longest = result.prompts.max_tokens
    reaches = [size for size in (*spec.sliding_windows, *spec.attention_chunks) if size]
    hidden = (
        f"no window or chunk is shorter than the longest prompt ({longest} tokens), so every query here sees "
        "every earlier key"
        if min(reaches) >= longest
        else f"the shortest span ({min(reaches):,}) is below the longest prompt ({longest} tokens)"
    )
    sinks = [head.layer for head in result.probe.heads if head.is_sink_head]
    local = sum(1 for layer in sinks if layer_reach(spec, layer) != (0, 0))
    where = (
        f"; of its {plural(len(sinks), 'sink head')}, {len(sinks) - local} sit in global layers and {local} in "
        "windowed or chunked ones"
        if sinks
        else ""
    )
    return f"Attention spans: {span_summary(spec)}; {hidden}{where}."


def _layer_phrase(layers: tuple[LayerProbe, ...], scope: str = "") -> str:
    measured = [layer for layer in layers if not math.isnan(layer.anchor_mass)]
    if not measured:
        return "No layer could be measured."
    top = max(measured, key=lambda layer: layer.anchor_mass)
    low = min(measured, key=lambda layer: layer.anchor_mass)
    if len(measured) == 1:
        return f"Anchor mass (mean over heads) is {top.anchor_mass:.3f} in layer {top.layer}, the one layer measured."
    return (
        f"Anchor mass (mean over heads) is highest in layer {top.layer} ({top.anchor_mass:.3f}) and lowest in "
        f"layer {low.layer} ({low.anchor_mass:.3f}){scope}."
    )


def _massive_phrase(layers: tuple[LayerProbe, ...], scope: str) -> str | None:
    total = sum(layer.massive_count for layer in layers)
    if total == 0:
        peak = max(
            (layer.max_abs_resid for layer in layers if not math.isnan(layer.max_abs_resid)), default=float("nan")
        )
        return f"No massive activations (|x| > 100 and > 1000 x the median); the largest |residual| is {sig(peak, 3)}."
    at_anchor = sum(layer.massive_at_anchor for layer in layers)
    first = next(layer.layer for layer in layers if layer.massive_count)
    return (
        f"{total:,} massive activations in the residual stream ({at_anchor:,} at the anchor), "
        f"from layer {first} on{scope}."
    )


def learned_sink_phrase(probe: ProbeResult) -> str | None:
    """The heads whose learned sink logit (gpt-oss) takes at least the sink-head threshold
    of their attention, every one with its anchor mass beside it; without such heads, the
    largest learned sink mass. None for a model without learned sinks (nothing measured)."""
    measured = [head for head in probe.heads if not math.isnan(head.null_mass)]
    if not measured:
        return None
    threshold = 1.0 - probe.config.sink_eps
    how = (
        f"1 \u2212 row sum over real keys; mean over all {probe.n_queries:,} queries after the anchor, pooled "
        "over prompts; no interval recorded"
    )
    strong = sorted((h for h in measured if h.null_mass >= threshold), key=lambda h: -h.null_mass)
    if not strong:
        top = max(measured, key=lambda head: head.null_mass)
        return (
            f"No head puts \u2265 {threshold:g} of its attention on its learned sink ({how}); the largest learned "
            f"sink mass is {top.null_mass:.3f} (L{top.layer}H{top.head}, anchor mass {top.anchor_mass:.3f})."
        )
    names = ", ".join(f"L{h.layer}H{h.head} ({h.null_mass:.3f}; anchor mass {h.anchor_mass:.3f})" for h in strong)
    return (
        f"{len(strong)} of {len(measured)} heads put \u2265 {threshold:g} of their attention on their learned sink, "
        f"on no key at all ({how}), strongest first: {names}. --ablate --ablate-sink learned (remove_learned_sink "
        "in Python) removes these; --ablate alone removes the anchor."
    )


def _estimate(estimate: Estimate, n: int) -> str:
    return estimate_text(estimate.mean, estimate.ci_low, estimate.ci_high, n)


def _head(probe: ProbeResult, label: str) -> HeadProbe | None:
    return next((head for head in probe.heads if f"L{head.layer}H{head.head}" == label), None)


def _value_phrase(head: HeadProbe, sinks: list[HeadProbe]) -> str:
    """Whether the head's anchor also carries its value, beside the sink heads' mean."""
    share = head.value_weighted_anchor_share
    if math.isnan(share):
        return ""
    mean = float(np.nanmean([sink.value_weighted_anchor_share for sink in sinks])) if sinks else math.nan
    reading = "its anchor also carries its value" if share >= 0.5 else "its anchor carries little of its value"
    return (
        f" L{head.layer}H{head.head} puts {head.anchor_mass:.3f} of its attention on the anchor and {reading}: "
        f"{share:.3f} of its output norm comes from the anchor (value-weighted anchor share; mean over sink heads "
        f"{sig(mean, 3)})."
    )


def ablation_headline(result: AuditResult) -> str | None:
    """The largest effect of removing sinks, and the surprise when one head's sink alone
    costs more than all sink heads' together; says how many heads were tested alone."""
    ablation = result.ablation
    if ablation is None or ablation.default_state.all_sink_heads is None:
        return None
    test, together = ablation.default_state, ablation.default_state.all_sink_heads
    n, n_sinks = test.n_inputs, len(test.sink_heads)
    alone = [row for row in test.rows if len(row.head_set) == 1]
    if n_sinks < 2 or not alone:
        return None
    top = max(alone, key=lambda row: row.remove_increase.mean)
    _, heads, order = removed_words(ablation)
    tested = f"{len(alone)} of the {n_sinks} {heads} ({order}) were removed one at a time"
    all_text = f"removing all {n_sinks} {heads} together ({_estimate(together.remove_increase, n)})"
    # "more than all together" only where the intervals say so (from two or more prompts)
    separated = n >= 2 and top.remove_increase.ci_low > together.remove_increase.ci_high
    if top.remove_increase.mean > together.remove_increase.mean and not separated:
        sentence = (
            f"Removing {top.label}'s sink alone raises the {LOSS} by {_estimate(top.remove_increase, n)} and "
            f"{all_text}; "
            + (
                "the intervals overlap, so one head is not shown to cost more than all together"
                if n >= 2
                else "with one prompt there is no interval, so one head is not shown to cost more than all together"
            )
            + f"; {tested}."
        )
    elif top.remove_increase.mean > together.remove_increase.mean:
        sentence = (
            f"Removing {top.label}'s sink alone raises the {LOSS} by {_estimate(top.remove_increase, n)}, more than "
            f"{all_text}; {tested}."
        )
    else:
        sentence = (
            f"Removing all {n_sinks} {heads} together raises the {LOSS} by "
            f"{_estimate(together.remove_increase, n)}; of the {len(alone)} {heads} removed one at a time "
            f"({order}, of {n_sinks}), {top.label} costs most "
            f"({_estimate(top.remove_increase, n)})."
        )
    head = _head(result.probe, top.label)
    sinks = [row for row in result.probe.heads if row.is_sink_head]
    return sentence + (_value_phrase(head, sinks) if head is not None and ablation.sink == "anchor" else "")


def removed_words(ablation: AblationResult) -> tuple[str, str, str]:
    """What the ablation's tested heads are called, one and several, and their order."""
    if ablation.sink == "learned":
        return "head with a learned sink", "heads with a learned sink", "largest learned sink mass first"
    return "sink head", "sink heads", "largest anchor mass first"


def audit_findings(result: AuditResult) -> list[str]:
    """The audit's findings: the headline effect of the ablations (when run), the model,
    sink heads (every one), sink rate, layers, value share, massive activations, the
    ablations, then the audit's notes."""
    model, probe = result.model, result.probe
    headline = ablation_headline(result)
    probed = probed_layers_phrase(result)
    scope = "" if probed is None else " among the probed layers"
    findings = [
        *([headline] if headline else []),
        f"{model.label} ({model.architecture}, {model.n_layers} layers x {model.heads_text}, "
        f"{model.n_params:,} parameters) on {plural(result.prompts.n_prompts, 'prompt')} from "
        f"{result.prompts.location}; the anchor is {result.anchor}.",
        *filter(None, [probed]),
        sink_head_phrase(probe.heads, result.config.sink_eps, f"on the anchor, {result.anchor}"),
        *filter(None, [sink_rules_phrase(probe)]),
        f"Sink rate (Gu et al. {SINK_RATE_NAME}, ε the sink-rate threshold): {sink_rate_phrase(result.sink_rates)} "
        "of (prompt, layer, head) entries.",
        _layer_phrase(probe.layers, scope),
    ]
    findings.extend(filter(None, [learned_sink_phrase(probe), hidden_anchor_phrase(probe.layers), span_phrase(result)]))
    sinks = [head for head in result.probe.heads if head.is_sink_head]
    if sinks:
        findings.append(value_share_phrase(sinks, "the anchor"))
    massive = _massive_phrase(probe.layers, scope)
    if massive:
        findings.append(massive)
    if result.experiments is not None:
        findings.extend(curve_findings(result.experiments))
    ablation = result.ablation
    if ablation is not None:
        n_prompts = ablation.default_state.n_inputs
        increase = ablation.evict_anchor_increase
        change = (
            f"{ablation.evict_anchor_delta:+.3f}, no interval recorded"
            if increase is None
            else estimate_text(ablation.evict_anchor_delta, increase.ci_low, increase.ci_high, n_prompts)
        )
        findings.append(
            f"Evicting the anchor from every head (what StreamingLLM avoids: it keeps the first tokens) changes the {LOSS} from "
            f"{ablation.base_loss:.3f} to {ablation.evict_anchor_loss:.3f} (change {change}), means "
            f"of per-prompt losses over {plural(n_prompts, 'prompt')}."
        )
        test = ablation.default_state
        if test.all_sink_heads is not None:
            one, several, _ = removed_words(ablation)
            subject = f"the {one}" if len(test.sink_heads) == 1 else f"all {len(test.sink_heads)} {several}"
            level = confidence_label(test.confidence)
            findings.append(
                default_state_finding(test.all_sink_heads, LOSS, subject, test.n_inputs, level)
                + " Each change is a mean over prompts of the per-prompt loss change."
            )
            findings.extend(
                head_ablation_findings(test.rows, test.all_sink_heads, LOSS, test.n_inputs, "prompt", level)
            )
    findings.extend(geometry_findings(result))
    return findings + list(result.notes)


def _peak_layers(comparison: Comparison) -> str:
    """Where each model's anchor mass peaks, at its own layers (no model is put on another's depth)."""
    parts = []
    for row in comparison.rows:
        measured = [(mass, layer) for layer, mass in enumerate(row.layer_anchor_mass) if not math.isnan(mass)]
        if measured:
            mass, layer = max(measured)
            parts.append(f"{row.label} in layer {layer} of {row.n_layers} ({mass:.3f})")
    return "Anchor mass (mean over heads) peaks: " + "; ".join(parts) + "." if parts else "No layer could be measured."


def _prompts_used(comparison: Comparison) -> int:
    """The prompts each audit ran on; the spec's count for comparisons that did not record it."""
    return comparison.prompts.n_prompts if comparison.prompts_used is None else comparison.prompts_used


def comparison_findings(comparison: Comparison) -> list[str]:
    """The shared prompts, the sink-rate range per eps, the most sinks, the ablations."""
    rows, epsilons = comparison.rows, comparison.epsilons()
    findings = [
        f"{len(rows)} audits on the same prompts ({plural(_prompts_used(comparison), 'prompt')} from "
        f"{comparison.prompt_location}, "
        f"{'BOS prepended' if comparison.prompts.prepend_bos else 'no BOS'}); sink heads: {comparison.sink_head_rule}."
    ]
    for eps in epsilons:
        ranked = sorted(rows, key=lambda row: row.sink_rate[eps])
        low, high = ranked[0].sink_rate[eps], ranked[-1].sink_rate[eps]
        findings.append(
            f"Sink rate at ε = {eps} is {percent(low)} for every model."
            if percent(low) == percent(high)
            else f"Sink rate at ε = {eps} ranges from {percent(low)} ({ranked[0].label}) to "
            f"{percent(high)} ({ranked[-1].label})."
        )
    findings.append(
        f"Sink rates are shares of each model's (prompt, layer, head) entries over the {_prompts_used(comparison):,} "
        "prompts: counts over every entry, with no interval (an audit keeps its sink counts summed over prompts)."
    )
    findings.append(_peak_layers(comparison))
    findings.extend(_trajectory_phrase(model, rows, epsilons) for model, rows in comparison.trajectories())
    findings.extend(_no_trajectory_phrase(comparison))
    most = max(rows, key=lambda row: row.n_sink_heads / (row.n_layers * row.n_heads))
    findings.append(f"Most sink heads: {most.label} with {most.n_sink_heads} of {most.n_layers * most.n_heads}.")
    ablated = [row for row in rows if row.all_sink_heads_loss_delta is not None]
    findings.extend(_ablation_phrase(row) for row in ablated)
    return findings


def _ablation_phrase(row: ComparisonRow) -> str:
    """One audit's two loss changes, each with its interval over the ablation's prompts
    where the comparison recorded it."""

    def change(delta: float | None, estimate: Estimate | None) -> str:
        if estimate is None or row.ablation_prompts is None:
            return f"{delta:+.4f} (no interval recorded)"
        return estimate_text(estimate.mean, estimate.ci_low, estimate.ci_high, row.ablation_prompts)

    return (
        f"{row.label}: removing all sinks changes the {LOSS} by "
        f"{change(row.all_sink_heads_loss_delta, row.all_sink_heads_loss_change)}, evicting the anchor by "
        f"{change(row.evict_anchor_loss_delta, row.evict_anchor_loss_change)} (from {row.base_loss:.3f}; "
        "means over prompts, percentile bootstrap over prompts)."
    )


def _trajectory_phrase(model: str, rows: Sequence[ComparisonRow], epsilons: Sequence[str]) -> str:
    """A model's sinks from its first checkpoint to its last, and the first step where the
    sink rate (at the first ε) reached half its largest value."""
    eps = epsilons[0]
    first, last = rows[0], rows[-1]
    peak = max(row.sink_rate[eps] for row in rows)
    half = next((row for row in rows if row.sink_rate[eps] >= peak / 2), None) if peak > 0 else None
    reached = (
        f"; it first reaches half its largest value ({percent(peak)}) at step {half.step:,}" if half is not None else ""
    )
    return (
        f"Over training ({model}, {len(rows)} checkpoints, steps {first.step:,} to {last.step:,}): the sink rate at "
        f"ε = {eps} goes from {percent(first.sink_rate[eps])} to {percent(last.sink_rate[eps])}{reached}; sink heads "
        f"from {first.n_sink_heads} to {last.n_sink_heads}, mean anchor mass from {first.mean_anchor_mass:.3f} to "
        f"{last.mean_anchor_mass:.3f} (one audit per checkpoint, no interval recorded)."
    )


def _no_trajectory_phrase(comparison: Comparison) -> list[str]:
    """Why a model's checkpoints are drawn in the given order rather than against the step."""
    drawn = {model for model, _ in comparison.trajectories()}
    phrases = []
    for model, rows in comparison.model_groups():
        if len(rows) < 2 or model in drawn or len({row.revision for row in rows}) < len(rows):
            continue
        unknown = [str(row.revision) for row in rows if row.step is None]
        steps = [row.step for row in rows if row.step is not None]
        shared = sorted({step for step in steps if steps.count(step) > 1})
        why = (
            f"no training step is known for {', '.join(unknown)} (give it with --steps REV=STEP)"
            if unknown
            else f"two checkpoints share step {shared[0]:,}"
        )
        phrases.append(f"{model}'s checkpoints are drawn in the order given, not against the training step: {why}.")
    return phrases
