"""K seeds trained as one stack agree with training each seed on its own."""

from __future__ import annotations

import pytest
import torch

from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.run_dir import RunConfig, TrainConfig, load_model, read_metrics
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.train import train, train_seeds


def _configs(layers: int, heads: int, seeds, **train_settings) -> list[RunConfig]:
    return [
        RunConfig(
            ToyModelConfig(n_layers=layers, n_heads=heads), TaskConfig(), TrainConfig(seed=seed, **train_settings)
        )
        for seed in seeds
    ]


def _max_weight_difference(a, b) -> float:
    sa, sb = load_model(a).state_dict(), load_model(b).state_dict()
    return max(float((sa[name] - sb[name]).abs().max()) for name in sa)


@pytest.mark.parametrize("layers, heads", [(1, 1), (2, 2)])
def test_first_100_steps_match_one_by_one_training(tmp_path, layers, heads):
    configs = _configs(layers, heads, range(3), max_steps=100, stop_linf=1e-12, log_every=50, checkpoint_every=50)
    stacked = train_seeds(configs, [tmp_path / f"b{k}" for k in range(3)], progress=False)
    single = [train(c, tmp_path / f"s{k}", progress=False) for k, c in enumerate(configs)]
    for k in range(3):
        assert _max_weight_difference(tmp_path / f"b{k}", tmp_path / f"s{k}") <= 1e-6
        assert stacked[k].linf_error == pytest.approx(single[k].linf_error, rel=1e-5)
        logged_b, logged_s = read_metrics(tmp_path / f"b{k}"), read_metrics(tmp_path / f"s{k}")
        assert [r["step"] for r in logged_b] == [r["step"] for r in logged_s] == [0, 50, 100]
        for rb, rs in zip(logged_b, logged_s):
            assert torch.allclose(
                torch.tensor(rb["anchor_mass_default"]), torch.tensor(rs["anchor_mass_default"]), atol=1e-5
            )


def test_converged_members_leave_the_stack_and_reach_the_same_conclusion(tmp_path):
    configs = _configs(1, 1, (0, 1), max_steps=3000)
    stacked = train_seeds(configs, [tmp_path / f"b{k}" for k in range(2)], progress=False)
    single = [train(c, tmp_path / f"s{k}", progress=False) for k, c in enumerate(configs)]
    for b, s in zip(stacked, single):
        assert b.converged and s.converged
        assert abs(b.steps - s.steps) <= 5
    assert stacked[0].steps != stacked[1].steps  # the members really did stop at different steps


def test_resume_after_interruption_continues_as_a_batch(tmp_path):
    dirs = [tmp_path / f"b{k}" for k in range(2)]
    train_seeds(_configs(1, 1, (0, 1), max_steps=40, stop_linf=1e-12, checkpoint_every=20), dirs, progress=False)
    resumed = train_seeds(
        _configs(1, 1, (0, 1), max_steps=80, stop_linf=1e-12, checkpoint_every=20), dirs, progress=False
    )
    straight = [tmp_path / f"s{k}" for k in range(2)]
    train_seeds(_configs(1, 1, (0, 1), max_steps=80, stop_linf=1e-12, checkpoint_every=20), straight, progress=False)
    assert all(r.steps == 80 and r.resumed_from_step == 40 for r in resumed)
    for a, b in zip(dirs, straight):
        assert _max_weight_difference(a, b) <= 1e-6


def test_configs_must_differ_only_in_seed(tmp_path):
    configs = _configs(1, 1, (0,), max_steps=10) + _configs(1, 1, (1,), max_steps=10, lr=5e-4)
    with pytest.raises(ValueError, match="differ only in train.seed"):
        train_seeds(configs, [tmp_path / "a", tmp_path / "b"], progress=False)
    with pytest.raises(ValueError, match="one directory per config"):
        train_seeds(_configs(1, 1, (0, 1)), [tmp_path / "a"], progress=False)
