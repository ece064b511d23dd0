"""The paper's stop rule decided on the device: steps with no host synchronisation.

A step of the stack (batch already drawn; forward, MSE, backward, Adam) that also keeps,
per seed and on the device, whether it has stopped, at which step, and that step's loss
and L-inf. A seed stops at the first step whose batch L-inf is below ``stop_linf`` (or
whose loss or L-inf is not finite: it diverged), exactly where the host-side rule stops
it; from then on its weights and Adam state are frozen, so they stay that step's. The
host reads the flags once per block of steps (``stopped_members``). Compiled, the step
is ``functional_step``'s, one graph with no break (``CompiledOrEager``), and on CUDA it
replays as a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sinkscope.toy.compiled_step import CompiledOrEager
from sinkscope.toy.functional_step import FunctionalForward, frozen_where, functional_step


@dataclass
class Stopped:
    """One seed's stop as the device recorded it."""

    index: int
    step: int
    loss: float
    linf: float

    @property
    def diverged(self) -> bool:
        return not (_finite(self.loss) and _finite(self.linf))


def _finite(value: float) -> bool:
    return value == value and abs(value) != float("inf")


class DeviceStop:
    """Per-seed stop state on the device, for a stack of ``k`` seeds."""

    def __init__(self, k: int, stop_linf: float, device: torch.device) -> None:
        self.stop_linf = stop_linf
        self.stopped = torch.zeros(k, dtype=torch.bool, device=device)
        self.stop_step = torch.full((k,), -1, dtype=torch.long, device=device)
        self.stop_loss = torch.zeros(k, device=device)
        self.stop_linf_value = torch.zeros(k, device=device)
        self.step = torch.zeros((), dtype=torch.long, device=device)  # the step being taken

    def observe(self, losses: torch.Tensor, linfs: torch.Tensor) -> None:
        """Record the seeds that stop at this step. L-inf is compared in float64, as the
        host compares the Python float it reads."""
        step = self.step
        bad = ~(torch.isfinite(losses) & torch.isfinite(linfs))
        newly = ~self.stopped & (bad | (linfs.double() < self.stop_linf))
        self.stop_step.copy_(torch.where(newly, step, self.stop_step))
        self.stop_loss.copy_(torch.where(newly, losses, self.stop_loss))
        self.stop_linf_value.copy_(torch.where(newly, linfs, self.stop_linf_value))
        self.stopped.copy_(self.stopped | newly)

    def tensors(self) -> list[torch.Tensor]:
        return [self.stopped, self.stop_step, self.stop_loss, self.stop_linf_value, self.step]

    def stopped_members(self) -> list[Stopped]:
        """The seeds stopped so far (one host read of the flags)."""
        flags = self.stopped.tolist()
        if not any(flags):
            return []
        steps, losses, linfs = self.stop_step.tolist(), self.stop_loss.tolist(), self.stop_linf_value.tolist()
        return [Stopped(k, steps[k], losses[k], linfs[k]) for k, flag in enumerate(flags) if flag]


def adam_tensors(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each parameter and its Adam moments: what a stopped seed keeps frozen."""
    tensors = []
    for param in params:
        state = optimizer.state[param]
        tensors += [param, state["exp_avg"], state["exp_avg_sq"]]
    return tensors


def device_step(
    forward: Callable[[torch.Tensor], torch.Tensor],
    functional_forward: FunctionalForward,
    params: list[torch.Tensor],
    optimizer: torch.optim.Optimizer,
    stop: DeviceStop,
    compiled: bool,
) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """The step ``(tokens, targets)`` of a stack; ``stop.step`` counts up by one per call
    (set it to the first step before the first call). Eager, its numbers are the host-side
    trainer's, op for op: the same forward, the same summed loss, the same Adam. Compiled,
    it is ``functional_step`` (one graph; ``functional_forward`` is ``forward`` with the
    weights passed in), and eager is its fallback."""

    def step_once(tokens: torch.Tensor, targets: torch.Tensor) -> None:
        error = forward(tokens) - targets
        losses = error.pow(2).mean(dim=(1, 2, 3))
        linfs = error.detach().abs().amax(dim=(1, 2, 3))
        stop.observe(losses.detach(), linfs)
        frozen = adam_tensors(optimizer, params)
        kept = [tensor.detach().clone() for tensor in frozen]
        optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()
        optimizer.step()
        with torch.no_grad():
            for tensor, before in zip(frozen, kept):
                tensor.copy_(frozen_where(stop.stopped, before, tensor))
            stop.step.add_(1)

    if not compiled:
        return step_once
    device = params[0].device

    def snapshot() -> Callable[[], None]:
        counts = [optimizer.state[param]["step"] for param in params]
        held = [*adam_tensors(optimizer, params), *counts, *stop.tensors()]
        copies = [tensor.detach().clone() for tensor in held]

        def restore() -> None:
            with torch.no_grad():
                for tensor, copy in zip(held, copies):
                    tensor.copy_(copy)

        return restore

    captured = functional_step(functional_forward, params, optimizer, stop)
    return _warmed(forward, CompiledOrEager(captured, device, snapshot, eager=step_once))


def _warmed(
    forward: Callable[[torch.Tensor], torch.Tensor], step: Callable[[torch.Tensor, torch.Tensor], None]
) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """``step`` after one no-grad ``forward`` on its first batch. The attention layers fill
    their mask caches on their first forward; a cache written inside grad_and_value's trace
    fails AOTAutograd, and the stack would train eager (a resume whose first step is a device
    step has run no host forward yet)."""
    warmed = False

    def warm_then_step(tokens: torch.Tensor, targets: torch.Tensor) -> None:
        nonlocal warmed
        if not warmed:
            with torch.no_grad():
                forward(tokens)
            warmed = True
        step(tokens, targets)

    return warm_then_step
