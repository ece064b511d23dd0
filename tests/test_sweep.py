"""`sinkscope toy sweep`: grid, aggregation, plots, resumption and bad input."""

from __future__ import annotations

import json

import pytest

from sinkscope.cli import main
from toy.sweep import SweepConfig, sweep


def test_sweep_aggregates_seeds_per_configuration(tmp_path):
    config = SweepConfig(seq_lens=(6, 8), d_models=(6,), attentions=("softmax", "relu"), seeds=2,
                         max_steps=2500, n_sequences=64, workers=1)
    result = sweep(config, tmp_path / "sweep", progress=False)
    assert [(r.attention, r.seq_len) for r in result.rows] == [("softmax", 6), ("softmax", 8), ("relu", 6), ("relu", 8)]
    assert len(result.models) == 8
    by_kind = {r.attention: r for r in result.rows if r.seq_len == 8}
    # the paper's result, across seeds: one-layer softmax models sink, ReLU models do not
    assert by_kind["softmax"].converged == 2 and by_kind["softmax"].sink_fraction == 1.0
    assert by_kind["relu"].converged == 2 and by_kind["relu"].sink_fraction == 0.0
    data = json.loads((tmp_path / "sweep" / "summary.json").read_text())
    assert len(data["rows"]) == 4 and len(data["models"]) == 8
    for figure in data["figures"]:
        assert (tmp_path / "sweep" / figure).read_bytes()[:4] == b"\x89PNG"
    assert "sink_fraction_softmax_1x1.png" not in data["figures"]  # one d_model: no grid heatmap
    again = sweep(config, tmp_path / "sweep", progress=False)  # same settings: reuses the runs
    assert [m.steps for m in again.models] == [m.steps for m in result.models]


def test_sweep_refuses_impossible_grids_before_training(tmp_path, capsys):
    with pytest.raises(ValueError, match="d_model >= 4"):
        SweepConfig(d_models=(3, 8))
    assert main(["toy", "sweep", "--out", str(tmp_path / "s"), "--seq-len", "2", "--no-progress"]) == 2
    assert "seq_len >= 3" in capsys.readouterr().err
    assert main(["toy", "sweep", "--out", str(tmp_path / "s"), "--attention", "cosine", "--no-progress"]) == 2
    with pytest.raises(SystemExit) as exit_info:
        main(["toy", "sweep", "--out", str(tmp_path / "s"), "--seq-len", "8,x"])
    assert exit_info.value.code == 2 and "comma-separated integers" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
