"""The streaming window test on the hand-built trigger-task models (``toy.constructions``):
the softmax construction parks its default queries on BOS, so it fails once BOS falls
outside the window and recovers when the first token is kept, while the ReLU construction
needs no sink and keeps solving the task. Each number is checked against a direct
computation from the weights; a mask that is not imposed (a mutation) fails the check."""

from __future__ import annotations

import math

import pytest
import torch

from sinkscope.infra.codec import read_result, write_result
from sinkscope.infra.errors import InputError
from sinkscope.probes import window_test as window_test_module
from sinkscope.probes.window_test import WindowTestResult
from sinkscope.toy.constructions import relu_exact_model, softmax_scaled_model
from sinkscope.toy.task import TaskConfig, sample_batch
from sinkscope.toy.window_test import toy_window_test

TASK = TaskConfig(d_model=8, seq_len=16)
W, S, N = 4, 1, 64
TOL = 1e-5


def window_only_error(seed: int = 0) -> torch.Tensor:
    """``[sequence, position]`` squared error of the softmax construction with only the last W
    keys, from the weights: BOS hidden, every visible key scores 0 for a default query, so
    its output is the plain mean of the W visible tokens (values = tokens, BOS flag zeroed,
    none of them BOS), against a target of zero; position i < W still sees BOS and is exact
    up to e^-scale."""
    batch = sample_batch(TASK, N, torch.Generator().manual_seed(seed), "single", trigger_position=1)
    tokens = batch.tokens
    errors = torch.zeros(N, TASK.seq_len)
    for i in range(W, TASK.seq_len):
        output = tokens[:, i - W + 1 : i + 1].mean(dim=1)
        errors[:, i] = output.pow(2).mean(dim=-1)
    return errors.double()


def test_the_softmax_construction_collapses_without_its_first_token():
    result = toy_window_test(softmax_scaled_model(TASK, 30.0), TASK, windows=(W,), sinks=(S,), n_sequences=N)
    full, alone, first, control = (
        result.row(label) for label in ("full attention", "last 4", "first 1 + last 4", "random 1 + last 4")
    )
    expected = window_only_error()
    assert torch.allclose(torch.tensor(result.curves[1], dtype=torch.float64), expected.mean(dim=0), atol=TOL)
    assert math.isclose(alone.loss.mean, float(expected[:, result.scored_from :].mean()), abs_tol=TOL)
    assert full.loss.mean < TOL and first.loss.mean < TOL  # BOS visible: the default state holds
    assert alone.loss.mean > 0.05 and control.loss.mean > 0.05  # BOS hidden: it breaks, random keys do not help
    assert alone.increase.ci_low > 0 and control.increase.ci_low > 0
    assert result.n_units == N and result.unit == "sequence"


def test_the_relu_construction_needs_no_sink_and_keeps_solving_the_task():
    result = toy_window_test(relu_exact_model(TASK), TASK, windows=(W,), sinks=(S,), n_sequences=N)
    assert all(row.loss.mean < TOL for row in result.rows)


def test_a_mask_that_is_not_imposed_fails_the_collapse_check(monkeypatch):
    """Mutation: hooks that impose nothing leave the window setting at full attention's loss."""
    monkeypatch.setattr(window_test_module, "window_hooks", lambda model, allowed: [])
    result = toy_window_test(softmax_scaled_model(TASK, 30.0), TASK, windows=(W,), sinks=(S,), n_sequences=N)
    assert not result.row("last 4").loss.mean > 0.05


def test_the_toy_result_persists_and_refuses_bad_arguments(tmp_path):
    result = toy_window_test(softmax_scaled_model(TASK, 30.0), TASK, windows=(W,), n_sequences=8)
    write_result(tmp_path / "w.json", result)
    assert read_result(tmp_path / "w.json", WindowTestResult) == result
    with pytest.raises(InputError, match="max W \\+ 2S"):
        toy_window_test(softmax_scaled_model(TASK, 30.0), TASK, windows=(14,), sinks=(1,), n_sequences=8)
    with pytest.raises(InputError, match="ToyTransformer"):
        toy_window_test(object(), TASK, windows=(W,))  # type: ignore[arg-type]
    model = softmax_scaled_model(TASK, 30.0)
    with pytest.raises(InputError, match="task must be a TaskConfig"):
        toy_window_test(model, "task", windows=(W,))  # type: ignore[arg-type]
    with pytest.raises(InputError, match="n_sequences must be a whole number"):
        toy_window_test(model, TASK, windows=(W,), n_sequences=2.5)  # type: ignore[arg-type]
