"""The explicit constructions (Theorems 1 and 3) and the trade-off measurement."""

from __future__ import annotations

import matplotlib.image
import pytest
import torch

from sinkscope.infra.codec import decode, encode
from sinkscope.interp.hook_names import pattern_hook
from sinkscope.toy.constructions import relu_exact_model, softmax_scaled_model
from sinkscope.toy.model import ToyModelConfig, ToyTransformer
from sinkscope.toy.task import TaskConfig, sample_batch
from sinkscope.toy.tradeoff import (
    TradeoffPoint,
    construction_curve,
    measure_tradeoff,
    plot_tradeoff,
    query_scale_curve,
)

TASK = TaskConfig()
PATTERN = pattern_hook(0)
SCALES = (2.0, 4.0, 8.0, 16.0)


@pytest.fixture(scope="module")
def softmax_curve() -> list[TradeoffPoint]:
    return construction_curve(TASK, SCALES, n_sequences=200)


@pytest.mark.parametrize("task", [TASK, TaskConfig(d_model=6, seq_len=9, eval_trigger_position=4)])
def test_relu_construction_is_exact_with_no_bos_weight(task: TaskConfig) -> None:
    model = relu_exact_model(task)
    generator = torch.Generator().manual_seed(0)
    positions = torch.arange(task.seq_len)
    triggers_seen = set()
    for _ in range(256):
        batch = sample_batch(task, 16, generator, "single")
        triggers_seen.update(batch.trigger_position.tolist())
        with torch.no_grad():
            output, cache = model.run_with_cache(batch.tokens, names_filter=PATTERN)
        assert (output - batch.targets).abs().max().item() < 1e-6
        pattern = cache[PATTERN][:, 0]  # [batch, query, key]
        assert torch.all(pattern[:, :, 0] == 0.0)
        non_trigger_rows = pattern[~batch.trigger_query_mask()]  # [n_rows, key]
        assert torch.all(non_trigger_rows == 0.0)
        trigger_rows = pattern[batch.trigger_query_mask()]  # [batch, key]
        j = batch.trigger_position.unsqueeze(1)
        expected = ((positions >= 1) & (positions <= j)).float() / j
        torch.testing.assert_close(trigger_rows, expected)
    assert triggers_seen == set(range(task.train_trigger_min, task.trigger_max + 1))


def test_relu_construction_on_the_tradeoff_is_exact_without_a_sink() -> None:
    point = measure_tradeoff(relu_exact_model(TASK), TASK, n_sequences=200)
    assert point.anchor_mass_default == 0.0
    assert point.default_mse == 0.0 and point.default_linf == 0.0
    assert point.trigger_mse < 1e-12


def test_softmax_construction_trades_error_for_sink_mass(softmax_curve: list[TradeoffPoint]) -> None:
    masses = [p.anchor_mass_default for p in softmax_curve]
    errors = [p.default_mse for p in softmax_curve]
    linfs = [p.default_linf for p in softmax_curve]
    assert all(a < b for a, b in zip(masses, masses[1:]))
    assert all(a > b for a, b in zip(errors, errors[1:]))
    assert all(a > b for a, b in zip(linfs, linfs[1:]))
    assert masses[-1] > 0.999 and errors[-1] < 1e-6
    assert [p.scale for p in softmax_curve] == list(SCALES)


def test_softmax_construction_trigger_row_is_uniform_over_the_prefix() -> None:
    model = softmax_scaled_model(TASK, 16.0)
    batch = sample_batch(TASK, 64, torch.Generator().manual_seed(1), "single")
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.tokens, names_filter=PATTERN)
    trigger_rows = cache[PATTERN][:, 0][batch.trigger_query_mask()]  # [batch, key]
    positions = torch.arange(TASK.seq_len)
    j = batch.trigger_position.unsqueeze(1)
    expected = ((positions >= 1) & (positions <= j)).float() / j
    torch.testing.assert_close(trigger_rows, expected, atol=1e-6, rtol=0)


def test_query_scale_curve_matches_the_construction_and_leaves_the_model(softmax_curve) -> None:
    model = softmax_scaled_model(TASK, 1.0)
    before = model.blocks[0].attn.W_Q.clone()
    points = query_scale_curve(model, TASK, [2.0, 16.0], n_sequences=200)
    assert torch.equal(model.blocks[0].attn.W_Q, before)
    for point, reference in zip(points, (softmax_curve[0], softmax_curve[-1])):
        assert point.scale == reference.scale
        assert point.anchor_mass_default == pytest.approx(reference.anchor_mass_default, rel=1e-5)
        assert point.default_mse == pytest.approx(reference.default_mse, rel=1e-3, abs=1e-15)


@pytest.mark.parametrize(
    "config",
    [
        ToyModelConfig(n_layers=2, n_heads=2),
        ToyModelConfig(n_layers=1, n_heads=1, residual=True),
        ToyModelConfig(n_layers=1, n_heads=2),
    ],
)
def test_measure_tradeoff_refuses_models_outside_theorem_1(config: ToyModelConfig) -> None:
    with pytest.raises(ValueError, match="one-layer, one-head models without a residual"):
        measure_tradeoff(ToyTransformer(config), TASK, n_sequences=8)


def test_measure_tradeoff_refuses_a_mismatched_task() -> None:
    with pytest.raises(ValueError, match="d_model"):
        measure_tradeoff(relu_exact_model(TaskConfig(d_model=8)), TASK, n_sequences=8)


def test_negative_scale_is_refused() -> None:
    with pytest.raises(ValueError, match="scale"):
        softmax_scaled_model(TASK, -1.0)


def test_tradeoff_point_round_trips() -> None:
    point = measure_tradeoff(softmax_scaled_model(TASK, 4.0), TASK, n_sequences=8, label="x")
    assert decode(TradeoffPoint, encode(point)) == point


def test_plot_tradeoff_writes_a_png(tmp_path, softmax_curve) -> None:
    relu = measure_tradeoff(relu_exact_model(TASK), TASK, n_sequences=50, label="relu")
    path = tmp_path / "plots" / "tradeoff.png"
    assert plot_tradeoff({"softmax construction": softmax_curve, "relu exact": [relu]}, path) == path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert [p.name for p in path.parent.iterdir()] == ["tradeoff.png"]


def test_plot_tradeoff_refuses_empty_input(tmp_path) -> None:
    with pytest.raises(ValueError, match="at least one"):
        plot_tradeoff({"empty": []}, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
