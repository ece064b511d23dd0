"""A run's files must agree with each other before any command analyses it (issue 22,
hostile pass T18, T20, T21, T23, D15, D02, D03, D07): a result.json that contradicts the
run's config, a config.json edited after training, final weights swapped or missing, a
result.json or config.json that is not a regular file. Each is one line (exit 2), nothing
written. Also `toy patch` records its provenance and its report says the unfinished note once."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from fault_checks import one_line_exit_2, snapshot
from sinkscope.cli import main
from sinkscope.toy.run_dir import CHECKPOINTS, CONFIG_FILE, FINAL_WEIGHTS, RESULT_FILE


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A run finished at step 4 (max_steps), with checkpoints at steps 2 and 4."""
    run = tmp_path_factory.mktemp("integrity") / "run"
    argv = ["toy", "train", "--no-progress", "--json", "--max-steps", "4", "--checkpoint-every", "2"]
    assert main([*argv, "--out", str(run)]) == 0
    return run


@pytest.fixture
def run(finished, tmp_path) -> Path:
    return Path(shutil.copytree(finished, tmp_path / "run"))


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    for dotted, value in changes.items():
        *parents, key = dotted.split("__")
        node = data
        for parent in parents:
            node = node[parent]
        node[key] = value
    path.write_text(json.dumps(data))


def _refused(capsys, tmp_path: Path, argv: list[str], *words: str) -> None:
    before = snapshot(tmp_path)
    one_line_exit_2(capsys, argv, words[0])
    assert snapshot(tmp_path) == before
    err = capsys.readouterr().err  # one_line_exit_2 consumed it; check the words on a second run
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert all(word in err for word in words), err
    assert snapshot(tmp_path) == before


def test_a_converged_claim_above_the_stop_threshold_is_refused(run, tmp_path, capsys):
    result = json.loads((run / RESULT_FILE).read_text())
    assert result["linf_error"] > 0.005  # four steps do not converge
    _edit_json(run / RESULT_FILE, status="converged", converged=True)
    argv = ["toy", "probe", str(run), "--sequences", "8"]
    _refused(capsys, tmp_path, argv, "linf_error", str(run / RESULT_FILE), "stop_linf")


def test_more_steps_than_max_steps_is_refused(run, tmp_path, capsys):
    _edit_json(run / RESULT_FILE, steps=99)
    argv = ["toy", "probe", str(run), "--sequences", "8", "--allow-unfinished"]
    _refused(capsys, tmp_path, argv, "max_steps", str(run / RESULT_FILE), "steps 99")


@pytest.mark.parametrize(
    "command, change, setting",
    [
        (["probe", "--sequences", "8"], {"model__attention": "relu"}, "model.attention"),
        (["patch", "--inputs", "8"], {"model__scale_scores": True}, "model.scale_scores"),
    ],
    ids=["probe-attention", "patch-scale_scores"],
)
def test_a_config_edited_after_training_is_refused(run, tmp_path, capsys, command, change, setting):
    _edit_json(run / CONFIG_FILE, **change)
    argv = ["toy", command[0], str(run), *command[1:], "--allow-unfinished"]
    _refused(capsys, tmp_path, argv, setting, "config.json")


def test_tradeoff_and_evaluate_check_the_config_too(run, tmp_path, capsys):
    from sinkscope.infra.errors import InputError
    from sinkscope.toy.evaluate import evaluate_run

    _edit_json(run / CONFIG_FILE, model__attention="relu")
    argv = ["toy", "tradeoff", "--run", str(run), "--out", str(tmp_path / "t")]
    _refused(capsys, tmp_path, argv, "model.attention")
    with pytest.raises(InputError, match="model.attention"):
        evaluate_run(run, n_sequences=8, write_figures=False)


def test_final_weights_swapped_for_a_checkpoint_are_refused(run, tmp_path, capsys):
    shutil.copyfile(run / CHECKPOINTS / "step-00000002" / "model.safetensors", run / FINAL_WEIGHTS)
    argv = ["toy", "probe", str(run), "--sequences", "8", "--allow-unfinished"]
    _refused(capsys, tmp_path, argv, "is not the weights this run finished with", "restore them or retrain")


def test_missing_final_weights_are_refused_not_replaced_by_a_checkpoint(run, tmp_path, capsys):
    (run / FINAL_WEIGHTS).unlink()
    shutil.rmtree(run / CHECKPOINTS / "step-00000004")
    argv = ["toy", "probe", str(run), "--sequences", "8"]
    _refused(capsys, tmp_path, argv, FINAL_WEIGHTS, "--allow-unfinished")
    assert main([*argv, "--allow-unfinished"]) == 0
    notes = json.loads((run / "probe" / "probe.json").read_text())["notes"]
    assert any("step 2" in note and FINAL_WEIGHTS in note for note in notes), notes


def test_an_unfinished_run_whose_checkpoint_weights_were_swapped_is_refused(run, tmp_path, capsys):
    """Checkpoint weights are tied to their state.json by hash, as the final weights to
    result.json (issue 34, item 3): the checkpoint an unfinished run is analysed from too."""
    (run / RESULT_FILE).unlink()
    (run / FINAL_WEIGHTS).unlink()
    newest = run / CHECKPOINTS / "step-00000004" / "model.safetensors"
    shutil.copyfile(run / CHECKPOINTS / "step-00000002" / "model.safetensors", newest)
    argv = ["toy", "probe", str(run), "--sequences", "8", "--allow-unfinished"]
    _refused(capsys, tmp_path, argv, "its hash differs", str(newest), "restore it or retrain")


@pytest.mark.parametrize(
    "name, make, what",
    [
        (RESULT_FILE, os.mkfifo, "is a named pipe"),
        (RESULT_FILE, os.mkdir, "is a directory"),
        (CONFIG_FILE, os.mkfifo, "is a named pipe"),
    ],
    ids=["result-fifo", "result-directory", "config-fifo"],
)
def test_a_run_file_that_is_not_a_regular_file_is_named_as_such(run, tmp_path, capsys, name, make, what):
    (run / name).unlink()
    make(run / name)
    argv = ["toy", "probe", str(run), "--sequences", "8", "--allow-unfinished"]
    _refused(capsys, tmp_path, argv, what, "not a regular file", "restore it or retrain", name)


def test_patch_writes_provenance_and_its_report_says_the_note_once(finished, tmp_path, capsys):
    run = Path(shutil.copytree(finished, tmp_path / "run"))
    (run / RESULT_FILE).unlink()
    (run / FINAL_WEIGHTS).unlink()
    out = tmp_path / "patch"
    assert main(["toy", "patch", str(run), "--inputs", "8", "--out", str(out), "--allow-unfinished"]) == 0
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["command"] == "toy patch" and str(run.resolve()) in provenance["source"]
    assert main(["report", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert report.count("has not finished training") == 1, report
    assert "predates provenance" not in report


def test_resume_names_a_result_that_is_a_named_pipe_without_opening_it(run, tmp_path, capsys):
    (run / RESULT_FILE).unlink()
    os.mkfifo(run / RESULT_FILE)  # opening it to read would wait forever for a writer
    argv = ["toy", "train", "--no-progress", "--max-steps", "4", "--checkpoint-every", "2", "--resume"]
    _refused(capsys, tmp_path, [*argv, "--out", str(run)], "is a named pipe", "restore it or retrain")


def test_a_finished_run_records_the_hash_of_its_final_weights(finished):
    import hashlib

    result = json.loads((finished / RESULT_FILE).read_text())
    assert result["weights_sha256"] == hashlib.sha256((finished / FINAL_WEIGHTS).read_bytes()).hexdigest()
