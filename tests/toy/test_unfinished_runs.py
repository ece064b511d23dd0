"""Commands that read a toy run check its status first, in one place (issue 22, item 5):
a diverged, interrupted or tampered run is refused in one line unless --allow-unfinished,
and with it the result and the printed output say so. Also the odd inputs around toy
training (item 10 and the hang): wrong-shaped weights in `toy probe`, a model too large
for memory, a sweep list with an empty item, wrongly typed configs in the Python API."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from sinkscope.cli import main
from sinkscope.infra.errors import InputError
from sinkscope.toy.run_dir import CONFIG_FILE, FINAL_WEIGHTS, RESULT_FILE

_spec = importlib.util.spec_from_file_location("faults", Path(__file__).parents[1] / "cli" / "test_faults.py")
assert _spec is not None and _spec.loader is not None
faults = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(faults)
snapshot, one_line_exit_2 = faults.snapshot, faults.one_line_exit_2


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """A diverged run (lr 1e30) and an interrupted one (no result.json) beside a finished one."""
    root = tmp_path_factory.mktemp("unfinished")
    assert main(["toy", "train", "--no-progress", "--json", "--out", str(root / "div"), "--lr", "1e30"]) == 1
    argv = ["toy", "train", "--no-progress", "--json", "--max-steps", "4", "--checkpoint-every", "2"]
    assert main([*argv, "--out", str(root / "done")]) == 0
    assert main([*argv, "--out", str(root / "cut")]) == 0
    (root / "cut" / RESULT_FILE).unlink()
    (root / "cut" / FINAL_WEIGHTS).unlink()
    return root


def _run_copy(runs: Path, tmp_path: Path, name: str) -> Path:
    import shutil

    return Path(shutil.copytree(runs / name, tmp_path / name))


@pytest.mark.parametrize("name, why", [("div", "diverged at step"), ("cut", "has not finished training")])
def test_tradeoff_refuses_an_unfinished_run_unless_allowed(runs, tmp_path, capsys, name, why):
    run = _run_copy(runs, tmp_path, name)
    before = snapshot(tmp_path)
    argv = ["toy", "tradeoff", "--run", str(run), "--out", str(tmp_path / "t")]
    one_line_exit_2(capsys, argv, "--allow-unfinished")
    assert snapshot(tmp_path) == before
    assert main([*argv, "--allow-unfinished"]) == 0
    out = capsys.readouterr().out
    assert "note:" in out and why in out
    notes = json.loads((tmp_path / "t" / "tradeoff.json").read_text())["notes"]
    assert len(notes) == 1 and why in notes[0] and "allow_unfinished" in notes[0]
    assert main(["report", str(tmp_path / "t")]) == 0
    assert why in (tmp_path / "t" / "report.md").read_text()


@pytest.mark.parametrize(
    "content, why",
    [("[]", "does not say how the run ended"), ("{}", "does not say how"), (None, "'Diverged'")],
    ids=["list", "empty-object", "status-Diverged"],
)
def test_probe_refuses_a_tampered_result_unless_allowed(runs, tmp_path, capsys, content, why):
    run = _run_copy(runs, tmp_path, "done")
    result = json.loads((run / RESULT_FILE).read_text())
    (run / RESULT_FILE).write_text(content if content is not None else json.dumps({**result, "status": "Diverged"}))
    before = snapshot(tmp_path)
    one_line_exit_2(capsys, ["toy", "probe", str(run), "--sequences", "8"], "--allow-unfinished")
    assert snapshot(tmp_path) == before
    assert main(["toy", "probe", str(run), "--sequences", "8", "--allow-unfinished"]) == 0
    assert why in capsys.readouterr().out
    notes = json.loads((run / "probe" / "probe.json").read_text())["notes"]
    assert any(why in note and "allow_unfinished" in note for note in notes)


def test_patch_says_how_positions_are_counted(runs, tmp_path, capsys):
    run = _run_copy(runs, tmp_path, "done")
    assert main(["toy", "patch", str(run), "--inputs", "8"]) == 0
    out = capsys.readouterr().out
    assert "the trigger is at position 8; positions counted from 1, BOS at 1" in out


def test_probe_of_weights_of_the_wrong_shape_is_one_line(runs, tmp_path, capsys):
    from sinkscope.toy.checkpoint import load_tensors, save_tensors

    run = _run_copy(runs, tmp_path, "done")
    weights = load_tensors(run / FINAL_WEIGHTS)
    save_tensors(run / FINAL_WEIGHTS, {name: tensor[..., :3] for name, tensor in weights.items()})
    # as a run from before result.json recorded the weights' hash (with it, the swap is named first)
    result = json.loads((run / RESULT_FILE).read_text())
    (run / RESULT_FILE).write_text(json.dumps({**result, "weights_sha256": None}))
    before = snapshot(tmp_path)
    one_line_exit_2(capsys, ["toy", "probe", str(run), "--sequences", "8"], "do not fit the architecture")
    assert snapshot(tmp_path) == before


def test_a_model_too_large_for_memory_is_refused_before_allocating(tmp_path, capsys):
    argv = ["toy", "train", "--layers", "100000", "--heads", "100000", "--out", str(tmp_path / "huge")]
    one_line_exit_2(capsys, argv, "lower n_layers (and n_heads) (--layers)")
    assert list(tmp_path.iterdir()) == []


def test_a_run_that_fails_at_step_0_leaves_no_half_made_directory(tmp_path, capsys, monkeypatch):
    from sinkscope.toy import seed_stack

    def fail(*args, **kwargs):
        raise RuntimeError("out of memory at the first batch")

    monkeypatch.setattr(seed_stack, "sample_batch", fail)
    assert main(["toy", "train", "--no-progress", "--max-steps", "3", "--out", str(tmp_path / "run")]) != 0
    assert "out of memory at the first batch" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_an_existing_run_is_not_resumed_without_resume(runs, tmp_path, capsys):
    run = _run_copy(runs, tmp_path, "done")
    before = snapshot(tmp_path)
    one_line_exit_2(capsys, ["toy", "train", "--no-progress", "--max-steps", "6", "--out", str(run)], "--resume")
    assert snapshot(tmp_path) == before and (run / CONFIG_FILE).is_file()


@pytest.mark.parametrize("value", ["8,", ",8", "8,,16"])
def test_a_sweep_list_with_an_empty_item_is_one_line(tmp_path, capsys, value):
    one_line_exit_2(capsys, ["toy", "sweep", "--seq-len", value, "--out", str(tmp_path / "s")], "empty item")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "build, field",
    [
        (lambda: __import__("sinkscope.toy.model", fromlist=["x"]).ToyModelConfig(n_heads="2"), "n_heads"),
        (lambda: __import__("sinkscope.toy.model", fromlist=["x"]).ToyModelConfig(layer_norm="yes"), "layer_norm"),
        (lambda: __import__("sinkscope.toy.run_dir", fromlist=["x"]).TrainConfig(seed=1.5), "seed"),
        (lambda: __import__("sinkscope.toy.task", fromlist=["x"]).TaskConfig(seq_len=None), "seq_len"),
    ],
    ids=["n_heads-str", "layer_norm-str", "seed-float", "seq_len-None"],
)
def test_wrongly_typed_config_fields_are_input_errors_naming_the_field(build, field):
    with pytest.raises(InputError, match=field) as caught:
        build()
    assert caught.value.field == field


def test_train_given_a_dict_for_its_config_names_the_argument(tmp_path):
    from sinkscope.toy.train import train

    with pytest.raises(InputError, match="config must be a RunConfig") as caught:
        train({"model": {}}, tmp_path / "run", progress=False)  # type: ignore[arg-type]
    assert caught.value.field == "config" and not (tmp_path / "run").exists()


def test_the_circuit_battery_refuses_an_unfinished_run_naming_its_flag(runs, tmp_path, capsys):
    run = _run_copy(runs, tmp_path, "cut")
    argv = ["circuit", str(run), "--out", str(tmp_path / "c"), "--no-progress"]
    one_line_exit_2(capsys, argv, "--allow-unfinished")
    assert main([*argv, "--allow-unfinished"]) == 2  # taken, then refused: 4 steps made no sink head
    assert "has no sink head" in capsys.readouterr().err and not (tmp_path / "c").exists()
