"""The streaming window test on a toy trigger-task model: does the model still solve the
task when its BOS falls outside the window?

The loss at each position is the squared error of the output against the task's target,
averaged over the coordinates; the units of the intervals are the sequences. The trigger
sits at position 1 by default, so every window of two or more keys shows the trigger query
all the tokens its target averages: any loss at the later (default) positions is the
default state failing, which is what a hidden sink would break.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sinkscope.infra.arguments import check_argument
from sinkscope.infra.errors import InputError
from sinkscope.interp.hooked_model import HookedModel, PreparedBatch
from sinkscope.probes.window_masks import window_settings
from sinkscope.probes.window_test import WindowRun, WindowTestResult, run_window_test
from sinkscope.toy.model import ToyTransformer
from sinkscope.toy.task import TaskConfig, sample_batch

LOSS_NAME = "squared error per coordinate"


def toy_window_test(
    model: ToyTransformer,
    task: TaskConfig,
    windows: Sequence[int],
    sinks: Sequence[int] = (1,),
    n_sequences: int = 256,
    seed: int = 0,
    trigger_position: int = 1,
    name: str = "toy model",
) -> WindowTestResult:
    """The window test of ``model`` on ``n_sequences`` task sequences (seeded) with the
    trigger at ``trigger_position``; the target (single or residual) is the model's own."""
    if not isinstance(model, ToyTransformer):
        raise InputError(f"model must be a ToyTransformer, got {type(model).__name__}", field="model")
    if not isinstance(task, TaskConfig):
        raise InputError(f"task must be a TaskConfig, got {type(task).__name__}", field="task")
    for name, value in (("n_sequences", n_sequences), ("seed", seed), ("trigger_position", trigger_position)):
        check_argument(value, int, name, "a whole number")
    if n_sequences < 1:
        raise InputError(f"n_sequences must be >= 1, got {n_sequences}", field="n_sequences")
    generator = torch.Generator().manual_seed(seed)
    task_batch = sample_batch(task, n_sequences, generator, model.cfg.target, trigger_position=trigger_position)
    hooked = HookedModel(model)
    batch = hooked.prepare(task_batch.tokens)
    targets = task_batch.targets.to(batch.model_input.device)

    def squared_error(output: torch.Tensor, _batch: PreparedBatch) -> torch.Tensor:
        return (output - targets).pow(2).mean(dim=-1)

    run = WindowRun(
        model=name,
        source=f"trigger task, {task.seq_len} positions, trigger at position {trigger_position} (0-indexed)",
        unit="sequence",
        loss_name=LOSS_NAME,
    )
    model.eval()
    return run_window_test(hooked, [batch], window_settings(windows, sinks), squared_error, run, seed)
