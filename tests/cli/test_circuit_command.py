"""`sinkscope circuit` end to end: on a GPT-2 checkpoint whose sink is built by
construction, on a trained toy run with learned position embeddings, its report, and its
bad input (one line naming the flag, exit 2, nothing written)."""

from __future__ import annotations

import json
import shutil

import pytest

from circuit_models import SINK, build_position_sink_gpt2
from sinkscope.cli import main
from sinkscope.infra.codec import read_result
from sinkscope.probes.circuit_result import CircuitRun
from sinkscope.reporting import report
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.run_dir import RunConfig, TrainConfig
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.train import train

FAST = ["--n-prompts", "8", "--max-len", "24", "--no-progress"]


@pytest.fixture(scope="module")
def position_sink_dir(tmp_path_factory):
    return build_position_sink_gpt2(tmp_path_factory.mktemp("models") / "position-sink")


def test_the_command_finds_the_constructed_circuit_and_reports_it(position_sink_dir, tmp_path, capsys) -> None:
    out = tmp_path / "circuit"
    assert main(["circuit", str(position_sink_dir), *FAST, "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    run = read_result(out / "circuit.json", CircuitRun)
    assert printed["out"] == str(out)
    assert run.battery.sink_heads == (SINK,)
    assert run.battery.n_inputs == 8
    shares = {row.intervention.edit: row.intervention.share_left for row in run.battery.rows}
    assert shares["replace_first_position"] is not None and shares["replace_first_position"].mean < 0.3
    frame = run.to_dataframe()
    assert set(frame["model"]) == {run.model} and {"share_left_mean", "error_change_ci_low"} <= set(frame.columns)
    page = (out / "report.html").read_text()
    assert "Edits and their controls" in page and "positions&#x27; embeddings swapped" in page
    transplant = run.battery.transplant
    assert transplant is not None and transplant.n_layers == 1 and transplant.n_heads_read == 2
    assert "Sink transplant" in page
    assert (out / "report_figures" / "circuit_share_left.png").is_file()
    # the report rebuilds from the result alone
    again = report(out, tmp_path / "again")
    assert again.kind == "circuit" and "replace the anchor&#x27;s position embedding" in again.html.read_text()


def test_a_toy_run_with_learned_positions_takes_the_battery(tmp_path, capsys) -> None:
    run_dir = tmp_path / "toy"
    model = ToyModelConfig(positional_embedding=True)
    train(RunConfig(model, TaskConfig(), TrainConfig(max_steps=1500)), run_dir, progress=False)
    out = tmp_path / "circuit"
    assert main(["circuit", str(run_dir), "--sequences", "200", "--out", str(out), "--json", "--no-progress"]) == 0
    run = read_result(out / "circuit.json", CircuitRun)
    assert run.error_name == "mean squared error at default positions"
    rows = {row.intervention.edit: row.intervention for row in run.battery.rows}
    assert rows["null_query_bias"].why_not == "no query bias"  # a toy model has none, and says so
    assert rows["replace_first_position"].applicable and rows["zero_key_dims"].applicable
    mlp = next(row.intervention for row in run.battery.rows if "MLP write" in row.label)
    assert mlp.why_not == "no mlp output"  # the paper's toy models have no MLP
    assert rows["swap_effective_positions"].why_not == "no MLP in layer 0"
    attention = next(row.intervention for row in run.battery.rows if "attention write" in row.label)
    assert attention.applicable and attention.share_left is not None
    markdown = (out / "report.md").read_text()
    assert "not applicable: no query bias" in markdown
    assert run.battery.transplant is None and "No sink transplant: a one-layer model" in markdown
    refused = (["--sink-eps", "0.5"], ["--prompts", "random"], ["--max-len", "3"])  # pretrained models' flags
    for flags in (*refused, ["--transplant-layers", "1"]):  # no later layer to read a transplant in
        capsys.readouterr()
        assert main(["circuit", str(run_dir), *flags, "--out", str(tmp_path / "refused"), "--no-progress"]) == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and flags[0] in error[0] and not (tmp_path / "refused").exists(), error


@pytest.mark.parametrize(
    ("flags", "flag"),
    [
        (["--write-layer", "9"], "--write-layer"),
        (["--position", "40"], "--position"),
        (["--k-dims", "32"], "--k-dims"),
        (["--k-dims", "17"], "--k-dims"),  # its control could zero only 15 others
        (["--transplant-layers", "2"], "--transplant-layers"),  # the model has 2 layers: none left to read
        (["--sink-eps", "0.0000001", "--prompts", "random"], "--sink-eps"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag_and_writes_nothing(position_sink_dir, tmp_path, capsys, flags, flag):
    out = tmp_path / "circuit"
    assert main(["circuit", str(position_sink_dir), *FAST, *flags, "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and flag in error[0], error
    assert not out.exists()


def test_an_overwrite_onto_the_model_directory_is_refused_and_the_model_kept(position_sink_dir, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(position_sink_dir, model)
    before = sorted(path.name for path in model.iterdir())
    for out in (model, tmp_path):  # the model's own directory, and one that holds it
        assert main(["circuit", str(model), *FAST, "--out", str(out), "--overwrite"]) == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and "model" in error[0], error
        assert sorted(path.name for path in model.iterdir()) == before


@pytest.mark.parametrize(
    ("tamper", "field"),
    [
        (lambda data: data["battery"]["rows"][4]["intervention"]["share_left"].update(mean=-0.5, ci_low=-0.9), "share"),
        (lambda data: data["battery"]["rows"][4]["intervention"].update(share_left=None), "share_left"),
        (lambda data: data["battery"].update(rows=[]), "rows"),
        (lambda data: data["battery"].update(sink_heads=[[1, 0], [1, 0]]), "sink_heads"),
    ],
    ids=["negative share", "applicable without a share", "no rows", "a head twice"],
)
def test_a_tampered_circuit_result_is_refused_by_the_report(position_sink_dir, tmp_path, capsys, tamper, field):
    out = tmp_path / "circuit"
    assert main(["circuit", str(position_sink_dir), *FAST, "--out", str(out), "--json"]) == 0
    data = json.loads((out / "circuit.json").read_text())
    assert data["battery"]["rows"][4]["intervention"]["applicable"]
    tamper(data)
    (out / "circuit.json").write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["report", str(out), "--overwrite"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and field in error[0], error
