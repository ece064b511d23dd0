"""Resume decides everything before it touches anything (issue 22, items 1, 7, 9, 10): a
refused resume leaves the run directory byte for byte as it was, a finished run keeps its
final weights and result until the continued run replaces them, and every field that
changes the numbers must match the checkpoint's own record."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
from pathlib import Path

import pytest

from sinkscope.cli import main
from sinkscope.toy.run_dir import FINAL_WEIGHTS, RESULT_FILE, checkpoint_dirs

_spec = importlib.util.spec_from_file_location("faults", Path(__file__).parents[1] / "cli" / "test_faults.py")
assert _spec is not None and _spec.loader is not None
faults = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(faults)
snapshot, one_line_exit_2 = faults.snapshot, faults.one_line_exit_2

TRAIN = ["toy", "train", "--no-progress", "--json"]


def _train(run: Path, *flags: str) -> int:
    return main([*TRAIN, "--out", str(run), *flags])


@pytest.fixture
def finished_run(tmp_path, capsys) -> Path:
    """A run finished at max_steps 30, checkpoints at 20 and 30."""
    run = tmp_path / "r" / "run"
    assert _train(run, "--max-steps", "30", "--checkpoint-every", "10") == 0
    capsys.readouterr()
    assert [p.name for p in checkpoint_dirs(run)] == ["step-00000020", "step-00000030"]
    return run


def _refused_untouched(capsys, run: Path, argv: list[str], fix: str) -> None:
    before = snapshot(run)
    one_line_exit_2(capsys, argv, fix)
    assert snapshot(run) == before
    assert (run / FINAL_WEIGHTS).is_file() and (run / RESULT_FILE).is_file()


def test_the_issue_example_truncated_checkpoints_keep_the_final_weights(finished_run, capsys):
    for checkpoint in checkpoint_dirs(finished_run):
        os.truncate(checkpoint / "model.safetensors", 100)
    argv = [*TRAIN, "--out", str(finished_run), "--max-steps", "40", "--checkpoint-every", "10", "--resume"]
    _refused_untouched(capsys, finished_run, argv, "nothing was changed")
    assert main(["toy", "probe", str(finished_run), "--sequences", "8", "--json"]) == 0  # still a finished run


def _edit_state(run: Path, edit) -> None:
    for checkpoint in checkpoint_dirs(run):
        path = checkpoint / "state.json"
        path.write_text(json.dumps(edit(json.loads(path.read_text()))))


@pytest.mark.parametrize(
    "edit, fix",
    [
        (lambda state: {}, "state.json is not"),
        (lambda state: {**state, "step": str(state["step"])}, "step is '"),
        (lambda state: [], "state.json is not an object"),
    ],
    ids=["empty-object", "string-step", "list"],
)
def test_a_malformed_state_json_is_one_line_and_loses_nothing(finished_run, capsys, edit, fix):
    _edit_state(finished_run, edit)
    argv = [*TRAIN, "--out", str(finished_run), "--max-steps", "40", "--resume"]
    _refused_untouched(capsys, finished_run, argv, "nothing was changed")


def test_another_device_in_state_json_is_refused_before_anything_changes(finished_run, capsys):
    _edit_state(finished_run, lambda state: {**state, "device": "cuda"})
    argv = [*TRAIN, "--out", str(finished_run), "--max-steps", "40", "--resume"]
    _refused_untouched(capsys, finished_run, argv, "resume it on device cuda")


def test_an_lr_edited_in_config_json_is_refused_before_anything_changes(finished_run, capsys):
    config = json.loads((finished_run / "config.json").read_text())
    config["train"]["lr"] = 0.002
    (finished_run / "config.json").write_text(json.dumps(config))
    argv = [*TRAIN, "--out", str(finished_run), "--max-steps", "40", "--lr", "0.002", "--resume"]
    argv += ["--checkpoint-every", "10"]  # the run's own: before the fix only this reached the deleting path
    _refused_untouched(capsys, finished_run, argv, "were trained at lr 0.001")


@pytest.mark.parametrize("max_steps", ["30", "40"], ids=["finished", "continued"])
def test_a_seed_edited_in_config_json_is_refused_naming_the_seed(finished_run, capsys, max_steps):
    config = json.loads((finished_run / "config.json").read_text())
    config["train"]["seed"] = 5
    (finished_run / "config.json").write_text(json.dumps(config))
    argv = [*TRAIN, "--out", str(finished_run), "--max-steps", max_steps, "--seed", "5", "--resume"]
    _refused_untouched(capsys, finished_run, argv, "train.seed 0 (asked: 5)")


def test_raising_max_steps_keeps_the_old_result_until_the_new_one_exists(finished_run, capsys, monkeypatch):
    from sinkscope.toy import seed_stack

    old_weights, old_result = (finished_run / FINAL_WEIGHTS).read_bytes(), (finished_run / RESULT_FILE).read_bytes()

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # a kill while the continued run trains

    monkeypatch.setattr(seed_stack, "sample_batch", crash)
    assert _train(finished_run, "--max-steps", "40", "--resume") != 0
    assert (finished_run / FINAL_WEIGHTS).read_bytes() == old_weights
    assert (finished_run / RESULT_FILE).read_bytes() == old_result
    monkeypatch.undo()
    assert _train(finished_run, "--max-steps", "40", "--resume") == 0
    assert json.loads((finished_run / RESULT_FILE).read_text())["steps"] == 40


def test_checkpoint_every_may_differ_on_resume(finished_run, capsys):
    assert _train(finished_run, "--max-steps", "40", "--checkpoint-every", "7", "--resume") == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 40


def test_a_read_only_run_directory_is_one_line(finished_run, capsys, monkeypatch):
    if os.geteuid() == 0:  # root may write anywhere: let the check see the mode bits as a user's process would
        monkeypatch.setattr(os, "access", lambda path, mode: bool(os.stat(path).st_mode & stat.S_IWUSR))
    finished_run.chmod(0o555)
    try:
        argv = [*TRAIN, "--out", str(finished_run), "--max-steps", "40", "--resume"]
        _refused_untouched(capsys, finished_run, argv, "chmod u+w")
    finally:
        finished_run.chmod(0o755)


def test_a_taken_quarantine_name_is_not_a_traceback_and_loses_nothing(finished_run, capsys):
    newest = checkpoint_dirs(finished_run)[-1]
    taken = newest.with_name(f"unreadable-{newest.name}")
    taken.mkdir()
    (taken / "earlier.txt").write_text("an earlier quarantine")
    os.truncate(newest / "model.safetensors", 100)
    assert _train(finished_run, "--max-steps", "40", "--resume") == 0
    assert (taken / "earlier.txt").read_text() == "an earlier quarantine"
    assert (newest.with_name(f"{taken.name}.2") / "model.safetensors").stat().st_size == 100
    assert "kept as unreadable-step-00000030.2" in capsys.readouterr().err


def test_weights_of_the_wrong_shape_on_resume_are_one_line(finished_run, capsys):
    from sinkscope.toy.checkpoint import load_tensors, save_tensors

    for checkpoint in checkpoint_dirs(finished_run):
        weights = load_tensors(checkpoint / "model.safetensors")
        save_tensors(checkpoint / "model.safetensors", {name: t[..., :3] for name, t in weights.items()})
    argv = [*TRAIN, "--out", str(finished_run), "--max-steps", "40", "--resume"]
    _refused_untouched(capsys, finished_run, argv, "do not fit the run's model")


def test_the_readme_resume_form_on_a_2x2_run_names_the_flags_to_repeat(tmp_path, capsys):
    run = tmp_path / "relu-2x2"
    assert _train(run, "--attention", "relu", "--layers", "2", "--heads", "2", "--seed", "1", "--max-steps", "3") == 0
    capsys.readouterr()
    before = snapshot(run)
    one_line_exit_2(capsys, [*TRAIN, "--out", str(run), "--resume"], "--attention relu --layers 2 --heads 2 --seed 1")
    assert snapshot(run) == before


def test_a_run_record_edited_into_nonsense_is_refused_naming_the_settings(finished_run, capsys):
    _edit_state(
        finished_run, lambda state: {**state, "run": {"model": "x", "task": [], "train": state["run"]["train"]}}
    )
    argv = [*TRAIN, "--out", str(finished_run), "--max-steps", "40", "--resume"]
    _refused_untouched(capsys, finished_run, argv, "were trained with model.")


def test_checkpoints_from_before_the_record_still_resume(finished_run, capsys):
    _edit_state(finished_run, lambda state: {key: value for key, value in state.items() if key != "run"})
    assert _train(finished_run, "--max-steps", "40", "--resume") == 0
    assert json.loads(capsys.readouterr().out)["resumed_from_step"] == 30
