"""Training's thread policy: one thread while training, whatever a caller or a callback sets."""

from __future__ import annotations

import pytest
import torch

from sinkscope.toy.checkpoint import load_tensors
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.run_dir import FINAL_WEIGHTS, RunConfig, TrainConfig
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.train import TRAIN_THREADS, train


def test_training_runs_on_one_thread_and_restores_the_callers_setting(tmp_path):
    """One intra-op thread while training (a busy machine slows it proportionally, not
    several-fold: benchmarks/bench_under_load.py), whatever the caller had set."""
    config = RunConfig(ToyModelConfig(), TaskConfig(), TrainConfig(max_steps=10, log_every=5, stop_linf=1e-12))
    seen: list[int] = []
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        train(
            config, tmp_path / "run", progress=False, on_log=lambda step, record: seen.append(torch.get_num_threads())
        )
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen == [TRAIN_THREADS] * 3 and TRAIN_THREADS == 1


@pytest.mark.parametrize("layers_heads", [(2, 2), (4, 4)])
def test_training_is_bit_identical_when_a_callback_changes_the_thread_count(tmp_path, layers_heads):
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
        seen_by_callback: list[int] = []

        def switch_to_two(step: int, record: dict) -> None:
            seen_by_callback.append(torch.get_num_threads())
            torch.set_num_threads(2)

        train(config, tmp_path / "switching", progress=False, on_log=switch_to_two)
    finally:
        torch.set_num_threads(before)
    # steps 0, 5, ..., 40: every callback found the trainer's one thread back in place
    assert seen_by_callback == [1] * 9
    one = load_tensors(tmp_path / "one-thread" / FINAL_WEIGHTS)
    switching = load_tensors(tmp_path / "switching" / FINAL_WEIGHTS)
    assert one.keys() == switching.keys()
    for name in one:
        assert torch.equal(one[name], switching[name]), name
