"""Resume decides everything before it touches anything (issue 22, items 1, 7, 9, 10): a
refused resume leaves the run directory byte for byte as it was, a finished run keeps its
final weights and result until the continued run replaces them, and every field that
changes the numbers must match the checkpoint's own record. Runs are one attempt or say
so (issue 34, item 3): a resume that cannot continue names --overwrite, which replaces
the run whole, and a run whose config.json was lost resumes from its checkpoints' record."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sinkscope.cli import main
from sinkscope.toy.run_dir import CONFIG_FILE, FINAL_WEIGHTS, RESULT_FILE, checkpoint_dirs, read_config

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
    assert _train(run, "--resume") == 2
    assert "retrain the run with them (--overwrite)" in capsys.readouterr().err  # the restart is named too


def test_a_run_record_edited_into_nonsense_is_refused_naming_the_settings(finished_run, capsys):
    _edit_state(
        finished_run, lambda state: {**state, "run": {"model": "x", "task": [], "train": state["run"]["train"]}}
    )
    argv = [*TRAIN, "--out", str(finished_run), "--max-steps", "40", "--resume"]
    _refused_untouched(capsys, finished_run, argv, "were trained with model.")


def test_checkpoints_from_before_the_record_still_resume(finished_run, capsys):
    # written before the run record and the tensor files' hashes existed: resumed unchecked
    old_keys = ("run", "weights_sha256", "optimizer_sha256")
    _edit_state(finished_run, lambda state: {key: value for key, value in state.items() if key not in old_keys})
    assert _train(finished_run, "--max-steps", "40", "--resume") == 0
    assert json.loads(capsys.readouterr().out)["resumed_from_step"] == 30


# Runs are one attempt or say so (issue 34, item 3): a resume that cannot continue is refused
# naming --overwrite; --overwrite replaces the run whole, through the directory swap.


def _interrupt_after(monkeypatch, steps: int) -> None:
    """The training of this process stops with KeyboardInterrupt when step ``steps`` draws its batch."""
    from sinkscope.toy import seed_stack

    real, drawn = seed_stack.sample_batch, []

    def sample_batch(*args, **kwargs):
        drawn.append(1)
        if len(drawn) > steps:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(seed_stack, "sample_batch", sample_batch)


@pytest.mark.parametrize("lost", ["deleted", "emptied"])
def test_a_resume_with_no_checkpoint_beside_an_earlier_attempt_is_refused_naming_overwrite(finished_run, capsys, lost):
    shutil.rmtree(finished_run / "checkpoints")
    if lost == "emptied":
        (finished_run / "checkpoints").mkdir()
    argv = [*TRAIN, "--out", str(finished_run), "--max-steps", "40", "--resume"]  # was: retrained from step 0
    _refused_untouched(capsys, finished_run, argv, "no checkpoint to continue from")
    assert main(argv) == 2 and capsys.readouterr().err.strip().endswith("(--overwrite)")


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.safetensors"])
def test_a_checkpoint_file_that_is_not_the_one_its_state_hashed_is_refused(finished_run, capsys, name):
    older, newest = checkpoint_dirs(finished_run)
    shutil.copyfile(older / name, newest / name)  # readable, of the right shapes: only the hash tells
    argv = [*TRAIN, "--out", str(finished_run), "--max-steps", "40", "--resume"]
    _refused_untouched(capsys, finished_run, argv, "its hash differs")
    assert main(argv) == 2 and capsys.readouterr().err.strip().endswith("(--overwrite)")


def _files(run: Path) -> dict[str, bytes]:
    """Every file of a run but its state.json files (they hold wall-clock times)."""
    return {
        str(path.relative_to(run)): path.read_bytes()
        for path in sorted(run.rglob("*"))
        if path.is_file() and path.name != "state.json"
    }


def test_overwrite_replaces_the_run_whole_with_what_a_fresh_run_writes(finished_run, tmp_path, capsys):
    flags = ["--seed", "2", "--max-steps", "20", "--checkpoint-every", "10"]
    assert _train(tmp_path / "fresh", *flags) == 0
    capsys.readouterr()
    assert _train(finished_run, *flags, "--overwrite") == 0
    new = json.loads(capsys.readouterr().out)
    assert new["run_dir"] == str(finished_run) and new["resumed_from_step"] is None
    fresh = {name: data for name, data in _files(tmp_path / "fresh").items() if name != RESULT_FILE}
    assert {name: data for name, data in _files(finished_run).items() if name != RESULT_FILE} == fresh
    assert sorted(p.name for p in finished_run.parent.iterdir()) == ["run"]  # no build directory or journal left


def test_an_interrupted_overwrite_leaves_the_old_run_as_it_was(finished_run, capsys, monkeypatch):
    before = snapshot(finished_run)
    _interrupt_after(monkeypatch, 15)
    assert _train(finished_run, "--seed", "2", "--max-steps", "40", "--checkpoint-every", "10", "--overwrite") == 1
    assert "discarded its new attempt" in capsys.readouterr().err
    assert snapshot(finished_run) == before
    assert sorted(p.name for p in finished_run.parent.iterdir()) == ["run"]


def test_an_overwrite_killed_midway_leaves_the_old_run_whole_for_probe(finished_run, capsys):
    """A real ``toy train --overwrite`` SIGKILLed once its new attempt has a checkpoint: the
    old run is byte for byte as it was, so probe analyses it alone (before: the new config
    and metrics beside the old result and weights, probed as one run); the next training
    command on it removes the dead attempt."""
    before = snapshot(finished_run)
    argv = [*TRAIN, "--out", str(finished_run), "--overwrite", "--seed", "1", "--lr", "1e-9", "--max-steps", "900000"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, sys.path))}  # the code this test imports
    writer = subprocess.Popen([sys.executable, "-P", "-m", "sinkscope", *argv], env=env, stdout=subprocess.DEVNULL)
    pattern = f".{finished_run.name}.*.tmp/checkpoints/step-*"
    try:
        deadline = time.monotonic() + 300
        while not list(finished_run.parent.glob(pattern)) and writer.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert writer.poll() is None and list(finished_run.parent.glob(pattern)), "the new attempt never checkpointed"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(60)
    assert snapshot(finished_run) == before
    assert main(["toy", "probe", str(finished_run), "--sequences", "8", "--json"]) == 0
    assert "allow_unfinished" not in capsys.readouterr().out  # a finished run: no note that it is not
    assert _train(finished_run, "--resume") == 0  # finished: its stored result, and the leftovers go
    assert sorted(p.name for p in finished_run.parent.iterdir()) == ["run"]


# a real `toy train --overwrite` SIGKILLed between the two renames of the swap (as on a
# filesystem without RENAME_EXCHANGE): nothing at --out, the old run aside
KILLED_BETWEEN_RENAMES = """
import os, signal, sys
from sinkscope.cli import main
from sinkscope.infra import swap

real_rename = os.rename

def rename(source, target):
    real_rename(source, target)
    if str(target).endswith(".old"):
        os.kill(os.getpid(), signal.SIGKILL)

swap.exchange = lambda first, second: False
os.rename = rename
main(sys.argv[1:])
"""


def test_the_next_training_command_restores_a_run_whose_overwrite_was_killed_mid_swap(finished_run, capsys):
    before = snapshot(finished_run)
    argv = [*TRAIN, "--out", str(finished_run), "--overwrite", "--seed", "1", "--max-steps", "5"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, sys.path))}
    done = subprocess.run([sys.executable, "-P", "-c", KILLED_BETWEEN_RENAMES, *argv], env=env, timeout=300)
    assert done.returncode == -signal.SIGKILL and not finished_run.exists()
    assert _train(finished_run, "--resume") == 0  # its lock must not make an empty run where the old one goes
    assert snapshot(finished_run) == before
    assert sorted(p.name for p in finished_run.parent.iterdir()) == ["run"]


def test_overwrite_refuses_a_directory_that_is_not_a_toy_run(tmp_path, capsys):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("not a run")
    before = snapshot(notes)
    one_line_exit_2(capsys, [*TRAIN, "--out", str(notes), "--overwrite"], "not a toy run")
    assert snapshot(notes) == before


def test_resume_and_overwrite_together_are_one_line(finished_run, capsys):
    _refused_untouched(capsys, finished_run, [*TRAIN, "--out", str(finished_run), "--resume", "--overwrite"], "one of")


def test_an_interrupted_run_without_config_json_resumes_from_its_checkpoints_record(tmp_path, capsys, monkeypatch):
    flags = ["--max-steps", "40", "--checkpoint-every", "10"]
    assert _train(tmp_path / "whole", *flags) == 0
    run = tmp_path / "run"
    _interrupt_after(monkeypatch, 25)
    assert _train(run, *flags) == 1
    monkeypatch.undo()
    (run / CONFIG_FILE).unlink()
    capsys.readouterr()
    assert _train(run, "--resume") == 0  # was: "not a toy run directory"
    assert json.loads(capsys.readouterr().out)["resumed_from_step"] == 20
    assert (run / FINAL_WEIGHTS).read_bytes() == (tmp_path / "whole" / FINAL_WEIGHTS).read_bytes()
    assert read_config(run) == read_config(tmp_path / "whole")  # written back from the record


def test_a_lost_config_json_beside_checkpoints_that_record_nothing_is_refused(finished_run, capsys):
    for name in (CONFIG_FILE, RESULT_FILE, FINAL_WEIGHTS):
        (finished_run / name).unlink()
    _edit_state(finished_run, lambda state: {key: value for key, value in state.items() if key != "run"})
    before = snapshot(finished_run)
    one_line_exit_2(capsys, [*TRAIN, "--out", str(finished_run), "--resume"], "restore its config.json")
    assert snapshot(finished_run) == before
    assert main([*TRAIN, "--out", str(finished_run), "--resume"]) == 2
    assert capsys.readouterr().err.strip().endswith("(--overwrite)")
