"""A comparison draws only what was measured: a 6-layer and a 30-layer model give exactly 6
and 30 markers on the per-layer figure (no model interpolated onto the other's depth), and
lines join only the checkpoints of one model, never two models."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sinkscope.pretrained_analysis.audit import AuditConfig, audit
from sinkscope.pretrained_analysis.compare import compare_audits, read_comparison, write_comparison
from sinkscope.pretrained_analysis.compare_figures import CHECKPOINT_AXIS, MODEL_AXIS, layer_figure, sink_rate_figure
from sinkscope.pretrained_analysis.loading import LoadSpec
from tiny_models import build_tiny_gpt2

PROMPTS = [
    "The first token collects attention that has nowhere else to go.",
    "Sinks appear in softmax attention because every row must sum to one.",
    "Language models park their attention on the beginning of the sequence.",
]
CONFIG = AuditConfig(n_examples=0, batch_size=3)


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    """Audits of a 6-layer and a 30-layer tiny GPT-2 on the same prompts, compared."""
    root = tmp_path_factory.mktemp("models")
    results = [
        audit(
            LoadSpec(str(build_tiny_gpt2(root / f"gpt2-{depth}", n_layer=depth, n_embd=16))),
            PROMPTS,
            CONFIG,
            progress=False,
        )
        for depth in (6, 30)
    ]
    return compare_audits(results)


def plotted(figure) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every drawn series of the figure's first axes: its label -> (x, y) as plotted."""
    ax = figure.axes[0]
    return {
        line.get_label(): (np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float))
        for line in ax.lines
    }


def test_each_model_is_drawn_at_its_own_layers_only(comparison, tmp_path):
    series = plotted(layer_figure(comparison, tmp_path / "layers.png"))
    assert sorted(len(x) for x, _ in series.values()) == [6, 30]
    for row in comparison.rows:
        ((x, y),) = [xy for label, xy in series.items() if label.startswith(row.label)]
        assert np.allclose(x, (np.arange(row.n_layers) + 0.5) / row.n_layers)  # relative depth of each layer
        assert np.allclose(y, row.layer_anchor_mass)  # the measured values, none invented
        assert f"({row.n_layers} layers)" in [label for label in series if label.startswith(row.label)][0]


def test_the_written_comparison_reads_back_to_the_same_points(comparison, tmp_path):
    write_comparison(comparison, tmp_path / "cmp")
    again = read_comparison(tmp_path / "cmp")
    series = plotted(layer_figure(again, tmp_path / "again.png"))
    assert sorted(len(x) for x, _ in series.values()) == [6, 30]
    assert (tmp_path / "cmp" / "comparison_anchor_mass_by_layer.png").is_file()


def test_unrelated_models_are_markers_on_a_model_axis(comparison, tmp_path):
    figure = sink_rate_figure(comparison, tmp_path / "rate.png")
    ax = figure.axes[0]
    assert ax.get_xlabel() == MODEL_AXIS
    assert not comparison.has_checkpoints()
    assert ax.lines and all(line.get_linestyle() == "None" for line in ax.lines)  # no line between two models
    assert all(len(line.get_xdata()) == len(comparison.rows) for line in ax.lines)
    assert [tick.get_text() for tick in ax.get_xticklabels()] == [row.label for row in comparison.rows]


def _checkpoints(comparison, model: str, revisions: list[str]):
    row = comparison.rows[0]
    return [replace(row, model=model, label=f"{model}@{rev}", revision=rev) for rev in revisions]


def test_checkpoints_of_one_model_are_one_line(comparison, tmp_path):
    suite = replace(comparison, rows=tuple(_checkpoints(comparison, "org/m", ["step1", "step10", "step100"])))
    assert suite.has_checkpoints()
    ax = sink_rate_figure(suite, tmp_path / "rate.png").axes[0]
    assert ax.get_xlabel() == CHECKPOINT_AXIS
    assert len(ax.lines) == len(suite.epsilons())  # one line per threshold, through the three checkpoints
    assert all(line.get_linestyle() != "None" and len(line.get_xdata()) == 3 for line in ax.lines)
    assert [tick.get_text() for tick in ax.get_xticklabels()] == ["step1", "step10", "step100"]


def test_two_suites_draw_one_line_per_model(comparison, tmp_path):
    rows = _checkpoints(comparison, "org/a", ["step1", "step2"]) + _checkpoints(comparison, "org/b", ["step1", "step2"])
    lone = replace(comparison.rows[1], model="org/c", label="org/c", revision=None)  # one audit: a marker, no line
    mixed = replace(comparison, rows=(*rows, lone))
    ax = sink_rate_figure(mixed, tmp_path / "rate.png").axes[0]
    lines = {line.get_label(): line for line in ax.lines}
    n_eps = len(mixed.epsilons())
    assert len(lines) == 3 * n_eps
    for model in ("org/a", "org/b"):
        joined = [line for label, line in lines.items() if label.startswith(model)]
        assert len(joined) == n_eps and all(line.get_linestyle() != "None" for line in joined)
        assert all(len(line.get_xdata()) == 2 for line in joined)
    assert all(line.get_linestyle() == "None" for label, line in lines.items() if label.startswith("org/c"))
