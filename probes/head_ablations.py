"""Head ablations beside a sink removal: what losing a head's output costs, next to what
taking its sink away costs.

A sink head whose sink is removed may hurt for two different reasons. Either the head's
output matters and the removal merely disables it ("the head matters"), or, without its
sink, the head writes something worse than nothing at all: its sink held it in a harmless
default state ("removing its sink breaks it"). Two ablations of the head's output ``z``
(before W_O) tell the two apart:

- zero-ablation: ``z`` set to 0 at every position (``zero_head``);
- mean-ablation: ``z`` replaced by its per-position mean over the same inputs
  (``mean_ablate_head`` with ``head_means``): the head keeps its average output, which
  for a head in its default state is close to what it writes anyway, and loses what it
  says about each input.

The reading (``head_ablation_reading``, docs/metrics.md) compares sink removal with the
mean-ablation, input by input (a paired bootstrap interval of their difference).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float

from sinkscope.infra.errors import InputError
from sinkscope.interp.hook_names import attn_hook
from sinkscope.interp.hooked_model import HookedModel, ModelInput, PreparedBatch
from sinkscope.probes.interventions import HeadMeans

if TYPE_CHECKING:
    from sinkscope.probes.default_state import DefaultStateRow, Estimate

# the readings, strongest claim first; the rule that picks one is head_ablation_reading
SINK_BREAKS_IT = "removing its sink breaks it"
HEAD_MATTERS = "the head matters"
MEAN_OUTPUT_MATTERS = "its mean output matters"
INCONCLUSIVE = "inconclusive"
NO_INCREASE = "no ablation raises the error"
NO_READING = "no reading: intervals missing"
HEAD_ABLATION_READINGS = (SINK_BREAKS_IT, HEAD_MATTERS, MEAN_OUTPUT_MATTERS, INCONCLUSIVE, NO_INCREASE, NO_READING)


def head_means(
    model: torch.nn.Module | HookedModel,
    inputs: ModelInput | Sequence[str],
    attention_mask: torch.Tensor | None = None,
    batch_size: int | None = None,
) -> HeadMeans:
    """Per-position mean of every head's ``z`` over the real tokens of ``inputs`` (the
    reference set for ``mean_ablate_head``), run ``batch_size`` inputs at a time (None:
    all at once)."""
    hooked = model if isinstance(model, HookedModel) else HookedModel(model)
    return batch_head_means(hooked, hooked.prepare(inputs, attention_mask), batch_size)


def batch_head_means(hooked: HookedModel, batch: PreparedBatch, batch_size: int | None = None) -> HeadMeans:
    """``head_means`` of a prepared batch: per-position sums of ``z`` and counts of real
    tokens, added chunk by chunk, then divided (a position no input reaches stays 0)."""
    spec = hooked.spec
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise InputError(f"batch_size must be a whole number >= 1 or None, got {batch_size!r}", field="batch_size")
    if batch.batch_size == 0:
        raise InputError("head means need at least one input; pass a non-empty batch", field="inputs")
    sums: Float[torch.Tensor, "layer pos head d_head"] = torch.zeros(
        spec.n_layers, batch.n_pos, spec.n_heads, spec.d_head, dtype=torch.float64
    )
    counts = batch.attention_mask.to(torch.float64).sum(dim=0).cpu()
    step = batch_size or batch.batch_size
    for start in range(0, batch.batch_size, step):
        part = batch.select(torch.arange(start, min(start + step, batch.batch_size), device=batch.anchor.device))
        real = part.attention_mask.to(torch.float64)

        def add(layer: int, real: torch.Tensor = real) -> Callable[..., None]:
            def hook(z: torch.Tensor, hook: Any) -> None:
                weighted = z.double() * real.to(z.device)[:, :, None, None]
                sums[layer] += weighted.sum(dim=0).cpu()

            return hook

        with torch.no_grad():
            hooked.run_with_hooks(part, [(attn_hook(layer, "z"), add(layer)) for layer in spec.pattern_layers])
    means = sums / counts.clamp_min(1.0)[None, :, None, None]
    return HeadMeans(z=means.float(), n_inputs=batch.batch_size)


# a change counts as above 0 only past float rounding: this share of the test's own scale
# (the error before, or the row's largest mean change), since an ablation that replaces
# values by equal ones still moves the error by a few ulps
ROUNDING_SHARE = 1e-6


def head_ablation_reading(row: DefaultStateRow) -> str | None:
    """Which reading a tested head set's numbers support (None: the row has no head
    ablations, e.g. a file written before them). Intervals decide, never means alone:

    1. removing its sink breaks it: sink removal raises the error (its interval above 0),
       and more than the mean-ablation does (the paired difference's interval above 0) and more than the
       matched control (removal's interval above the control's);
    2. the head matters: the mean-ablation's interval lies above 0;
    3. its mean output matters: only the zero-ablation's interval lies above 0;
    4. inconclusive: sink removal's interval lies above 0, and neither rule above holds;
    5. no ablation raises the error: no interval lies above 0.
    "Above 0" is past float rounding (``ROUNDING_SHARE`` of the test's scale). A rule whose
    intervals are missing (NaN: a non-finite error, or fewer than 5 inputs) is not applied,
    and where that leaves no rule holding there is no reading. Without intervals (fewer than 5 inputs) there is no reading."""
    remove, control = row.remove_increase, row.control_increase
    zero, mean, beyond = row.zero_increase, row.mean_increase, row.remove_minus_mean
    if zero is None or mean is None or beyond is None:
        return None
    estimates = (remove, control, zero, mean, beyond)
    with_interval = [estimate for estimate in estimates if _has_interval(estimate)]
    if not with_interval:
        return NO_READING
    scale = [abs(value) for value in (row.error_before, *(e.mean for e in estimates)) if math.isfinite(value)]
    floor = ROUNDING_SHARE * max(scale, default=0.0)

    def above(estimate: Estimate) -> bool:
        return _has_interval(estimate) and estimate.ci_low > floor

    # a rule is applied only where its intervals exist (a NaN control leaves rule 1 undecided)
    if above(beyond) and above(remove) and _has_interval(control) and remove.ci_low > control.ci_high:
        return SINK_BREAKS_IT
    if above(mean):
        return HEAD_MATTERS
    if above(zero):
        return MEAN_OUTPUT_MATTERS
    if above(remove):
        return INCONCLUSIVE
    return NO_INCREASE if len(with_interval) == len(estimates) else NO_READING


def _has_interval(estimate: Estimate) -> bool:
    return math.isfinite(estimate.ci_low) and math.isfinite(estimate.ci_high)
