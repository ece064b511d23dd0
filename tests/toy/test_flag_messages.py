"""Messages that name the setting at fault and its fix (issue 22, hostile and new-user
passes): a huge or damaged metrics.jsonl on resume, the default lr repeated on resume, the
memory refusal's culprit, duplicate sweep values, seeds beyond torch's range, wrong API
argument types, unknown attention kinds, the trade-off's one-layer rule, a reproduction
with other settings, and the line that says what a re-run resumes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import sinkscope
from fault_checks import one_line_exit_2, snapshot
from sinkscope.cli import main
from sinkscope.infra.codec import write_result
from sinkscope.infra.errors import InputError
from sinkscope.toy.run_dir import CHECKPOINTS, METRICS_FILE, checkpoint_dirs

TRAIN = ["toy", "train", "--no-progress", "--json"]
SWEEP = ["toy", "sweep", "--d-model", "8", "--seeds", "1", "--max-steps", "5", "--workers", "1", "--sequences", "8"]


@pytest.fixture
def finished_run(tmp_path, capsys) -> Path:
    """A run trained with the default lr to max_steps 30, checkpoints at 20 and 30."""
    run = tmp_path / "run"
    assert main([*TRAIN, "--out", str(run), "--max-steps", "30", "--checkpoint-every", "10"]) == 0
    capsys.readouterr()
    return run


def _resume(run: Path, *flags: str) -> list[str]:
    return [*TRAIN, "--out", str(run), "--max-steps", "40", "--checkpoint-every", "10", "--resume", *flags]


def test_a_50_gb_sparse_tail_on_metrics_jsonl_resumes_reading_only_what_it_keeps(finished_run, capsys):
    metrics = finished_run / METRICS_FILE
    logged = metrics.read_text().splitlines()
    os.truncate(metrics, 50 * 2**30)  # sparse: no disk used; the old resume read it whole (MemoryError)
    assert main(_resume(finished_run)) == 0
    assert capsys.readouterr().err == ""
    lines = metrics.read_text().splitlines()  # trimmed to the checkpoint's step, then trained on
    assert lines[: len(logged) - 1] == logged[:-1] and metrics.stat().st_size < 2**20


def test_a_metrics_jsonl_of_nul_bytes_is_one_line_naming_the_file_and_changes_nothing(finished_run, capsys):
    metrics = finished_run / METRICS_FILE
    metrics.unlink()
    with open(metrics, "wb") as handle:
        handle.truncate(50 * 2**30)  # one 50 GB "line" of NUL bytes
    before = snapshot(finished_run / CHECKPOINTS)
    one_line_exit_2(capsys, _resume(finished_run), "metrics.jsonl has a line longer than 1 MB")
    assert snapshot(finished_run / CHECKPOINTS) == before and metrics.stat().st_size == 50 * 2**30


def test_the_default_lr_repeated_on_resume_is_the_same_run(finished_run, capsys):
    assert main(_resume(finished_run, "--lr", "1e-3")) == 0, capsys.readouterr().err
    assert [p.name for p in checkpoint_dirs(finished_run)][-1] == "step-00000040"


def test_a_huge_seq_len_is_blamed_on_seq_len(tmp_path, capsys):
    argv = [*TRAIN, "--seq-len", "1000000000", "--max-steps", "5", "--out", str(tmp_path / "x")]
    one_line_exit_2(capsys, argv, "; lower seq_len (--seq-len)")
    assert list(tmp_path.iterdir()) == []


def test_a_huge_d_model_is_blamed_on_d_model(tmp_path, capsys):
    argv = [*TRAIN, "--d-model", "1000000", "--max-steps", "5", "--out", str(tmp_path / "x")]
    one_line_exit_2(capsys, argv, "; lower d_model (--d-model)")


@pytest.mark.parametrize(
    "flag, values, shown", [("--seq-len", "8,8", "8"), ("--attention", "relu,softmax,relu", "'relu'")]
)
def test_a_value_listed_twice_in_a_sweep_is_refused_before_anything_is_written(tmp_path, capsys, flag, values, shown):
    argv = [*SWEEP, flag, values, "--out", str(tmp_path / "s"), "--no-progress"]
    one_line_exit_2(capsys, argv, f"lists {shown} twice; list each value once ({flag})")
    assert list(tmp_path.iterdir()) == []


def test_the_sweep_config_refuses_duplicates_from_python_too():
    with pytest.raises(InputError, match="d_models lists 16 twice") as error:
        sinkscope.SweepConfig(d_models=(16, 8, 16))
    assert error.value.field == "d_models"


def test_a_seed_beyond_torchs_range_is_one_line(tmp_path, capsys):
    argv = [*TRAIN, "--seed", str(2**70), "--max-steps", "5", "--out", str(tmp_path / "x")]
    one_line_exit_2(capsys, argv, "--seed: must be an integer in [0, 2**63 - 1], got 1180591620717411303424")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: sinkscope.TrainConfig(seed=2**70), "seed"),
        (lambda: sinkscope.TrainConfig(seed=-1), "seed"),
        (lambda: sinkscope.ReproduceConfig(first_seed=2**63 - 1, seeds=2), "first_seed"),
        (lambda: sinkscope.PromptSpec(seed=2**64), "seed"),
        (lambda: sinkscope.mask_random_key([(0, 0)], seed=2**64), "seed"),
    ],
)
def test_seeds_out_of_range_are_refused_where_they_are_set(make, field):
    with pytest.raises(InputError) as error:
        make()
    assert error.value.field == field and "2**63 - 1" in str(error.value)


@pytest.mark.parametrize(
    "call, argument",
    [
        (lambda: sinkscope.evaluate_run(None), "run_dir"),
        (lambda: sinkscope.evaluate_run("run", n_sequences="8"), "n_sequences"),
        (lambda: sinkscope.train(sinkscope.RunConfig, "out"), "config"),
        (lambda: sinkscope.train(None, "out"), "config"),
        (lambda: sinkscope.train_seeds([], None), "run_dirs"),
        (lambda: sinkscope.reproduce(sinkscope.ReproduceConfig(), None), "out_dir"),
        (lambda: sinkscope.reproduce({"seeds": 1}, "out"), "config"),
        (lambda: sinkscope.sweep(sinkscope.SweepConfig(), 5), "out_dir"),
        (lambda: sinkscope.sweep(None, "out"), "config"),
    ],
)
def test_toy_entry_points_name_the_bad_argument(call, argument, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as error:
        call()
    assert error.value.field == argument and argument in str(error.value), error.value
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "call, argument",
    [
        ("sinkscope.toy.probe_run:probe_run", "run_dir"),
        ("sinkscope.toy.patching:patch_run", "run_dir"),
        ("sinkscope.toy.tradeoff:write_tradeoff", "out_dir"),
    ],
)
def test_toy_command_functions_name_a_missing_path(call, argument):
    import importlib

    module, name = call.split(":")
    with pytest.raises(InputError) as error:
        getattr(importlib.import_module(module), name)(None)
    assert error.value.field == argument


@pytest.mark.parametrize("command", [TRAIN + ["--max-steps", "5"], SWEEP + ["--no-progress"]])
def test_an_unknown_attention_kind_names_the_flag(tmp_path, capsys, command):
    one_line_exit_2(capsys, [*command, "--attention", "foo", "--out", str(tmp_path / "x")], "value_gated (--attention)")
    assert list(tmp_path.iterdir()) == []


def test_the_tradeoff_on_a_2x2_run_says_which_run_to_pass(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*TRAIN, "--layers", "2", "--heads", "2", "--max-steps", "3", "--out", str(run)]) == 0
    capsys.readouterr()
    before = snapshot(tmp_path)
    argv = ["toy", "tradeoff", "--run", str(run), "--out", str(tmp_path / "t"), "--no-progress"]
    one_line_exit_2(capsys, argv, "pass a run trained with n_layers=1, n_heads=1 and no residual")
    assert snapshot(tmp_path) == before


def test_a_reproduction_with_other_settings_names_them(tmp_path, capsys):
    out = tmp_path / "full"
    out.mkdir()
    write_result(out / "reproduce.json", sinkscope.ReproduceConfig())
    before = snapshot(tmp_path)
    argv = ["toy", "reproduce", "--quick", "--out", str(out), "--no-progress"]
    one_line_exit_2(capsys, argv, "(seeds 3 (asked: 1), max_steps 50000 (asked: 8000))")
    assert snapshot(tmp_path) == before


def test_a_rerun_sweep_says_what_it_resumes_on_stderr_only(tmp_path, capsys):
    argv = [*SWEEP, "--seq-len", "8", "--out", str(tmp_path / "s"), "--no-progress", "--json"]
    assert main(argv) == 0
    first = capsys.readouterr()
    assert "resuming" not in first.err
    relu = tmp_path / "s" / "relu-1x1-d8-L8-seed0"
    for name in ("evaluation.json", "result.json", "model.safetensors"):
        (relu / name).unlink()
    assert checkpoint_dirs(relu)
    assert main(argv) == 0
    again = capsys.readouterr()
    assert again.err.splitlines() == [
        f"sinkscope: resuming {tmp_path / 's'}: 1 finished run(s) kept, 1 run(s) continue from their checkpoints, "
        "0 start from step 0"
    ]


def test_a_reproduction_refuses_an_architecture_listed_twice():
    with pytest.raises(InputError, match=r"architectures lists \(1, 1\) twice") as error:
        sinkscope.ReproduceConfig(architectures=((1, 1), (2, 2), (1, 1)))
    assert error.value.field == "architectures"


@pytest.mark.parametrize(
    "build, field",
    [
        (lambda: sinkscope.TrainConfig(beta1=1.0), "beta1"),  # Adam's bias correction divides by 1 - beta1^t
        (lambda: sinkscope.TrainConfig(beta2=float("nan")), "beta2"),
        (lambda: sinkscope.ToyModelConfig(init_std=float("nan")), "init_std"),  # passed, then failed in torch
        (lambda: sinkscope.ToyModelConfig(init_std=float("inf")), "init_std"),
    ],
)
def test_settings_torch_would_reject_are_refused_naming_the_field(build, field):
    with pytest.raises(InputError) as caught:
        build()
    assert caught.value.field == field and field in str(caught.value)
