"""The trainer: run-directory layout, reproducibility, resume, divergence, convergence."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import sinkscope.toy.run_member as run_member
import sinkscope.toy.seed_stack as seed_stack
from sinkscope.infra.codec import encode
from sinkscope.probes.sink_metrics import anchor_mass
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.run_dir import (
    RunConfig,
    TrainConfig,
    checkpoint_dirs,
    load_model,
    read_config,
    read_metrics,
    read_train_result,
)
from sinkscope.toy.run_member import RunDirectoryError
from sinkscope.toy.task import TaskConfig, eval_batch
from sinkscope.toy.train import TrainingDiverged, train


def _config(**train_kwargs) -> RunConfig:
    settings = dict(max_steps=60, log_every=20, checkpoint_every=20)
    settings.update(train_kwargs)
    return RunConfig(ToyModelConfig(), TaskConfig(), TrainConfig(**settings))


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "model.safetensors"))


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.fixture()
def captured_models(monkeypatch):
    """The in-memory models the trainer builds, in order."""
    models = []
    original = run_member.build_member_state

    def build(config, device):
        built = original(config, device)
        models.append(built[0])
        return built

    monkeypatch.setattr(run_member, "build_member_state", build)
    return models


def test_run_directory_layout(tmp_path, captured_models):
    config = _config()
    result = train(config, tmp_path / "run", progress=False)
    run = tmp_path / "run"
    assert result.status == "max_steps" and result.steps == 60 and not result.converged
    assert result.resumed_from_step is None

    stored = json.loads((run / "config.json").read_text())
    assert stored["versions"]["torch"] == torch.__version__
    assert read_config(run) == config

    metrics = read_metrics(run)
    assert [r["step"] for r in metrics] == [0, 20, 40, 60]
    for record in metrics:
        assert record["loss"] > 0 and record["linf_error"] > 0
        # per layer, per head
        assert len(record["anchor_mass_default"]) == 1 and len(record["anchor_mass_default"][0]) == 1
        assert 0.0 <= record["anchor_mass_default"][0][0] <= 1.0
        assert len(record["anchor_mass_trigger"]) == 1 and len(record["anchor_mass_trigger"][0]) == 1
    assert metrics[-1]["loss"] < metrics[0]["loss"]  # it learns something
    assert metrics[-1]["loss"] == pytest.approx(result.loss)

    # keep_checkpoints=2: the two latest survive, no temporary directories remain
    assert [p.name for p in checkpoint_dirs(run)] == ["step-00000040", "step-00000060"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000040", "step-00000060"]
    for checkpoint in checkpoint_dirs(run):
        assert sorted(p.name for p in checkpoint.iterdir()) == [
            "model.safetensors",
            "optimizer.safetensors",
            "state.json",
        ]
    assert not [p for p in run.rglob("*") if p.name.endswith(".tmp")]

    assert encode(read_train_result(run)) == encode(result)
    # the final checkpoint holds the final weights
    _assert_same_weights(_weights(run), load_file(str(checkpoint_dirs(run)[-1] / "model.safetensors")))

    # checkpoint round trip: the loaded model is the trained one
    trained = captured_models[-1]
    loaded = load_model(run)
    batch = eval_batch(config.task, 64, seed=5, target="single")
    with torch.no_grad():
        assert torch.equal(loaded(batch.tokens), trained(batch.tokens))
    _assert_same_weights(loaded.state_dict(), trained.state_dict())


def test_same_seed_same_weights(tmp_path):
    train(_config(), tmp_path / "a", progress=False)
    train(_config(), tmp_path / "b", progress=False)
    train(_config(seed=1), tmp_path / "c", progress=False)
    _assert_same_weights(_weights(tmp_path / "a"), _weights(tmp_path / "b"))
    assert read_metrics(tmp_path / "a") == read_metrics(tmp_path / "b")
    assert not torch.equal(_weights(tmp_path / "a")["blocks.0.attn.W_Q"], _weights(tmp_path / "c")["blocks.0.attn.W_Q"])


def test_extending_max_steps_equals_one_long_run(tmp_path):
    full = train(_config(max_steps=60), tmp_path / "full", progress=False)
    short = train(_config(max_steps=40), tmp_path / "split", progress=False)
    assert short.steps == 40 and short.status == "max_steps"
    resumed = train(_config(max_steps=60), tmp_path / "split", progress=False)
    assert resumed.resumed_from_step == 40 and resumed.steps == 60
    _assert_same_weights(_weights(tmp_path / "full"), _weights(tmp_path / "split"))
    assert read_metrics(tmp_path / "split") == read_metrics(tmp_path / "full")
    assert (resumed.loss, resumed.linf_error) == (full.loss, full.linf_error)
    assert read_config(tmp_path / "split").train.max_steps == 60
    # a finished run is not retrained: the stored result comes back
    again = train(_config(max_steps=60), tmp_path / "split", progress=False)
    assert encode(again) == encode(resumed)
    # and a lower max_steps than what was done also returns the stored result
    assert train(_config(max_steps=30), tmp_path / "split", progress=False).steps == 60


def test_interrupted_run_resumes_bitwise(tmp_path, monkeypatch):
    config = _config(log_every=5)
    train(config, tmp_path / "full", progress=False)

    calls = {"n": 0}
    original = seed_stack.sample_batch

    def interrupt_at_step_50(*args, **kwargs):
        if calls["n"] == 50:  # the batch of step 50: after checkpoint 40, before 60
            raise KeyboardInterrupt
        calls["n"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(seed_stack, "sample_batch", interrupt_at_step_50)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train(config, run, progress=False)
    monkeypatch.setattr(seed_stack, "sample_batch", original)

    assert not (run / "result.json").exists() and not (run / "model.safetensors").exists()
    assert [p.name for p in checkpoint_dirs(run)] == ["step-00000020", "step-00000040"]
    assert [r["step"] for r in read_metrics(run)] == list(range(0, 50, 5))
    assert load_model(run) is not None  # the latest checkpoint loads

    result = train(config, run, progress=False)
    assert result.resumed_from_step == 40 and result.steps == 60
    _assert_same_weights(_weights(tmp_path / "full"), _weights(run))
    # steps 40 and 45 were redone; each step is logged exactly once, as in the full run
    assert read_metrics(run) == read_metrics(tmp_path / "full")


def test_other_config_changes_are_refused(tmp_path):
    train(_config(max_steps=5), tmp_path / "run", progress=False)
    with pytest.raises(RunDirectoryError, match=r"train\.lr.*only train\.max_steps may change"):
        train(_config(max_steps=5, lr=3e-3), tmp_path / "run", progress=False)
    other_model = replace(_config(max_steps=5), model=ToyModelConfig(attention="relu"))
    with pytest.raises(RunDirectoryError, match=r"model\.attention"):
        train(other_model, tmp_path / "run", progress=False)
    with pytest.raises(RunDirectoryError, match="resume=True"):
        train(_config(max_steps=5), tmp_path / "run", resume=False, progress=False)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("x")
    with pytest.raises(RunDirectoryError, match="not a toy run directory"):
        train(_config(max_steps=5), tmp_path / "junk", progress=False)


@pytest.mark.parametrize("lr", [1e10, 1e20])  # loss becomes inf, then nan
def test_divergence_stops_with_a_good_checkpoint(tmp_path, lr):
    run = tmp_path / "run"
    # checkpoint_every=1: the state right after the bad update must not be kept as "good"
    with pytest.raises(TrainingDiverged) as error:
        train(_config(lr=lr, checkpoint_every=1), run, progress=False)
    message = str(error.value)
    assert "step-00000000" in message and "lower the learning rate" in message and error.value.field == "lr"
    assert [p.name for p in checkpoint_dirs(run)] == ["step-00000000"]
    result = read_train_result(run)
    assert result.status == "diverged" and not result.converged

    def refuse(constant: str) -> None:
        raise AssertionError(f"result.json holds a bare {constant}, which is not JSON")

    stored = json.loads((run / "result.json").read_text(), parse_constant=refuse)
    assert stored["loss"] is None and math.isnan(result.loss)
    assert not (run / "model.safetensors").exists()
    model = load_model(run)  # the last good checkpoint still loads, and is finite
    batch = eval_batch(TaskConfig(), 8, seed=0, target="single")
    with torch.no_grad():
        assert torch.isfinite(model(batch.tokens)).all()
    assert all(torch.isfinite(t).all() for t in model.state_dict().values())


def test_one_layer_softmax_model_learns_a_sink(tmp_path):
    """The paper's Theorem 1, reproduced: the converged 1x1 softmax model parks every
    non-trigger query on BOS and averages the prefix at the trigger."""
    config = _config(max_steps=3000, log_every=500, checkpoint_every=1000)
    result = train(config, tmp_path / "run", progress=False)
    assert result.status == "converged" and result.linf_error < 5e-3
    final = read_metrics(tmp_path / "run")[-1]
    assert final["step"] == result.steps
    assert final["anchor_mass_default"][0][0] > 0.99
    assert final["anchor_mass_trigger"][0][0] < 0.05
    # on the paper's evaluation batch (trigger at 0-indexed 7)
    model = load_model(tmp_path / "run")
    batch = eval_batch(config.task, 256, seed=0, target="single")
    with torch.no_grad():
        output, cache = model.run_with_cache(batch.tokens, names_filter="blocks.0.attn.hook_pattern")
    pattern = cache["blocks.0.attn.hook_pattern"]
    assert anchor_mass(pattern, 0, batch.default_query_mask())[0] > 0.99
    trigger_row = pattern[:, 0, 7, :8].mean(0)
    assert trigger_row[0] < 0.05
    torch.testing.assert_close(trigger_row[1:], torch.full((7,), 1 / 7), atol=0.03, rtol=0)
    assert (output - batch.targets).abs().max() < 2e-2
