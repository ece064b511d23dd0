"""The sink experiments of Gu et al. (ICLR 2025) on any probed model: the sink rate and the
anchor mass per input type (their Table 1), the sink rate against eps, and both against the
prompt length T (their Fig. 3), each a mean over prompts with a bootstrap interval.

Every number comes from ``sink_samples.SampleSums``: each prompt's alpha_k and anchor mass
per (layer, head). A prompt's sink rate is the percent of its (layer, head) pairs with
alpha_k > eps; its anchor mass is the mean over its (layer, head) pairs of the mean
attention on the anchor over its queries after the anchor. Both are then averaged per
prompt (every prompt weighs the same), so with every head measured the sink rate is Gu et
al.'s Sink_k^eps over all (prompt, layer, head) entries. Intervals: percentile bootstrap
over prompts (``n_bootstrap`` resamples, ``seed``); none from fewer than two prompts.

``sink_curves(model, inputs, ...)`` runs one probe pass on toy or pretrained models alike
and returns ``SinkCurves`` for those inputs (input type ``given``); the pretrained audit
adds random and repeated tokens (``sinkscope.pretrained_analysis.input_types``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch

from sinkscope.infra.arguments import check_argument
from sinkscope.infra.bounds import COUNT, FRACTION, MAX_TOKENS, POSITIVE, UNBOUNDED, Bound, Problem, at_most
from sinkscope.infra.errors import InputError
from sinkscope.infra.intervals import CONFIDENCE, interval_possible
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.probes.probe import ProbeConfig
from sinkscope.probes.runner import iterate_batches, probe_batches
from sinkscope.probes.sink_samples import SampleSums

if TYPE_CHECKING:
    import pandas

TABLE_EPS = 0.3  # Gu et al.'s Table 1 reads Sink_1^0.3
# how the inputs were built: the audit's two protocols (``pretrained_analysis.input_types``:
# ``sinkscope``, the prompts' own lengths and anchor; ``gu``, Gu et al.'s 64 tokens without
# BOS) or ``given``, the caller's own inputs (``sink_curves``)
INPUT_PROTOCOLS: tuple[str, ...] = ("sinkscope", "gu", "given")


@dataclass(frozen=True)
class SampleMean:
    """A mean over ``n`` prompts and its 95% percentile-bootstrap interval (NaN ends from
    fewer than two prompts: no interval; NaN mean from none)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {"mean": UNBOUNDED, "ci_low": UNBOUNDED, "ci_high": UNBOUNDED, "n": COUNT}

    mean: float
    ci_low: float
    ci_high: float
    n: int

    def inconsistencies(self) -> Iterator[Problem]:
        yield from at_most("ci_low", self.ci_low, self.ci_high, "ci_high")


@dataclass(frozen=True)
class InputTypeRow:
    """One input type's sink rate (percent, at ``SinkCurves.eps``) and anchor mass."""

    input_type: str
    sink_rate: SampleMean
    anchor_mass: SampleMean


@dataclass(frozen=True)
class EpsPoint:
    """The sink rate (percent) of one input type at one eps."""

    BOUNDS: ClassVar[dict[str, Bound]] = {"eps": FRACTION}

    input_type: str
    eps: float
    sink_rate: SampleMean


@dataclass(frozen=True)
class LengthPoint:
    """The sink rate (percent, at ``SinkCurves.eps``) and anchor mass of one input type's
    prompts cut to ``length`` tokens (anchor included); prompts shorter than it are left out."""

    BOUNDS: ClassVar[dict[str, Bound]] = {"length": POSITIVE}

    input_type: str
    length: int
    sink_rate: SampleMean
    anchor_mass: SampleMean


@dataclass(frozen=True)
class SinkCurves:
    """The sink experiments of one model. eps: the table's and the length curve's eps; k:
    Gu et al.'s k (0: the anchor); n_forwards: forward passes the experiments added to the
    probe's own; notes: how the inputs were built and the lengths measured; input_protocol:
    how the inputs were built (``INPUT_PROTOCOLS``; results written before it was recorded
    were the audit's ``sinkscope`` protocol)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {"eps": FRACTION, "k": COUNT, "n_forwards": COUNT}

    eps: float
    k: int
    input_types: tuple[InputTypeRow, ...]
    eps_curve: tuple[EpsPoint, ...] = ()
    length_curve: tuple[LengthPoint, ...] = ()
    n_forwards: int = 0
    notes: tuple[str, ...] = ()
    input_protocol: str = "sinkscope"

    def inconsistencies(self) -> Iterator[Problem]:
        if self.input_protocol not in INPUT_PROTOCOLS:
            yield "input_protocol", self.input_protocol, f"one of {', '.join(INPUT_PROTOCOLS)}"

    def to_dataframe(self) -> pandas.DataFrame:
        """One row per measured point: experiment (input_type, eps, length), input type, x,
        metric, mean, ci_low, ci_high, n."""
        from sinkscope.reports.frames import dataframe

        return dataframe(curve_rows(self))

    def _repr_html_(self) -> str:
        from sinkscope.probes.sink_curve_tables import curves_html  # the report's tables, only when shown

        return curves_html(self)


def curve_rows(curves: SinkCurves) -> Iterator[dict[str, object]]:
    """The long-format rows of ``SinkCurves.to_dataframe``."""

    def row(experiment: str, input_type: str, x: float, metric: str, value: SampleMean) -> dict[str, object]:
        return {"experiment": experiment, "input_type": input_type, "x": x, "metric": metric, **vars(value)}

    for item in curves.input_types:
        yield row("input_type", item.input_type, curves.eps, "sink_rate_percent", item.sink_rate)
        yield row("input_type", item.input_type, curves.eps, "anchor_mass", item.anchor_mass)
    for point in curves.eps_curve:
        yield row("eps", point.input_type, point.eps, "sink_rate_percent", point.sink_rate)
    for length in curves.length_curve:
        yield row("length", length.input_type, length.length, "sink_rate_percent", length.sink_rate)
        yield row("length", length.input_type, length.length, "anchor_mass", length.anchor_mass)


def sample_mean(values: torch.Tensor, n_bootstrap: int = 1000, seed: int = 0) -> SampleMean:
    """Mean of the finite entries of ``values [n]`` and their percentile-bootstrap interval
    (none from fewer than ``MIN_INTERVAL_UNITS``)."""
    kept = values[torch.isfinite(values)].double().numpy()
    n = int(kept.size)
    if n == 0:
        return SampleMean(math.nan, math.nan, math.nan, 0)
    if not interval_possible(n):
        return SampleMean(float(kept.mean()), math.nan, math.nan, n)
    draws = np.random.default_rng(seed).integers(0, n, size=(n_bootstrap, n))
    means = kept[draws].mean(axis=1)
    tail = (1.0 - CONFIDENCE) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return SampleMean(float(kept.mean()), float(low), float(high), n)


def prompt_sink_rates(alpha: torch.Tensor, eps: float) -> torch.Tensor:
    """``[prompt]``: percent of each prompt's measured (layer, head) pairs with alpha > eps
    (``alpha [prompt, layer, head]``); NaN for a prompt with none measured."""
    valid = torch.isfinite(alpha)
    hits = ((alpha > eps) & valid).flatten(1).sum(dim=1).double()
    count = valid.flatten(1).sum(dim=1).double()
    return torch.where(count > 0, 100.0 * hits / count.clamp_min(1), torch.nan)


def prompt_means(values: torch.Tensor) -> torch.Tensor:
    """``[prompt]``: the mean of each prompt's measured (layer, head) entries (NaN for none)."""
    return values.flatten(1).nanmean(dim=1)


@dataclass(frozen=True)
class Samples:
    """One input type's per-prompt arrays ``[prompt, point, layer, head]`` (point 0: the full
    length, then ``lengths``)."""

    input_type: str
    alpha: torch.Tensor
    mass: torch.Tensor
    lengths: tuple[int, ...]


def summarise(
    samples: Sequence[Samples],
    eps_curve: Sequence[float] = (),
    k: int = 0,
    n_bootstrap: int = 1000,
    seed: int = 0,
    n_forwards: int = 0,
    notes: tuple[str, ...] = (),
    input_protocol: str = "given",
) -> SinkCurves:
    """``SinkCurves`` from each input type's per-prompt arrays, built by ``input_protocol``."""

    def rate(alpha: torch.Tensor, eps: float) -> SampleMean:
        return sample_mean(prompt_sink_rates(alpha, eps), n_bootstrap, seed)

    def mass(values: torch.Tensor) -> SampleMean:
        return sample_mean(prompt_means(values), n_bootstrap, seed)

    rows = tuple(InputTypeRow(s.input_type, rate(s.alpha[:, 0], TABLE_EPS), mass(s.mass[:, 0])) for s in samples)
    eps_points = tuple(
        EpsPoint(s.input_type, float(eps), rate(s.alpha[:, 0], eps)) for s in samples for eps in eps_curve
    )
    lengths = tuple(
        LengthPoint(s.input_type, length, rate(s.alpha[:, 1 + index], TABLE_EPS), mass(s.mass[:, 1 + index]))
        for s in samples
        for index, length in enumerate(s.lengths)
    )
    return SinkCurves(TABLE_EPS, k, rows, eps_points, lengths, n_forwards, notes, input_protocol)


MAX_LENGTH = MAX_TOKENS  # tokens: beyond any context a model has, and within every index type


def check_curve_settings(eps_curve: Sequence[float], lengths: Sequence[int]) -> None:
    """An ``InputError`` naming the flag for an eps outside [0, 1) or a length below 2."""
    for eps in eps_curve:
        if not 0.0 <= eps < 1.0:
            raise InputError(f"every eps of the eps curve must lie in [0, 1), got {eps}", field="eps_curve")
    for length in lengths:
        if not 2 <= length <= MAX_LENGTH:
            raise InputError(
                f"every length must lie in 2..{MAX_LENGTH:,} tokens (the anchor and a query, at most), got {length}",
                field="lengths",
            )


def _check_settings(eps_curve: object, lengths: object, config: object, n_bootstrap: object, seed: object) -> None:
    """The Python API's arguments, typed as documented, in one line each."""
    for name, values, kind, what in (
        ("eps_curve", eps_curve, (float, int), "numbers in [0, 1)"),
        ("lengths", lengths, int, "whole numbers >= 2"),
    ):
        check_argument(values, (tuple, list), name, f"a tuple of {what}")
        for value in values:  # type: ignore[attr-defined]
            check_argument(value, kind, name, f"a tuple of {what}")
    check_argument(config, ProbeConfig, "config", "a ProbeConfig")
    for name, value, least in (("n_bootstrap", n_bootstrap, 20), ("seed", seed, 0)):
        check_argument(value, int, name, "a whole number")
        if value < least:  # type: ignore[operator]
            raise InputError(f"{name} must be >= {least}, got {value}", field=name)


def _check_inputs(kind: str, tokens: object) -> None:
    """An ``InputError`` for inputs no sink rate can be read from: not token ids ``[n, pos]``
    or float toy tokens ``[n, pos, d_model]``, one position (no query after the anchor), or
    non-finite toy tokens (every pattern NaN: nothing measured, and no word why)."""
    if not torch.is_tensor(tokens) or tokens.ndim not in (2, 3) or (tokens.ndim == 3) != tokens.is_floating_point():
        raise InputError(
            f"inputs {kind!r} must be token ids [n, pos] (integers) or toy tokens [n, pos, d_model] (floats)",
            field="inputs",
        )
    if tokens.shape[0] < 1 or tokens.shape[1] < 2:
        raise InputError(
            f"inputs {kind!r} have shape {tuple(tokens.shape)}: a sink rate needs at least one input of 2 positions "
            "(the anchor and a query)",
            field="inputs",
        )
    if tokens.is_floating_point() and not bool(torch.isfinite(tokens).all()):
        raise InputError(f"inputs {kind!r} hold NaN or infinite values; pass finite toy tokens", field="inputs")


def sink_curves(
    model: torch.nn.Module | HookedModel,
    inputs: torch.Tensor | Mapping[str, torch.Tensor],
    attention_mask: torch.Tensor | None = None,
    query_mask: torch.Tensor | None = None,
    eps_curve: Sequence[float] = (0.1, 0.3, 0.5, 0.7, 0.9),
    lengths: Sequence[int] = (),
    config: ProbeConfig = ProbeConfig(),
    n_bootstrap: int = 1000,
    seed: int = 0,
) -> SinkCurves:
    """The sink rate per eps and the sink rate and anchor mass per length of ``inputs`` (toy
    tokens ``[n, pos, d_model]`` or token ids ``[n, pos]``) on a causal model, one probe
    pass (``sink_samples``) per input type. ``inputs``: one tensor (input type ``given``),
    or input types to tensors side by side, e.g. ``{kind: toy_input_tokens(task, kind, 256)
    for kind in TOY_INPUT_TYPES}``; the masks apply to every type."""
    _check_settings(eps_curve, lengths, config, n_bootstrap, seed)
    hooked = model if isinstance(model, HookedModel) else HookedModel(model)
    if lengths and not hooked.spec.causal:
        raise InputError("the one-pass length curve needs a causal model; audit an encoder with lengths instead")
    check_curve_settings(eps_curve, lengths)
    eps_curve = tuple(sorted(set(eps_curve)))  # a curve is drawn in eps order, each eps once
    by_type = inputs if isinstance(inputs, Mapping) else {"given": inputs}
    if not by_type or not all(isinstance(kind, str) and kind for kind in by_type):
        raise InputError("inputs must be a tensor or a non-empty mapping of input type names to tensors")
    for kind, tokens in by_type.items():
        _check_inputs(kind, tokens)
    lengths = tuple(sorted(set(lengths)))
    samples = []
    for kind, tokens in by_type.items():
        sums = SampleSums(hooked.spec.n_layers, hooked.spec.n_heads, config.alpha_k, lengths)
        probe_batches(hooked, iterate_batches(tokens, attention_mask, query_mask, config.batch_size), config, sums)
        samples.append(Samples(kind, sums.alpha(), sums.mass(), lengths))
    return summarise(samples, tuple(eps_curve), config.alpha_k, n_bootstrap, seed, n_forwards=len(samples) - 1)
