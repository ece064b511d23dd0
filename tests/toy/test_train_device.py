"""Where toy models train: --device cpu|cuda|auto, one trainer on every device.

The CUDA tests run the same code path as the CPU ones on a GPU; they are marked ``cuda``
and skip on machines without one (CI has none)."""

from __future__ import annotations

import json

import pytest
import torch

from sinkscope.cli import main
from sinkscope.toy.checkpoint import load_tensors
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.run_dir import FINAL_WEIGHTS, RunConfig, TrainConfig, checkpoint_dirs
from sinkscope.toy.run_member import RunDirectoryError
from sinkscope.toy.task import TaskConfig, sample_batch
from sinkscope.toy.train import resolve_device, train, train_seeds

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _configs(layers: int, heads: int, seeds, **settings) -> list[RunConfig]:
    return [
        RunConfig(ToyModelConfig(n_layers=layers, n_heads=heads), TaskConfig(), TrainConfig(seed=seed, **settings))
        for seed in seeds
    ]


def test_auto_is_cuda_when_available_else_cpu():
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="pass cpu, cuda, cuda:N, mps or auto"):
        resolve_device("banana")
    with pytest.raises(ValueError, match="pass cpu, cuda, cuda:N, mps or auto"):
        resolve_device("meta")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
@pytest.mark.parametrize("command", [["toy", "train"], ["toy", "reproduce", "--quick"], ["toy", "sweep"]])
def test_cuda_without_a_gpu_is_one_line_and_writes_nothing(tmp_path, capsys, command):
    out = tmp_path / "out"
    assert main([*command, "--out", str(out), "--device", "cuda", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "use device cpu or auto (--device)" in err, err
    assert not out.exists()


def test_checkpoints_record_their_device_and_resume_refuses_another(tmp_path):
    config = _configs(1, 1, [0], max_steps=20, stop_linf=1e-12, checkpoint_every=10)[0]
    train(config, tmp_path / "run", progress=False, device="cpu")
    newest = checkpoint_dirs(tmp_path / "run")[-1]
    state = json.loads((newest / "state.json").read_text())
    assert state["device"] == "cpu"
    state["device"] = "cuda"  # as if trained on a GPU
    (newest / "state.json").write_text(json.dumps(state))
    longer = _configs(1, 1, [0], max_steps=30, stop_linf=1e-12, checkpoint_every=10)[0]
    with pytest.raises(RunDirectoryError, match="resume it on device cuda"):
        train(longer, tmp_path / "run", progress=False)


def test_batches_are_drawn_on_the_generators_device():
    generator = torch.Generator().manual_seed(0)
    batch = sample_batch(TaskConfig(), 4, generator, "single")
    assert batch.tokens.device.type == batch.targets.device.type == batch.trigger_position.device.type == "cpu"


@pytest.mark.cuda
@needs_cuda
def test_cuda_batches_live_on_the_gpu_and_repeat_per_seed():
    draws = [sample_batch(TaskConfig(), 8, torch.Generator(device="cuda").manual_seed(3), "single") for _ in range(2)]
    assert draws[0].tokens.is_cuda and draws[0].targets.is_cuda
    assert torch.equal(draws[0].tokens, draws[1].tokens)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("seeds", [(0,), (0, 1, 2)])
def test_cuda_training_learns_and_resumes_bitwise(tmp_path, seeds):
    """K = 1 and K = 3 on the GPU: an interrupted-and-resumed run ends with exactly the
    weights of a straight one, and the 1x1 softmax model converges."""
    straight = [tmp_path / f"straight{k}" for k in seeds]
    train_seeds(
        _configs(1, 1, seeds, max_steps=80, stop_linf=1e-12, checkpoint_every=20),
        straight,
        progress=False,
        device="cuda",
    )
    resumed = [tmp_path / f"resumed{k}" for k in seeds]
    train_seeds(
        _configs(1, 1, seeds, max_steps=40, stop_linf=1e-12, checkpoint_every=20),
        resumed,
        progress=False,
        device="cuda",
    )
    train_seeds(
        _configs(1, 1, seeds, max_steps=80, stop_linf=1e-12, checkpoint_every=20),
        resumed,
        progress=False,
        device="cuda",
    )
    for a, b in zip(straight, resumed):
        wa, wb = load_tensors(a / FINAL_WEIGHTS), load_tensors(b / FINAL_WEIGHTS)
        assert all(torch.equal(wa[name], wb[name]) for name in wa)
    converged = train_seeds(
        _configs(1, 1, seeds, max_steps=5000), [tmp_path / f"full{k}" for k in seeds], progress=False, device="cuda"
    )
    assert all(result.converged for result in converged)
