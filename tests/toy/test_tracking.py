"""Run tracking: ``on_log(step, record)``, and training runs, reproductions and sweeps
logged to TensorBoard and to Weights & Biases (offline, read back from its own files).

wandb and tensorboard are optional (the ``tracking`` extra): a test that needs one skips
without it (the ``needs_tensorboard`` and ``offline_wandb`` fixtures), and nothing here
imports them at module level, so collecting tests/ (``pytest -m cuda`` on an image
without them) never fails on this file."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from sinkscope.cli import main
from sinkscope.infra.codec import encode
from sinkscope.infra.errors import InputError
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.run_dir import RunConfig, TrainConfig, read_metrics
from sinkscope.toy.sweep import SweepConfig, sweep
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.tracking import TrackingConfig, scalars
from sinkscope.toy.train import TrainingDiverged, train, train_seeds

if TYPE_CHECKING:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from wandb_offline import OfflineRun


def _config(seed: int = 0, **train_kwargs) -> RunConfig:
    # max_steps not a multiple of log_every: the last line is the run's last step, logged too
    settings = dict(seed=seed, max_steps=23, log_every=10, checkpoint_every=10, stop_linf=1e-12)
    settings.update(train_kwargs)
    return RunConfig(ToyModelConfig(), TaskConfig(), TrainConfig(**settings))


def test_on_log_gets_every_metrics_line_of_every_stacked_run_with_its_run_directory(tmp_path):
    runs = [tmp_path / "seed0", tmp_path / "seed1"]
    seen: list[tuple[int, dict]] = []
    train_seeds([_config(0), _config(1)], runs, progress=False, on_log=lambda step, record: seen.append((step, record)))
    for run in runs:
        mine = [(step, record) for step, record in seen if record["run"] == str(run)]
        lines = read_metrics(run)
        assert [step for step, _ in mine] == [line["step"] for line in lines] == [0, 10, 20, 23]
        assert [{k: v for k, v in record.items() if k != "run"} for _, record in mine] == lines
    assert len(seen) == 8 and {record["run"] for _, record in seen} == {str(Path(run)) for run in runs}


@pytest.fixture()
def needs_tensorboard() -> None:
    pytest.importorskip("tensorboard")


def _tensorboard(log_dir: Path) -> EventAccumulator:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def _assert_scalars_are_the_metrics(log_dir: Path, run_dir: Path) -> EventAccumulator:
    """Every scalar of every metrics.jsonl line, at its step, in the run's event files
    (TensorBoard stores float32)."""
    events = _tensorboard(log_dir)
    lines = read_metrics(run_dir)
    assert lines, run_dir
    expected = {tag: [(line["step"], scalars(line)[tag]) for line in lines] for tag in scalars(lines[0])}
    assert {"loss", "linf_error", "anchor_mass_default/L0H0", "anchor_mass_trigger/L0H0"} <= set(expected)
    assert set(expected) <= set(events.Tags()["scalars"])
    for tag, values in expected.items():
        got = [(event.step, event.value) for event in events.Scalars(tag)]
        assert got == [(step, float(np.float32(value))) for step, value in values], tag
    return events


def _text(events: EventAccumulator, tag: str) -> str:
    return events.Tensors(f"{tag}/text_summary")[-1].tensor_proto.string_val[0].decode()


def offline_runs(where: Path) -> dict[str, OfflineRun]:
    from wandb_offline import offline_runs as read  # imports wandb: only under the offline_wandb fixture

    return read(where)


@pytest.fixture()
def offline_wandb(tmp_path, monkeypatch) -> Iterator[Path]:
    """W&B offline, its files under tmp_path/wandb-files (the variables reach spawned workers too)."""
    wandb = pytest.importorskip("wandb")
    where = tmp_path / "wandb-files"
    where.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(where))
    monkeypatch.setenv("WANDB_SILENT", "true")
    yield where
    # wandb reads its variables once per process (its setup singleton): the next test's
    # WANDB_DIR would be ignored without starting over
    wandb.teardown()


def test_tensorboard_gets_each_stacked_run_in_its_own_directory(tmp_path, needs_tensorboard):
    runs = [tmp_path / "seed0", tmp_path / "seed1"]
    configs = [_config(0, max_steps=23), _config(1, max_steps=23)]
    results = train_seeds(configs, runs, progress=False, tracking=TrackingConfig(tensorboard_dir=tmp_path / "tb"))
    assert sorted(path.name for path in (tmp_path / "tb").iterdir()) == ["seed0", "seed1"]
    for run, config, result in zip(runs, configs, results):
        events = _assert_scalars_are_the_metrics(tmp_path / "tb" / run.name, run)
        assert [(e.step, e.value) for e in events.Scalars("result/steps")] == [(23, 23.0)]
        assert events.Scalars("result/linf_error")[0].value == pytest.approx(result.linf_error, rel=1e-6)
        assert _text(events, "result/status") == "max_steps"
        shown = _text(events, "config")
        assert json.loads(shown.removeprefix("```json\n").removesuffix("\n```")) == encode(config)


def test_wandb_offline_run_holds_the_config_every_metrics_line_and_the_result(tmp_path, offline_wandb):
    config = _config(0)
    result = train(config, tmp_path / "run", progress=False, tracking=TrackingConfig(wandb_project="sinks-test"))
    (run,) = offline_runs(offline_wandb).values()
    assert (run.project, run.name, run.group, run.exit_code) == ("sinks-test", "run", "", 0)
    assert {key: run.config[key] for key in ("model", "task", "train")} == {
        key: value for key, value in encode(config).items() if key != "versions"
    }
    lines = read_metrics(tmp_path / "run")
    assert [row["_step"] for row in run.history] == [line["step"] for line in lines] == [0, 10, 20, 23]
    for row, line in zip(run.history, lines):
        assert {key: row[key] for key in scalars(line)} == scalars(line)  # JSON both ways: exact
    assert run.summary["result/status"] == "max_steps" and run.summary["result/steps"] == 23
    assert run.summary["result/linf_error"] == result.linf_error and run.summary["loss"] == lines[-1]["loss"]


def test_a_run_resumes_with_tracking_turned_on(tmp_path, needs_tensorboard):
    """Tracking is no part of the run's identity: the resumed part is logged, from where it resumed."""
    train(_config(0, max_steps=10), tmp_path / "run", progress=False)
    train(
        _config(0, max_steps=23),
        tmp_path / "run",
        progress=False,
        tracking=TrackingConfig(tensorboard_dir=tmp_path / "tb"),
    )
    events = _tensorboard(tmp_path / "tb" / "run")
    # the step-10 checkpoint holds the state before step 10's batch: step 10 is trained again
    assert [e.step for e in events.Scalars("loss")] == [10, 20, 23]
    assert [line["step"] for line in read_metrics(tmp_path / "run")] == [0, 10, 20, 23]


def test_a_diverged_run_is_tracked_as_failed_with_its_status(tmp_path, offline_wandb, needs_tensorboard):
    tracking = TrackingConfig(wandb_project="sinks-test", tensorboard_dir=tmp_path / "tb")
    with pytest.raises(TrainingDiverged):
        train(_config(0, lr=1e20), tmp_path / "run", progress=False, tracking=tracking)
    (run,) = offline_runs(offline_wandb).values()
    assert run.exit_code == 1 and run.summary["result/status"] == "diverged"
    assert run.summary["result/loss"] is None  # NaN: W&B writes JSON null, as result.json does
    events = _tensorboard(tmp_path / "tb" / "run")
    assert _text(events, "result/status") == "diverged" and math.isnan(events.Scalars("result/loss")[0].value)


def test_toy_train_logs_to_tensorboard_from_the_command_line(tmp_path, capsys, needs_tensorboard):
    run, tb = tmp_path / "run", tmp_path / "tb"
    argv = ["toy", "train", "--out", str(run), "--max-steps", "30", "--tensorboard", str(tb), "--json", "--no-progress"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "max_steps"  # stdout holds only the result
    events = _assert_scalars_are_the_metrics(tb / "run", run)
    assert [e.step for e in events.Scalars("loss")] == [0, 30]


def test_a_sweep_on_two_worker_processes_tracks_one_run_per_model(tmp_path, offline_wandb, needs_tensorboard):
    """Each unit opens its models' trackers in its own spawned process."""
    out, tb = tmp_path / "grid", tmp_path / "tb"
    config = SweepConfig(
        seq_lens=(6,), d_models=(6,), attentions=("softmax", "relu"), seeds=1, max_steps=25, n_sequences=16, workers=2
    )
    tracking = TrackingConfig(wandb_project="sinks-test", tensorboard_dir=tb)
    result = sweep(config, out, progress=False, tracking=tracking)
    names = sorted(m.name for m in result.models)
    assert len(names) == 2
    assert sorted(path.name for path in (tb / "grid").iterdir()) == names  # group = the sweep's directory name
    wandb_runs = offline_runs(offline_wandb)
    assert sorted(wandb_runs) == names
    for model in result.models:
        events = _assert_scalars_are_the_metrics(tb / "grid" / model.name, out / model.name)
        assert events.Scalars("eval/anchor_mass/L0H0")[0].value == pytest.approx(model.heads[0].anchor_mass)
        run = wandb_runs[model.name]
        assert run.group == "grid" and run.exit_code == 0
        assert run.summary["eval/anchor_mass/L0H0"] == model.heads[0].anchor_mass
        assert run.summary["eval/heldout_mse"] == model.heldout_mse and run.summary["result/steps"] == model.steps
    # finished models are read back, not retrained: nothing new is tracked
    sweep(config, out, progress=False, tracking=tracking)
    assert len(offline_runs(offline_wandb)) == 2


@pytest.mark.parametrize(
    ("package", "flag"), [("wandb", ["--wandb", "sinks"]), ("tensorboard", ["--tensorboard", "tb"])]
)
@pytest.mark.parametrize("command", [["toy", "train"], ["toy", "reproduce", "--quick"], ["toy", "sweep"]])
def test_a_missing_tracking_package_is_one_line_before_any_work(tmp_path, monkeypatch, capsys, package, flag, command):
    monkeypatch.setitem(sys.modules, package, None)  # import wandb / import tensorboard now fails
    monkeypatch.chdir(tmp_path)
    assert main([*command, "--out", "out", *flag, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'sinkscope[tracking]'" in err and flag[0] in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_tracking_settings_are_checked():
    with pytest.raises(InputError, match="wandb_project or a tensorboard_dir"):
        TrackingConfig()
    with pytest.raises(InputError, match="project name"):
        TrackingConfig(wandb_project="team/project")
    with pytest.raises(InputError, match="tensorboard_dir"):
        TrackingConfig(tensorboard_dir=" ")


@pytest.mark.parametrize("command", [["toy", "train"], ["toy", "sweep"]])
def test_a_tensorboard_dir_that_is_a_file_is_one_line_before_any_work(
    tmp_path, monkeypatch, capsys, command, needs_tensorboard
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tb").write_text("not a directory")
    assert main([*command, "--out", "out", "--tensorboard", "tb", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a file" in err and "(--tensorboard)" in err, err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tb"]  # nothing written
