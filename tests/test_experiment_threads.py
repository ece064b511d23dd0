"""Lending idle cores to the last runs of an experiment must not change any number."""

from __future__ import annotations

import pytest
import torch

from interp.checkpoint import load_tensors
from toy.experiment import lent_threads
from toy.model import ToyModelConfig
from toy.run_dir import FINAL_WEIGHTS, RunConfig, TrainConfig
from toy.task import TaskConfig
from toy.train import train


@pytest.mark.parametrize(
    ("unfinished", "budget", "threads"),
    [(6, 2, 1), (2, 2, 1), (1, 2, 2), (0, 2, 2), (1, 1, 1), (5, 4, 1), (3, 4, 1), (2, 4, 2), (1, 4, 4)],
)
def test_lent_threads_share_the_budget_once_jobs_run_out(unfinished, budget, threads):
    assert lent_threads(unfinished, budget) == threads


@pytest.mark.parametrize("layers_heads", [(2, 2), (4, 4)])
def test_training_is_bit_identical_when_the_thread_count_changes_mid_run(tmp_path, layers_heads):
    layers, heads = layers_heads
    config = RunConfig(
        ToyModelConfig(n_layers=layers, n_heads=heads),
        TaskConfig(),
        TrainConfig(seed=3, max_steps=40, log_every=5, stop_linf=1e-12),
    )
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        train(config, tmp_path / "one-thread", progress=False)
        switches: list[int] = []

        def alternate(step: int) -> None:
            threads = 2 if torch.get_num_threads() == 1 else 1
            torch.set_num_threads(threads)
            switches.append(threads)

        train(config, tmp_path / "switching", progress=False, on_log=alternate)
    finally:
        torch.set_num_threads(before)
    assert len(switches) == 9 and set(switches) == {1, 2}  # steps 0, 5, ..., 40
    one = load_tensors(tmp_path / "one-thread" / FINAL_WEIGHTS)
    switching = load_tensors(tmp_path / "switching" / FINAL_WEIGHTS)
    assert one.keys() == switching.keys()
    for name in one:
        assert torch.equal(one[name], switching[name]), name
