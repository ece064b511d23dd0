"""The trigger-task generator against hand-computed layouts and targets."""

from __future__ import annotations

import pytest
import torch

from sinkscope.infra.codec import decode, encode
from sinkscope.toy.task import TaskConfig, eval_batch, make_targets, make_tokens, sample_batch

N, L = 5, 4  # d_model 5: BOS flag, trigger flag, features 2..3, bias 4


def _batch(target: str, batch_size: int = 64, seed: int = 0, **kwargs):
    config = TaskConfig(d_model=N, seq_len=L, eval_trigger_position=L - 1, **kwargs)
    return config, sample_batch(config, batch_size, torch.Generator().manual_seed(seed), target)


def test_coordinate_layout():
    config, batch = _batch("single", batch_size=200)
    tokens, trig = batch.tokens, batch.trigger_position
    assert tokens.shape == (200, L, N)
    for b in range(200):
        j = int(trig[b])
        assert 2 <= j <= L - 1
        for i in range(L):
            tok = tokens[b, i]
            assert tok[0] == (1.0 if i == 0 else 0.0)  # BOS flag only at position 0
            assert tok[1] == (1.0 if i == j else 0.0)  # trigger flag only at j
            assert tok[N - 1] == (0.0 if i in (0, j) else 1.0)  # bias on content only
            features = tok[2 : N - 1]
            if i == 0:
                assert torch.all(features == 0)
            else:
                assert torch.all((features >= -1) & (features <= 1))
                assert torch.all(features != 0)  # continuous draws are never exactly 0
    # exactly one trigger per sequence
    assert torch.all(tokens[:, :, 1].sum(dim=1) == 1)
    # the features are really spread over [-1, 1]
    feats = tokens[:, 1:, 2 : N - 1]
    assert feats.min() < -0.9 and feats.max() > 0.9


def _prefix_mean(tokens: torch.Tensor, b: int, j: int) -> torch.Tensor:
    total = torch.zeros(tokens.shape[-1], dtype=torch.float64)
    for i in range(1, j + 1):
        for c in range(tokens.shape[-1]):
            total[c] += float(tokens[b, i, c])
    return total / j


def test_single_targets_by_hand():
    _, batch = _batch("single")
    for b in range(batch.tokens.shape[0]):
        j = int(batch.trigger_position[b])
        for i in range(L):
            expected = _prefix_mean(batch.tokens, b, j) if i == j else torch.zeros(N, dtype=torch.float64)
            torch.testing.assert_close(batch.targets[b, i].double(), expected, atol=1e-6, rtol=0)


def test_residual_targets_by_hand():
    _, batch = _batch("residual")
    for b in range(batch.tokens.shape[0]):
        j = int(batch.trigger_position[b])
        for i in range(L):
            expected = batch.tokens[b, i].double()
            if i == j:
                expected = expected + _prefix_mean(batch.tokens, b, j)
            torch.testing.assert_close(batch.targets[b, i].double(), expected, atol=1e-6, rtol=0)


def test_targets_on_a_fully_specified_example():
    # trigger at j = 2: mean of x_1 and x_2 over every coordinate (flags and bias included)
    tokens = torch.tensor(
        [
            [
                [1.0, 0.0, 0.0, 0.0, 0.0],
                [0.0, 0.0, 0.5, -1.0, 1.0],
                [0.0, 1.0, -0.5, 0.25, 0.0],
                [0.0, 0.0, 0.75, 0.75, 1.0],
            ]
        ]
    )
    trig = torch.tensor([2])
    mean = torch.tensor([0.0, 0.5, 0.0, -0.375, 0.5])
    single = make_targets(tokens, trig, "single")
    torch.testing.assert_close(single[0, 2], mean)
    assert torch.all(single[0, [0, 1, 3]] == 0)
    residual = make_targets(tokens, trig, "residual")
    torch.testing.assert_close(residual[0, 2], tokens[0, 2] + mean)
    torch.testing.assert_close(residual[0, [0, 1, 3]], tokens[0, [0, 1, 3]])
    with pytest.raises(ValueError, match="single"):
        make_targets(tokens, trig, "other")


def test_training_trigger_positions_cover_the_range():
    config = TaskConfig(d_model=6, seq_len=9, train_trigger_min=3)
    generator = torch.Generator().manual_seed(1)
    seen = torch.cat([sample_batch(config, 256, generator, "single").trigger_position for _ in range(8)])
    assert set(seen.tolist()) == set(range(3, 9))
    counts = torch.bincount(seen, minlength=9)[3:].float()
    assert counts.min() > 0.7 * counts.mean()  # uniform, roughly
    # and an explicit upper bound is honoured
    bounded = TaskConfig(d_model=6, seq_len=9, train_trigger_min=2, train_trigger_max=4)
    seen = sample_batch(bounded, 2048, generator, "single").trigger_position
    assert set(seen.tolist()) == {2, 3, 4}


def test_paper_defaults_and_eval_batch():
    config = TaskConfig()
    assert (config.d_model, config.seq_len, config.train_trigger_min, config.trigger_max) == (16, 16, 2, 15)
    batch = eval_batch(config, 32, seed=3, target="single")
    assert torch.all(batch.trigger_position == 7)
    assert torch.all(batch.tokens[:, 7, 1] == 1)
    assert batch.trigger_query_mask()[:, 7].all() and batch.trigger_query_mask().sum() == 32
    default = batch.default_query_mask()
    assert not default[:, 0].any() and not default[:, 7].any() and default.sum() == 32 * 14
    again = eval_batch(config, 32, seed=3, target="single")
    assert torch.equal(batch.tokens, again.tokens)
    assert not torch.equal(batch.tokens, eval_batch(config, 32, seed=4, target="single").tokens)


def test_same_seed_same_batch():
    _, a = _batch("residual", seed=11)
    _, b = _batch("residual", seed=11)
    _, c = _batch("residual", seed=12)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.targets, b.targets)
    assert torch.equal(a.trigger_position, b.trigger_position)
    assert not torch.equal(a.tokens, c.tokens)


def test_make_tokens_places_given_triggers():
    config = TaskConfig(d_model=N, seq_len=L, eval_trigger_position=L - 1)
    tokens = make_tokens(config, torch.tensor([1, 3]), torch.Generator().manual_seed(0))
    assert tokens[0, :, 1].tolist() == [0, 1, 0, 0]
    assert tokens[1, :, 1].tolist() == [0, 0, 0, 1]
    assert tokens[1, :, N - 1].tolist() == [0, 1, 1, 0]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(d_model=3), "d_model >= 4"),
        (dict(seq_len=2), "seq_len >= 3"),
        (dict(seq_len=8, train_trigger_min=0), "train_trigger_min/max"),
        (dict(seq_len=8, train_trigger_max=8), "train_trigger_min/max"),
        (dict(seq_len=8, train_trigger_min=5, train_trigger_max=4), "train_trigger_min/max"),
        (dict(seq_len=8, eval_trigger_position=0), "lower it or raise seq_len"),
        (dict(seq_len=8, eval_trigger_position=8), "lower it or raise seq_len"),
    ],
)
def test_bad_configs_name_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TaskConfig(**{"d_model": 8, **kwargs})


def test_short_sequences_need_an_eval_position_that_fits():
    # the paper's eval position 7 does not fit in 4 positions; the error says what to change
    with pytest.raises(ValueError, match="eval_trigger_position=7 must lie in 1..3"):
        TaskConfig(d_model=N, seq_len=L)


def test_bad_sampling_arguments():
    config = TaskConfig(d_model=N, seq_len=L, eval_trigger_position=L - 1)
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="batch_size"):
        sample_batch(config, 0, generator, "single")
    with pytest.raises(ValueError, match="trigger_position"):
        sample_batch(config, 2, generator, "single", trigger_position=0)
    with pytest.raises(ValueError, match="trigger_position"):
        sample_batch(config, 2, generator, "single", trigger_position=L)


def test_task_config_round_trips_and_rejects_unknown_keys():
    assert decode(TaskConfig, encode(TaskConfig(d_model=8))) == TaskConfig(d_model=8)
    with pytest.raises(ValueError, match=r"unknown fields \['n_triggers'\]"):
        decode(TaskConfig, {"d_model": 8, "n_triggers": 2})
