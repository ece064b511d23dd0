"""The side-by-side comparison in words: what was compared, what each kind's sink heads
write, whether the layers cancel, and how far each pretrained model lies from the toy in
numbers (``sinkscope.probes.mechanism_distance``). Shared by the report
(``sinkscope.probes.mechanism_report``) and the inline display (``sinkscope.probes.mechanism_display``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sinkscope.probes.mechanism_distance import distance_verdicts, toy_distances
from sinkscope.probes.mechanism_rules import CANCELS_BELOW, KINDS, WRITES_ANCHOR_SHARE
from sinkscope.reports.formatting import sig

if TYPE_CHECKING:
    from sinkscope.probes.mechanism import MechanismComparison, MechanismModel


def _names(models: Sequence[MechanismModel]) -> str:
    return _names_of([model.source for model in models])


def _names_of(sources: Sequence[str]) -> str:
    """At most six names in prose (a sweep can hold hundreds of runs)."""
    return ", ".join(sources[:6]) + (f" and {len(sources) - 6} more" if len(sources) > 6 else "")


def _count(n: int, singular: str, plural: str) -> str:
    return f"{n} {singular if n == 1 else plural}"


def _range(values: Sequence[float], digits: int = 3, significant: bool = False) -> str:
    """Mean (and range) of the finite values; ``significant``: ``digits`` significant
    digits, for quantities that span orders of magnitude (a toy's cancellation is 0.0005)."""
    finite = [value for value in values if not math.isnan(value)]
    if not finite:
        return "n/a"
    low, high, mean = min(finite), max(finite), sum(finite) / len(finite)

    def shown(value: float) -> str:
        return sig(value, digits) if significant else f"{value:.{digits}f}"

    return shown(mean) if len(finite) == 1 else f"{shown(mean)} (from {shown(low)} to {shown(high)})"


def _kind_findings(comparison: MechanismComparison, kind: str) -> list[str]:
    """What the sink heads of one kind write, and whether that kind's layers cancel."""
    models = [model for model in comparison.models if model.kind == kind]
    if not models:
        return []
    heads = [head for head in comparison.heads if head.kind == kind]
    findings = []
    if heads:
        shares = [head.value_weighted_anchor_share for head in heads]
        finite = [share for share in shares if not math.isnan(share)]
        mostly = sum(share >= WRITES_ANCHOR_SHARE for share in finite)
        reading = (
            "the anchor carries most of what they write"
            if finite and mostly == len(finite)
            else "the anchor takes their attention but carries little of what they write (its value is small)"
            if finite and mostly == 0
            else f"in {mostly} of {len(finite)} the anchor carries most of what they write"
            if finite
            else "none has a value-weighted share (they write almost nothing, or their values were not measured)"
        )
        findings.append(
            f"{kind.capitalize()} sink heads ({len(heads)} in {sum(m.n_sink_heads > 0 for m in models)} of "
            f"{len(models)} {kind} models): anchor mass {_range([h.anchor_mass for h in heads])}, value-weighted "
            f"anchor share {_range(shares)}, anchor value norm {_range([h.anchor_value_norm for h in heads], 3)}; "
            f"{_count(sum(h.dormant for h in heads), 'is', 'are')} dormant; {reading}."
        )
    else:
        findings.append(f"No {kind} model has a sink head ({_names(models)}).")
    deep = [model for model in models if model.n_layers > 1 and not math.isnan(model.cancellation)]
    if deep:
        cancel = [model for model in deep if model.layers_cancel]
        if len(deep) == 1:
            under = f"it is {'' if cancel else 'not '}under {CANCELS_BELOW:g}"
        else:
            which = "every one" if len(cancel) == len(deep) else "none" if not cancel else f"{_names(cancel)} only"
            under = f"it is under {CANCELS_BELOW:g} in {which}"
        findings.append(
            f"In the {f'{len(deep)} multi-layer {kind} models' if len(deep) > 1 else f'multi-layer {kind} model'}, "
            "||sum of the layers' attention outputs|| / sum of their norms is "
            f"{_range([m.cancellation for m in deep], significant=True)}: the summed output keeps that share of "
            f"what the layers write, the rest cancels; {under}."
        )
    return findings


def _mechanism_answer(comparison: MechanismComparison) -> list[str]:
    """What each model's numbers read as against the absolute thresholds, one sentence per
    group of models; how far each lies from the toy is ``distance_verdicts``."""
    groups: dict[str, list[MechanismModel]] = {}
    measured_against_toy = {distance.model for distance in toy_distances(comparison)}
    for model in comparison.models:
        if model.source in measured_against_toy:  # its verdict is its distance from the toy's numbers
            continue
        writes, cancels = model.writes_anchor, model.layers_cancel
        if writes is None:
            key = "no sink head, so no sink to explain"
        elif not writes:
            key = (
                f"the anchor's value is small: sink heads put their attention on it but under "
                f"{WRITES_ANCHOR_SHARE:g} of what they write comes from it"
            )
        elif cancels:
            key = f"sink heads write the anchor's value and the layers cancel it (cancellation under {CANCELS_BELOW:g})"
        elif cancels is None and model.n_layers == 1:
            key = "sink heads write the anchor's value (one layer: nothing to cancel)"
        elif cancels is None:
            key = "sink heads write the anchor's value; whether the layers cancel was not measured"
        else:
            key = "sink heads write the anchor's value but the layers do not cancel"
        groups.setdefault(key, []).append(model)
    return [
        f"{_names(models)}: {key} (value-weighted share "
        + ", ".join(sig(m.sink_value_weighted_anchor_share, 3) for m in models)
        + "; cancellation "
        + ", ".join(sig(m.cancellation, 3) for m in models)
        + ")."
        for key, models in groups.items()
    ]


def mechanism_findings(comparison: MechanismComparison) -> list[str]:
    """The comparison in words: what was compared and how each probe was obtained, what
    the sink heads of each kind write, whether the layers cancel, which mechanism holds where."""
    models = comparison.models
    counts = {kind: sum(model.kind == kind for model in models) for kind in KINDS}
    origins: dict[str, list[str]] = {}
    for model in models:
        origins.setdefault(model.origin, []).append(model.source)
    rules = " or ".join(sorted({f"{1.0 - model.sink_eps:g}" for model in models}))
    findings = [
        f"{len(models)} models compared with the same probes: {counts['toy']} toy, {counts['pretrained']} "
        f"pretrained; {len(comparison.heads)} sink heads in all (anchor mass >= {rules} over the probe's queries).",
        "Probes: " + "; ".join(f"{origin}: {_names_of(sources)}" for origin, sources in origins.items()) + ".",
    ]
    for kind in KINDS:
        findings += _kind_findings(comparison, kind)
    return findings + _mechanism_answer(comparison) + distance_verdicts(comparison) + list(comparison.notes)
