"""`sinkscope toy probe` on trained toy models: the default-state test on real training runs."""

from __future__ import annotations

import json

import pytest

from round_trip import assert_json_files_round_trip
from sinkscope.cli import main
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.probe_run import probe_run
from sinkscope.toy.run_dir import RunConfig, TrainConfig
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.train import train


@pytest.fixture(scope="module")
def trained_runs(tmp_path_factory):
    """1x1 softmax and ReLU models trained to convergence (about 800 and 700 steps)."""
    root = tmp_path_factory.mktemp("runs")
    runs = {}
    for attention in ("softmax", "relu"):
        config = RunConfig(ToyModelConfig(attention=attention), TaskConfig(), TrainConfig(seed=0))
        result = train(config, root / attention, progress=False)
        assert result.converged
        runs[attention] = root / attention
    return runs


def test_softmax_sink_removal_breaks_the_default_state_and_the_control_does_not(trained_runs, tmp_path):
    report = probe_run(trained_runs["softmax"], tmp_path / "probe", n_sequences=300)
    state = report.default_state
    assert state.sink_heads == ((0, 0),)
    remove_rise = state.default_error_after_remove - state.default_error_before
    control_rise = state.default_error_after_control - state.default_error_before
    assert remove_rise > 10 * max(control_rise, 0.0)
    assert state.error_growth_remove > 1000  # orders of magnitude, not a nudge
    assert state.error_growth_control < 2
    assert state.remove_increase_ci[0] > state.control_increase_ci[1]  # intervals do not overlap
    head = report.probe.heads[0]
    assert head.anchor_mass > 0.99 and head.is_sink_head
    for name in report.files:
        assert (tmp_path / "probe" / name).stat().st_size > 0


def test_relu_model_has_no_sink_to_remove(trained_runs, tmp_path):
    report = probe_run(trained_runs["relu"], tmp_path / "probe", n_sequences=300)
    assert report.default_state.sink_heads == ()
    assert "no sink" in report.default_state.note
    assert report.probe.heads[0].anchor_mass < 0.01


def test_cli_probe_json_and_no_overwrite(trained_runs, tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["toy", "probe", str(trained_runs["softmax"]), "--out", str(out), "--sequences", "100", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["default_state"]["sink_heads"] == [[0, 0]]
    assert assert_json_files_round_trip(out) == {"probe", "toy_default_state", "toy_source_run", "provenance"}
    assert main(["toy", "probe", str(trained_runs["softmax"]), "--out", str(out), "--sequences", "100"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["toy", "probe", str(tmp_path / "missing"), "--sequences", "100"]) == 2
    assert "sinkscope toy train" in capsys.readouterr().err
