"""The stop rule decided on the device gives the host rule's numbers bit for bit (eager
CPU), and a stopped seed stays frozen at its stop step."""

from __future__ import annotations

import json
from contextlib import nullcontext

import pytest
import torch

import sinkscope.toy.train as train_module
from sinkscope.toy.checkpoint import load_tensors
from sinkscope.toy.device_stop import DeviceStop, frozen_where
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.run_dir import FINAL_WEIGHTS, RunConfig, TrainConfig, checkpoint_dirs
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.train import train_seeds


def _configs(seeds, **train_settings) -> list[RunConfig]:
    return [RunConfig(ToyModelConfig(), TaskConfig(), TrainConfig(seed=s, **train_settings)) for s in seeds]


def _run_files(run_dir) -> dict[str, bytes]:
    """Everything a run wrote that holds numbers: metrics, final weights, checkpoints."""
    files = {"metrics": (run_dir / "metrics.jsonl").read_bytes()}
    files["final"] = b"".join(t.numpy().tobytes() for t in load_tensors(run_dir / FINAL_WEIGHTS).values())
    for point in checkpoint_dirs(run_dir):
        for path in sorted(point.iterdir()):
            if path.name == "state.json":  # the data generator's state and the step, not the wall time
                state = json.loads(path.read_text())
                state.pop("wall_seconds")
                files[f"{point.name}/state"] = json.dumps(state, sort_keys=True).encode()
            if path.suffix == ".safetensors":
                tensors = load_tensors(path)
                files[f"{point.name}/{path.name}"] = b"".join(t.numpy().tobytes() for t in tensors.values())
    return files


def _train(tmp_path, name: str, device_rule: bool, monkeypatch, seeds):
    monkeypatch.setattr(train_module, "uses_device_rule", lambda device, compiled: device_rule)
    dirs = [tmp_path / f"{name}{k}" for k in range(len(seeds))]
    configs = _configs(seeds, max_steps=3000, stop_linf=3e-2, log_every=100, checkpoint_every=300)
    return dirs, train_seeds(configs, dirs, progress=False, compile="off")


@pytest.mark.parametrize("seeds", [(0,), pytest.param((0, 1), marks=pytest.mark.slow)])
def test_device_rule_gives_the_host_rule_numbers_bit_for_bit(tmp_path, monkeypatch, seeds):
    host_dirs, host = _train(tmp_path, "h", False, monkeypatch, seeds)
    device_dirs, device = _train(tmp_path, "d", True, monkeypatch, seeds)
    assert [r.status for r in host] == ["converged"] * len(seeds)
    assert [r.steps for r in device] == [r.steps for r in host]
    assert [(r.loss, r.linf_error) for r in device] == [(r.loss, r.linf_error) for r in host]
    if len(seeds) > 1:  # they stop at steps no log or checkpoint falls on, at different steps
        assert len({r.steps for r in host}) == len(seeds)
    assert all(r.steps % 100 for r in host)
    for h, d in zip(host_dirs, device_dirs):
        assert _run_files(d) == _run_files(h)


def test_a_stopped_seed_is_frozen_and_keeps_its_first_stop():
    stop = DeviceStop(3, 0.5, torch.device("cpu"))
    stop.step.fill_(7)
    stop.observe(torch.tensor([1.0, float("nan"), 1.0]), torch.tensor([0.4, 0.1, 0.9]))
    stop.step.fill_(8)
    stop.observe(torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0.1, 0.1, 0.5]))  # 0.5 is not below
    stopped = {s.index: s for s in stop.stopped_members()}
    assert sorted(stopped) == [0, 1]
    assert (stopped[0].step, stopped[0].linf, stopped[0].diverged) == (7, pytest.approx(0.4), False)
    assert stopped[1].step == 7 and stopped[1].diverged
    kept, updated = torch.zeros(3, 2), torch.ones(3, 2)
    assert frozen_where(stop.stopped, kept, updated).tolist() == [[0, 0], [0, 0], [1, 1]]


class _InterruptAfter:
    """A step-boundary latch that reports a signal from its ``reads``-th read on."""

    def __init__(self, reads: int) -> None:
        self.reads = reads

    @property
    def requested(self) -> bool:
        self.reads -= 1
        return self.reads < 0


def test_an_interrupt_inside_a_device_block_checkpoints_that_step_and_resumes_exactly(tmp_path, monkeypatch):
    configs = _configs((0, 1), max_steps=250, stop_linf=1e-12, log_every=100, checkpoint_every=200)
    straight = [tmp_path / f"s{k}" for k in range(2)]
    monkeypatch.setattr(train_module, "uses_device_rule", lambda device, compiled: False)
    train_seeds(configs, straight, progress=False)
    monkeypatch.setattr(train_module, "uses_device_rule", lambda device, compiled: True)
    monkeypatch.setattr(train_module, "interrupts_at_step_boundaries", lambda: nullcontext(_InterruptAfter(137)))
    dirs = [tmp_path / f"d{k}" for k in range(2)]
    with pytest.raises(KeyboardInterrupt):
        train_seeds(configs, dirs, progress=False)
    assert [p.name for p in checkpoint_dirs(dirs[0])][-1] == "step-00000137"  # mid-block, not a log step
    monkeypatch.setattr(train_module, "interrupts_at_step_boundaries", lambda: nullcontext(_InterruptAfter(10**9)))
    resumed = train_seeds(configs, dirs, progress=False)
    assert [r.resumed_from_step for r in resumed] == [137, 137]
    for a, b in zip(dirs, straight):
        assert _run_files(a)["final"] == _run_files(b)["final"]
        assert _run_files(a)["metrics"] == _run_files(b)["metrics"]
