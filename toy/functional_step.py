"""The compiled training step as one captured graph: no graph break, and the only tensors it
changes are the state it owns, changed inside the graph.

``device_stop.device_step``'s eager step calls ``.backward()`` and ``optimizer.step()``:
dynamo breaks the graph at both (``Optimizer.zero_grad`` is skipped, ``Tensor.backward``
unsupported), and the in-place updates after the break mutate tensors that CUDA graphs
cannot treat as static, so inductor skipped CUDA graphs for the whole step. Here the
gradient comes from ``torch.func.grad_and_value`` over a functional forward, Adam's update
is written out (``torch.optim.Adam``'s math, amsgrad off, no weight decay), and the stop
rule's freeze is a ``torch.where``: forward, loss, backward, Adam, the stop flags and the
step counter trace as one graph. Every tensor the graph writes (the weights, Adam's
moments and step counts, the stop state) is marked a static address, so CUDA graphs keep
those writes inside the replay; the batch is the only other input and is only read.

The numbers are eager's to float rounding, not bit for bit (the fused Adam kernel orders
its arithmetic differently); eager stays the reference.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch.func import grad_and_value

if TYPE_CHECKING:  # device_stop builds its compiled step from this module
    from sinkscope.toy.device_stop import DeviceStop

# (weights in the stack's parameter order, tokens [K, batch, pos, d_model]) -> outputs of
# the tokens' shape, with no module state read but the weights passed
FunctionalForward = Callable[[Sequence[torch.Tensor], torch.Tensor], torch.Tensor]


def frozen_where(stopped: torch.Tensor, kept: torch.Tensor, updated: torch.Tensor) -> torch.Tensor:
    """``updated`` with the stopped seeds' slices put back to ``kept``. A stack of one seed
    holds the model's own tensors, with no seed dimension."""
    if stopped.shape[0] == 1:
        return torch.where(stopped.reshape(()), kept, updated)
    return torch.where(stopped.reshape(-1, *([1] * (updated.dim() - 1))), kept, updated)


@dataclass(frozen=True)
class AdamSettings:
    """The constants of one Adam param group (the paper's runs have one)."""

    lr: float
    beta1: float
    beta2: float
    eps: float

    @classmethod
    def of(cls, optimizer: torch.optim.Optimizer) -> AdamSettings:
        group = optimizer.param_groups[0]
        if len(optimizer.param_groups) != 1 or group.get("weight_decay") or group.get("amsgrad"):
            raise ValueError("the functional step needs one Adam param group without weight decay or amsgrad")
        if group.get("maximize") or isinstance(group["lr"], torch.Tensor):
            raise ValueError("the functional step needs Adam minimising with a float learning rate")
        beta1, beta2 = group["betas"]
        return cls(float(group["lr"]), float(beta1), float(beta2), float(group["eps"]))


def adam_update(
    param: Float[torch.Tensor, "*shape"],
    grad: Float[torch.Tensor, "*shape"],
    exp_avg: Float[torch.Tensor, "*shape"],
    exp_avg_sq: Float[torch.Tensor, "*shape"],
    count: Float[torch.Tensor, ""],
    settings: AdamSettings,
) -> tuple[Float[torch.Tensor, "*shape"], Float[torch.Tensor, "*shape"], Float[torch.Tensor, "*shape"]]:
    """``torch.optim.Adam``'s update of one tensor at step ``count`` (already counted):
    the new weights and moments. The bias corrections are taken in float64, as the fused
    kernel takes them from its step count."""
    exp_avg = exp_avg * settings.beta1 + grad * (1 - settings.beta1)
    exp_avg_sq = exp_avg_sq * settings.beta2 + grad * grad * (1 - settings.beta2)
    step = count.double()
    correction1 = 1 - torch.pow(settings.beta1, step)
    correction2_sqrt = (1 - torch.pow(settings.beta2, step)).sqrt()
    step_size = (settings.lr / correction1).to(param.dtype)
    denom = exp_avg_sq.sqrt() / correction2_sqrt.to(param.dtype) + settings.eps
    return param - step_size * exp_avg / denom, exp_avg, exp_avg_sq


def state_tensors(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], stop: DeviceStop) -> list[torch.Tensor]:
    """Every tensor the step writes: weights, Adam's moments and counts, the stop state."""
    moments = [optimizer.state[p][key] for p in params for key in ("exp_avg", "exp_avg_sq", "step")]
    return [*params, *moments, *stop.tensors()]


def functional_step(
    forward: FunctionalForward,
    params: list[torch.Tensor],
    optimizer: torch.optim.Optimizer,
    stop: DeviceStop,
) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """The step ``(tokens, targets)`` of ``device_stop.device_step``, written to trace as
    one graph. Adam's state must exist (a host step makes it)."""
    settings = AdamSettings.of(optimizer)
    states = [optimizer.state[p] for p in params]
    for tensor in state_tensors(optimizer, params, stop):
        # its address never changes: CUDA graphs may write it inside the replay
        torch._dynamo.mark_static_address(tensor)

    def loss_of(weights: tuple[torch.Tensor, ...], tokens: torch.Tensor, targets: torch.Tensor):
        error = forward(weights, tokens) - targets
        losses = error.pow(2).mean(dim=(1, 2, 3))
        return losses.sum(), (losses, error.abs().amax(dim=(1, 2, 3)))

    def step_once(tokens: torch.Tensor, targets: torch.Tensor) -> None:
        with torch.no_grad():  # grad_and_value differentiates inside; the writes below are not tracked
            grads, (_, (losses, linfs)) = grad_and_value(loss_of, has_aux=True)(tuple(params), tokens, targets)
            stop.observe(losses, linfs)
            for param, grad, state in zip(params, grads, states):
                count = state["step"]
                count.add_(1)  # Adam counts every seed's step; a stopped seed's count is wound back on the host
                updated = adam_update(param, grad, state["exp_avg"], state["exp_avg_sq"], count, settings)
                for tensor, new in zip((param, state["exp_avg"], state["exp_avg_sq"]), updated):
                    tensor.copy_(frozen_where(stop.stopped, tensor, new))
            stop.step.add_(1)

    return step_once
