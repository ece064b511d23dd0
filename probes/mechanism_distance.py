"""How far each pretrained model's sink mechanism lies from the toy's, in numbers.

Two quantities decide the paper's mechanism (``sinkscope.probes.mechanism_rules`` says what
each means and which distance counts as close):

- the value-weighted anchor share of the sink heads: a mean over sink heads, so it gets a
  percentile-bootstrap interval over heads, and the difference from the toy's a
  bootstrap interval over both models' heads;
- the cancellation ratio: one number per model (the probe sums every query of every
  input before taking norms), so it has no interval; the distance is a ratio.

The toy reference is every toy model in the comparison with sink heads (pooled heads for
the share; for the cancellation, the multi-layer ones, and the ratio is taken against the
toy value nearest the pretrained model's, so "N x the toy's" is the smallest such factor).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sinkscope.infra.intervals import CONFIDENCE, interval_possible
from sinkscope.probes.mechanism_rules import (
    CANCELLATION,
    CANCELLATION_CLOSE_FACTOR,
    N_BOOTSTRAP,
    SHARE,
    SHARE_CLOSE,
)
from sinkscope.reports.document import Cell, Column, TableDefinition
from sinkscope.reports.formatting import common_decimals, sig

if TYPE_CHECKING:
    from sinkscope.probes.mechanism import MechanismComparison, MechanismModel


@dataclass(frozen=True)
class Spread:
    """A mean over ``n`` units (sink heads, models) with its interval; NaN ends for n < ``MIN_INTERVAL_UNITS``."""

    mean: float
    low: float
    high: float
    n: int
    unit: str

    def text(self) -> str:
        count = f"n = {self.n} {self.unit}{'' if self.n == 1 else 's'}"
        if not interval_possible(self.n) or math.isnan(self.low):
            return f"{sig(self.mean, 3)} ({count}, no interval)"
        shown = common_decimals((self.mean, self.low, self.high), 3)  # one number of decimals, 0.583 [0.565, 0.599]
        mean, low, high = shown if shown else (sig(self.mean, 3), sig(self.low, 3), sig(self.high, 3))
        return f"{mean} [{low}, {high}] ({count})"


def _finite(values: Sequence[float]) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    return array[np.isfinite(array)]


def _bootstrap_means(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return values[rng.integers(0, len(values), (N_BOOTSTRAP, len(values)))].mean(axis=1)


def _ends(draws: np.ndarray) -> tuple[float, float]:
    tail = (1.0 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return float(low), float(high)


def spread(values: Sequence[float], unit: str, seed: int = 0) -> Spread:
    """The mean of the finite ``values`` and its percentile-bootstrap interval (none for fewer
    than ``MIN_INTERVAL_UNITS``)."""
    finite = _finite(values)
    if len(finite) == 0:
        return Spread(math.nan, math.nan, math.nan, 0, unit)
    if not interval_possible(len(finite)):
        return Spread(float(finite.mean()), math.nan, math.nan, len(finite), unit)
    return Spread(
        float(finite.mean()), *_ends(_bootstrap_means(finite, np.random.default_rng(seed))), len(finite), unit
    )


def difference_interval(ours: Sequence[float], theirs: Sequence[float], seed: int = 0) -> tuple[float, float]:
    """Bootstrap interval of mean(ours) - mean(theirs), each resampled on its own; NaN
    unless both have ``MIN_INTERVAL_UNITS`` values or more."""
    a, b = _finite(ours), _finite(theirs)
    if not (interval_possible(len(a)) and interval_possible(len(b))):
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    return _ends(_bootstrap_means(a, rng) - _bootstrap_means(b, rng))


@dataclass(frozen=True)
class Distance:
    """One quantity of one pretrained model beside the toy's: both values, their difference
    (with an interval where both have units to resample) and their ratio."""

    model: str
    quantity: str
    value: Spread
    toy: Spread
    toy_models: tuple[str, ...]
    difference: float
    difference_low: float
    difference_high: float
    ratio: float

    @property
    def close(self) -> bool | None:
        """Whether it lies within the rules' distance of the toy's (None when unmeasured)."""
        if math.isnan(self.difference):
            return None
        if self.quantity == SHARE:
            return abs(self.difference) <= SHARE_CLOSE
        return 1.0 / CANCELLATION_CLOSE_FACTOR <= self.ratio <= CANCELLATION_CLOSE_FACTOR


def _toy_references(comparison: MechanismComparison) -> tuple[list[MechanismModel], list[MechanismModel]]:
    """The toy models with sink heads, and those of them whose cancellation was measured."""
    toys = [model for model in comparison.models if model.kind == "toy" and model.n_sink_heads > 0]
    deep = [model for model in toys if model.n_layers > 1 and not math.isnan(model.cancellation)]
    return toys, deep


def _shares(comparison: MechanismComparison, sources: set[str]) -> list[float]:
    return [head.value_weighted_anchor_share for head in comparison.heads if head.source in sources]


def _share_distance(comparison: MechanismComparison, model: MechanismModel, toys: list[MechanismModel]) -> Distance:
    ours, theirs = _shares(comparison, {model.source}), _shares(comparison, {toy.source for toy in toys})
    value, toy = spread(ours, "sink head"), spread(theirs, "sink head")
    low, high = difference_interval(ours, theirs)
    ratio = value.mean / toy.mean if toy.mean > 0 else math.nan
    names = tuple(t.source for t in toys)
    return Distance(model.source, SHARE, value, toy, names, value.mean - toy.mean, low, high, ratio)


def _cancellation_distance(model: MechanismModel, deep: list[MechanismModel]) -> Distance:
    value = spread([model.cancellation], "model")
    toy_values = [toy.cancellation for toy in deep]
    toy = spread(toy_values, "toy model")
    # against the toy value nearest on a log scale: the smallest factor between them
    nearest = min(toy_values, key=lambda v: abs(math.log(model.cancellation / v)) if v > 0 else math.inf)
    ratio = model.cancellation / nearest if nearest > 0 else math.nan
    names = tuple(t.source for t in deep)
    return Distance(
        model.source, CANCELLATION, value, toy, names, model.cancellation - nearest, math.nan, math.nan, ratio
    )


def toy_distances(comparison: MechanismComparison) -> list[Distance]:
    """Each pretrained model's share and cancellation beside the toy's (where both exist)."""
    toys, deep = _toy_references(comparison)
    distances = []
    for model in comparison.models:
        if model.kind != "pretrained":
            continue
        if toys and model.n_sink_heads > 0:
            distances.append(_share_distance(comparison, model, toys))
        if deep and model.n_layers > 1 and not math.isnan(model.cancellation) and model.cancellation > 0:
            distances.append(_cancellation_distance(model, deep))
    return distances


def _ratio_text(distance: Distance) -> str:
    if math.isnan(distance.ratio):
        return "no ratio"
    return f"{sig(distance.ratio, 3)}x the toy's"


def distance_phrase(distance: Distance) -> str:
    """One quantity beside the toy's, with how far apart they are and the rule for "close"."""
    toy_names = ", ".join(distance.toy_models[:3]) + (" and more" if len(distance.toy_models) > 3 else "")
    if distance.quantity == SHARE:
        interval = (
            f" [{distance.difference_low:+.3f}, {distance.difference_high:+.3f}]"
            if not math.isnan(distance.difference_low)
            else ""
        )
        apart, rule = f"difference {distance.difference:+.3f}{interval}", f"close: within {SHARE_CLOSE:g}"
    else:
        apart, rule = _ratio_text(distance), f"close: within a factor of {CANCELLATION_CLOSE_FACTOR:g}"
    reading = {True: "close to the toy's", False: "far from the toy's", None: "not comparable"}[distance.close]
    return (
        f"{distance.quantity} {distance.value.text()} against {distance.toy.text()} in {toy_names}: "
        f"{apart}, {reading} ({rule})"
    )


def _verdict(own: Sequence[Distance]) -> str:
    """The sentence the numbers support: which quantities lie close to the toy's, which far."""
    like = [d.quantity for d in own if d.close]
    unlike = [d.quantity for d in own if d.close is False]
    parts = ([f"like the toy in {' and '.join(like)}"] if like else []) + (
        [f"{'unlike it' if like else 'unlike the toy'} in {' and '.join(unlike)}"] if unlike else []
    )
    missing = "" if any(d.quantity == SHARE for d in own) else " (no sink head at this threshold: no share to compare)"
    return ". So it is " + ", ".join(parts) + missing + "." if parts else "."


def distance_verdicts(comparison: MechanismComparison) -> list[str]:
    """Per pretrained model: its quantities beside the toy's and a verdict made from them."""
    distances = toy_distances(comparison)
    if not any(model.kind == "toy" for model in comparison.models):
        return []
    if not distances:
        return ["No pretrained model could be measured against the toy: no toy model has a sink head."]
    verdicts = []
    for source in dict.fromkeys(distance.model for distance in distances):
        own = [distance for distance in distances if distance.model == source]
        verdicts.append(f"{source} beside the toy: " + "; ".join(distance_phrase(d) for d in own) + _verdict(own))
    return verdicts


def _interval(low: float, high: float, n: int | None = None) -> str:
    if math.isnan(low):
        return f"none (n = {n})" if n is not None and not interval_possible(n) else "none"
    return f"[{sig(low, 3)}, {sig(high, 3)}]"


def _cells(distance: Distance) -> tuple[Cell, ...]:
    value, toy = distance.value, distance.toy
    return (
        distance.model,
        distance.quantity,
        value.mean,
        _interval(value.low, value.high, value.n),
        value.n,
        toy.mean,
        _interval(toy.low, toy.high, toy.n),
        toy.n,
        distance.difference,
        _interval(distance.difference_low, distance.difference_high),
        distance.ratio,
        {True: "close", False: "far", None: "n/a"}[distance.close],
    )


DISTANCE_TABLE: TableDefinition[Distance] = TableDefinition(
    "Each pretrained model's share and cancellation beside the toy's",
    (
        Column("model"),
        Column("quantity"),
        Column("value", ".3g", numeric=True),
        Column(f"{int(CONFIDENCE * 100)}% interval"),
        Column("n", numeric=True),
        Column("toy value", ".3g", numeric=True),
        Column(f"toy {int(CONFIDENCE * 100)}% interval"),
        Column("toy n", numeric=True),
        Column("difference", "+.3g", numeric=True),
        Column("difference interval"),
        Column("ratio", ".3g", numeric=True),
        Column("reading"),
    ),
    _cells,
    "value, toy value: means over n units with a percentile-bootstrap interval over those units (none for n < 5). "
    "value-weighted anchor share: units are sink heads; its difference has a bootstrap interval over both models' "
    "heads. cancellation: one ratio per model, no interval; its difference and ratio are against the toy model "
    "nearest on a log scale. reading: close or far by the rules under 'How to read it'.",
)
