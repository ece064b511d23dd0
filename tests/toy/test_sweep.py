"""`sinkscope toy sweep`: grid, aggregation, plots, resumption and bad input."""

from __future__ import annotations

import json

import pytest

from round_trip import assert_json_files_round_trip
from sinkscope.cli import main
from sinkscope.toy.sweep import SweepConfig, sweep

OLDER_ABSENT = ("layer_norms", "mlps", "schema", "schema_version")


def test_sweep_aggregates_seeds_per_configuration(tmp_path):
    config = SweepConfig(
        seq_lens=(6, 8),
        d_models=(6,),
        attentions=("softmax", "relu"),
        seeds=2,
        max_steps=2500,
        n_sequences=64,
        workers=1,
    )
    result = sweep(config, tmp_path / "sweep", progress=False)
    assert [(r.attention, r.seq_len) for r in result.rows] == [("softmax", 6), ("softmax", 8), ("relu", 6), ("relu", 8)]
    assert len(result.models) == 8
    frame = result.to_dataframe()
    assert len(frame) == 8  # one-layer, one-head models: a row each
    grouped = frame.groupby(["attention", "seq_len"])["is_sink_head"].mean()  # the grid's axes are columns
    for row in result.rows:
        assert grouped[(row.attention, row.seq_len)] == row.sink_fraction
    assert set(frame["d_model"]) == {6} and not frame["layer_norm"].any() and not frame["mlp"].any()
    by_kind = {r.attention: r for r in result.rows if r.seq_len == 8}
    # the paper's result, across seeds: one-layer softmax models sink, ReLU models do not
    assert by_kind["softmax"].converged == 2 and by_kind["softmax"].sink_fraction == 1.0
    assert by_kind["relu"].converged == 2 and by_kind["relu"].sink_fraction == 0.0
    data = json.loads((tmp_path / "sweep" / "summary.json").read_text())
    assert len(data["rows"]) == 4 and len(data["models"]) == 8
    for figure in data["figures"]:
        assert (tmp_path / "sweep" / figure).read_bytes()[:4] == b"\x89PNG"
    assert "sink_fraction_softmax_1x1.png" not in data["figures"]  # one d_model: no grid heatmap
    assert assert_json_files_round_trip(tmp_path / "sweep") >= {
        "sweep",
        "sweep_config",
        "run_config",
        "train_result",
        "model_summary",
    }
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


def test_the_phase_diagram_preset_sizes_the_grid_by_device():
    from sinkscope.toy.sweep import phase_diagram

    gpu, cpu = phase_diagram("cuda"), phase_diagram("cpu")
    assert len(gpu.jobs()) == 4 * 4 * 4 * 2 * 2 * 4 == 1024
    assert set(gpu.attentions) == {"softmax", "relu", "relu_prefix", "sigmoid"}
    assert gpu.layer_norms == gpu.mlps == (False, True)
    assert len(cpu.jobs()) == 64 and cpu.mlps == (False,)


def test_a_phase_diagram_sweep_reports_cells_with_ranges_over_seeds(tmp_path, capsys):
    """The preset through the CLI, narrowed to a few short runs: every cell (attention x
    layers x heads x LayerNorm) has its seeds' ranges and default-position error, one
    layers x heads figure per kind and block, and the report shows them."""
    out = tmp_path / "phase"
    argv = [
        "toy",
        "sweep",
        "--preset",
        "phase",
        "--layers",
        "1,2",
        "--heads",
        "1",
        "--attention",
        "softmax,relu",
        "--seeds",
        "2",
        "--max-steps",
        "40",
        "--sequences",
        "32",
        "--workers",
        "1",
        "--out",
        str(out),
        "--no-progress",
        "--json",
    ]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    rows = data["rows"]
    assert len(rows) == 2 * 2 * 1 * 2  # attention x layers x heads x LayerNorm (MLP off on a CPU)
    assert {(r["layer_norm"], r["mlp"]) for r in rows} == {(False, False), (True, False)}
    for row in rows:
        low, high = row["sink_fraction_range"]
        assert 0.0 <= low <= row["sink_fraction"] <= high <= 1.0
        assert row["steps_range"] == [40, 40] and row["default_mse_range"][0] <= row["mean_default_mse"]
    assert sorted(f for f in data["figures"] if f.startswith("phase_")) == [
        "phase_relu_d16_L16.png",
        "phase_relu_d16_L16_ln.png",
        "phase_softmax_d16_L16.png",
        "phase_softmax_d16_L16_ln.png",
    ]
    assert (out / "relu-2x1-d16-L16-ln-seed1" / "result.json").is_file()
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert (
        "sink fraction at cap over seeds" in page
        and "softmax 2x1 d16 L16 +LN" in page
        and "phase softmax d16 L16 ln" in page
    )


def test_an_older_sweep_directory_without_the_new_axes_still_resumes(tmp_path):
    config = SweepConfig(
        seq_lens=(6,), d_models=(6,), attentions=("relu",), seeds=1, max_steps=20, n_sequences=16, workers=1
    )
    first = sweep(config, tmp_path / "s", progress=False)
    # sweep.json as sinkscope wrote it before the LayerNorm and MLP axes and schema versions
    marker = tmp_path / "s" / "sweep.json"
    old = {key: value for key, value in json.loads(marker.read_text()).items() if key not in OLDER_ABSENT}
    marker.write_text(json.dumps(old))
    again = sweep(config, tmp_path / "s", progress=False)
    assert [m.steps for m in again.models] == [m.steps for m in first.models]
