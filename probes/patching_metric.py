"""What an activation-patching metric is given (``MetricContext``), and its values checked
as they come back: one finite value per input, or a scalar standing for the batch's mean."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from jaxtyping import Float

from sinkscope.infra.errors import InputError
from sinkscope.interp.hooked_model import PreparedBatch


@dataclass(frozen=True)
class MetricContext:
    """What ``metric_fn`` sees besides the output.

    rows: ``[batch]`` long, this batch's indices into the full input set (to look up
    per-input references such as the source's targets); batch: the target
    ``PreparedBatch`` (the source run shares its ``attention_mask`` and ``anchor``).
    """

    rows: torch.Tensor
    batch: PreparedBatch


MetricFn = Callable[[torch.Tensor, MetricContext], torch.Tensor]


@dataclass(frozen=True)
class MetricValues:
    """The metric per input on the source run, the clean target run and the target run
    patched at each site; ``per_input`` False when ``metric_fn`` returned only each
    batch's mean (then every input of a batch holds that mean: means stay exact, but
    there is nothing to resample)."""

    source: Float[torch.Tensor, " input"]
    target: Float[torch.Tensor, " input"]
    patched: Float[torch.Tensor, "site input"]
    per_input: bool


def metric_values(metric_fn: MetricFn, output: torch.Tensor, context: MetricContext) -> tuple[torch.Tensor, bool]:
    """``metric_fn``'s values ``[batch]`` (float64, on the CPU), and whether they are one
    per input (a scalar is the batch mean, repeated)."""
    values = metric_fn(output, context)
    n = int(context.rows.shape[0])
    if not torch.is_tensor(values) or values.shape not in ((), (n,)):
        shape = tuple(values.shape) if torch.is_tensor(values) else type(values).__name__
        raise InputError(
            f"metric_fn must return a tensor of one value per input, shape [{n}], or a scalar; got {shape}"
        )
    values = values.detach().double().cpu()
    if not bool(torch.isfinite(values).all()):
        bad = int((~torch.isfinite(values)).sum()) if values.ndim else n
        first = int(context.rows[0]) if values.ndim == 0 else int(context.rows[~torch.isfinite(values)][0])
        raise InputError(
            f"metric_fn returned NaN or infinity for {bad} of the {n} inputs of a batch (input {first} first); "
            "return a finite value for every input"
        )
    return (values.expand(n), False) if values.ndim == 0 else (values, True)
