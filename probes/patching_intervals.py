"""Bootstrap intervals of activation patching's effects, over input pairs.

A patching run scores every input pair on the source run, the clean target run and the
target run patched at each site. Resampling the pairs (with replacement, the same draws
for every site and for the source and target runs, so each draw keeps the pairing) gives
each site's effect ``mean(patched) - mean(target)`` and normalised effect
``(mean(patched) - mean(target)) / (mean(source) - mean(target))`` once per draw; the
percentile interval of those draws is the site's interval. Fewer than
``MIN_INTERVAL_UNITS`` pairs give no interval (NaN ends; sinkscope.infra.intervals). Nor does a normalised effect
whose denominator changes sign or vanishes in some draw: the ratio's draws then run off to
infinity, and the effect's interval is the one to read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import einsum
from jaxtyping import Float

from sinkscope.infra.intervals import CONFIDENCE, interval_possible

N_BOOTSTRAP = 1000
# sites resampled at once: a [sites, draws] block of float64 stays a few MB
SITES_PER_BLOCK = 256


@dataclass(frozen=True)
class SiteIntervals:
    """Per site, the ends of its effect's and its normalised effect's interval (NaN: none)."""

    effect_low: Float[torch.Tensor, " site"]
    effect_high: Float[torch.Tensor, " site"]
    normalised_low: Float[torch.Tensor, " site"]
    normalised_high: Float[torch.Tensor, " site"]
    # False when some draw's source - target mean is 0 or of the other sign: a ratio over a
    # denominator that may vanish has no interval (its draws run off to +-infinity)
    normalised_defined: bool = True


def no_intervals(n_sites: int) -> SiteIntervals:
    nan = torch.full((n_sites,), float("nan"), dtype=torch.float64)
    return SiteIntervals(nan, nan, nan, nan)


def resample_weights(n_inputs: int, n_draws: int, seed: int) -> Float[torch.Tensor, "draw input"]:
    """Each draw's weight on each input: how often the draw picked it, over ``n_inputs``
    (a weighted sum is then that draw's mean)."""
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, n_inputs, (n_draws, n_inputs), generator=generator)
    counts = torch.zeros(n_draws, n_inputs, dtype=torch.float64)
    counts.scatter_add_(1, picks, torch.ones_like(picks, dtype=torch.float64))
    return counts / n_inputs


def _ends(draws: Float[torch.Tensor, "site draw"]) -> tuple[torch.Tensor, torch.Tensor]:
    tail = (1.0 - CONFIDENCE) / 2
    ends = torch.quantile(draws, torch.tensor([tail, 1.0 - tail], dtype=draws.dtype), dim=1)
    return ends[0], ends[1]


def patching_intervals(
    source: Float[torch.Tensor, " input"],
    target: Float[torch.Tensor, " input"],
    patched: Float[torch.Tensor, "site input"],
    seed: int = 0,
) -> SiteIntervals:
    """The intervals of every site's effect and normalised effect (see the module
    docstring) from the per-input metric values of the three runs."""
    n_sites, n_inputs = patched.shape
    if not interval_possible(n_inputs):
        return no_intervals(n_sites)
    weights = resample_weights(n_inputs, N_BOOTSTRAP, seed)
    source_means = weights @ source.double()
    target_means = weights @ target.double()
    difference = source_means - target_means
    defined = bool((difference > 0).all() or (difference < 0).all())
    parts: list[tuple[torch.Tensor, ...]] = []
    for start in range(0, n_sites, SITES_PER_BLOCK):
        block = patched[start : start + SITES_PER_BLOCK].double()
        effect = einsum(block, weights, "site input, draw input -> site draw") - target_means
        normalised = _ends(effect / difference) if defined else (torch.full_like(effect[:, 0], float("nan")),) * 2
        parts.append((*_ends(effect), *normalised))
    if not parts:
        return no_intervals(0)
    effect_low, effect_high, normalised_low, normalised_high = (torch.cat(column) for column in zip(*parts))
    return SiteIntervals(effect_low, effect_high, normalised_low, normalised_high, normalised_defined=defined)
