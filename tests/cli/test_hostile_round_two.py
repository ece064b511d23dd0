"""Findings of the second hostile pass (issue 22): summaries whose claims contradict their
own numbers, empty summaries, empty and non-UTF-8 arguments, a callback that is not one.
Each is one line and exit 2 (or the typed error in Python), and nothing is written."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from fault_checks import one_line_exit_2, snapshot
from sinkscope.cli import main
from sinkscope.infra.errors import InputError
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.run_dir import RunConfig, TrainConfig
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.train import train

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "b883e06"


def tampered(tmp_path: Path, fixture: str, name: str, edit) -> Path:
    result = tmp_path / fixture
    shutil.copytree(FIXTURES / fixture, result)
    data = json.loads((result / name).read_text())
    edit(data)
    (result / name).write_text(json.dumps(data))
    return result


def refused_report(capsys, result: Path, tmp_path: Path, fix: str) -> None:
    before = snapshot(result)
    one_line_exit_2(capsys, ["report", str(result), "--out", str(tmp_path / "r"), "--no-progress"], fix)
    assert snapshot(result) == before and not (tmp_path / "r").exists()


def test_a_reproduction_claiming_a_model_converged_against_its_numbers_is_refused(capsys, tmp_path):
    def edit(data):
        data["models"][0]["converged"] = True  # status max_steps, linf_error 0.91

    refused_report(capsys, tampered(tmp_path, "reproduction", "summary.json", edit), tmp_path, "models[0].converged")


def test_a_sweep_summary_without_rows_is_refused_not_a_division_by_zero(capsys, tmp_path):
    def edit(data):
        data["rows"] = []

    refused_report(capsys, tampered(tmp_path, "sweep", "summary.json", edit), tmp_path, "rows is empty")


def test_a_mechanism_comparison_without_models_is_refused(capsys, tmp_path):
    def edit(data):
        data["models"] = []

    refused_report(capsys, tampered(tmp_path, "mechanism", "mechanism.json", edit), tmp_path, "models is empty")


def test_an_empty_run_is_not_the_current_directory(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line_exit_2(capsys, ["toy", "tradeoff", "--run", "", "--out", "t"], "run is empty; pass a value (--run)")
    assert list(tmp_path.iterdir()) == []


def test_a_path_that_is_not_utf8_is_one_line(capsys, tmp_path):
    name = os.fsdecode(b"run\xfe")  # what Python makes of a Linux file name that is not UTF-8
    shutil.copytree(FIXTURES / "toy-run", tmp_path / name)
    before = snapshot(tmp_path)
    one_line_exit_2(capsys, ["toy", "probe", str(tmp_path / name), "--out", str(tmp_path / "p")], "is not valid UTF-8")
    one_line_exit_2(capsys, ["toy", "train", "--max-steps", "5", "--out", str(tmp_path / name / "x")], "UTF-8 name")
    assert snapshot(tmp_path) == before


def test_a_train_callback_that_is_not_callable_is_named_before_anything_is_made(tmp_path):
    config = RunConfig(ToyModelConfig(), TaskConfig(), TrainConfig(max_steps=5))
    with pytest.raises(InputError, match="on_log must be a function") as caught:
        train(config, tmp_path / "run", progress=False, on_log="x")  # type: ignore[arg-type]
    assert caught.value.field == "on_log" and not (tmp_path / "run").exists()


def test_a_summary_that_is_a_fifo_is_named_not_reported_as_another_kind(capsys, tmp_path):
    result = tmp_path / "reproduction"
    shutil.copytree(FIXTURES / "reproduction", result)
    (result / "summary.json").unlink()
    os.mkfifo(result / "summary.json")  # the kind must not fall back to "toy tradeoff"
    refused_report(capsys, result, tmp_path, "summary.json is not a regular file")


@pytest.mark.parametrize("replaced", ["checkpoints/step-00000020", "checkpoints"])
def test_a_pipe_in_place_of_a_checkpoint_folder_names_the_pipe(capsys, tmp_path, replaced):
    run = tmp_path / "run"
    argv = ["toy", "train", "--max-steps", "20", "--checkpoint-every", "10", "--out", str(run), "--no-progress"]
    assert main(argv) == 0
    shutil.rmtree(run / replaced)
    os.mkfifo(run / replaced)
    before = snapshot(run)
    argv[argv.index("--max-steps") + 1] = "30"
    one_line_exit_2(capsys, [*argv, "--resume"], "is not a checkpoint folder (it is a file, link or pipe); remove it")
    assert snapshot(run) == before
