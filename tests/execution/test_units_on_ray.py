"""Sweeps and audit suites as units on a real two-node Ray cluster (the session's ``cluster``
fixture): the same results as the local executor, a killed Ray worker and an interrupted
driver lose nothing finished, and the Ray executor without Ray is one line."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import sinkscope.toy.experiment
from ray_cluster import node_environment, unit_workers
from sinkscope.cli import main
from sinkscope.infra.codec import encode
from sinkscope.infra.errors import InputError
from sinkscope.pretrained_analysis.audit import read_audit
from sinkscope.pretrained_analysis.compare import read_comparison
from sinkscope.toy.sweep import SweepConfig, sweep
from sinkscope.toy.train import unit_device
from tiny_models import build_tiny_checkpoints

SWEEP = SweepConfig(
    seq_lens=(6,), d_models=(6,), attentions=("softmax", "relu"), seeds=2, max_steps=400, n_sequences=16, workers=2
)
SWEEP_ARGV = ["--seq-len", "6", "--d-model", "6", "--attention", "softmax,relu", "--seeds", "2"]
SWEEP_ARGV += ["--max-steps", "400", "--sequences", "16", "--workers", "2", "--no-progress"]
AUDIT_FAST = ["--n-prompts", "6", "--max-len", "24", "--examples", "0", "--batch-size", "4", "--no-progress"]


def without_timing(models) -> list[dict]:
    return [{key: value for key, value in encode(m).items() if key != "wall_seconds"} for m in models]


def weights(out: Path) -> dict[str, bytes]:
    return {path.parent.name: path.read_bytes() for path in sorted(out.glob("*/model.safetensors"))}


def count_skipped_units(monkeypatch) -> list[str]:
    """The names of the units ``run_jobs`` skips from now on (finished earlier)."""
    skipped: list[str] = []
    real_run_units = sinkscope.toy.experiment.run_units

    def counting(*args, **kwargs):
        report = real_run_units(*args, **kwargs)
        skipped.extend(report.skipped)
        return report

    monkeypatch.setattr(sinkscope.toy.experiment, "run_units", counting)
    return skipped


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "sweep"
    return out, sweep(SWEEP, out, progress=False)


def test_a_sweep_on_the_cluster_equals_the_local_one(cluster, local_sweep, tmp_path):
    local_out, local = local_sweep
    result = sweep(SWEEP, tmp_path / "sweep", progress=False, executor="ray", ray_address=cluster)
    assert without_timing(result.models) == without_timing(local.models) and len(result.models) == 4
    assert weights(tmp_path / "sweep") == weights(local_out)  # bit for bit


def test_a_killed_ray_worker_is_retried_and_the_sweep_completes(cluster, local_sweep, tmp_path):
    killed: list[int] = []
    finished = threading.Event()

    def kill_one_unit_worker() -> None:
        while not finished.is_set() and not killed:
            for pid in unit_workers():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                break
            time.sleep(0.05)

    killer = threading.Thread(target=kill_one_unit_worker)
    killer.start()
    try:
        result = sweep(SWEEP, tmp_path / "sweep", progress=False, executor="ray", ray_address=cluster)
    finally:
        finished.set()
        killer.join()
    assert killed, "no Ray worker ran a unit to kill"
    local_out, local = local_sweep
    assert without_timing(result.models) == without_timing(local.models)
    assert weights(tmp_path / "sweep") == weights(local_out)


def test_an_interrupted_driver_resumes_and_skips_the_finished_units(cluster, local_sweep, tmp_path, monkeypatch):
    out = tmp_path / "sweep"
    command = [sys.executable, "-m", "sinkscope", "toy", "sweep", "--out", str(out), *SWEEP_ARGV]
    driver = subprocess.Popen([*command, "--executor", "ray", "--ray-address", cluster], env=node_environment())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(out.glob("*/evaluation.json")):
        time.sleep(0.05)
    driver.send_signal(signal.SIGINT)
    assert driver.wait(timeout=60) != 0
    finished = {path.parent.name for path in out.glob("*/evaluation.json")}
    assert 1 <= len(finished) < 4, finished

    skipped = count_skipped_units(monkeypatch)
    result = sweep(SWEEP, out, progress=False, executor="ray", ray_address=cluster)
    assert sorted(skipped) == sorted(finished)  # one seed per unit here (4 groups of one seed)
    local_out, local = local_sweep
    assert without_timing(result.models) == without_timing(local.models)
    assert weights(out) == weights(local_out)


def test_a_multi_revision_audit_suite_on_the_cluster_equals_the_local_one(cluster, tmp_path, capsys):
    checkpoints = [str(path) for path in build_tiny_checkpoints(tmp_path / "run", steps=(0, 30), bos_sink_head=(0, 0))]
    argv = ["audit", *checkpoints, "--ablate", *AUDIT_FAST]
    assert main([*argv, "--out", str(tmp_path / "local")]) == 0
    assert main([*argv, "--out", str(tmp_path / "ray"), "--executor", "ray", "--ray-address", cluster]) == 0
    capsys.readouterr()
    assert encode(read_comparison(tmp_path / "ray")) == encode(read_comparison(tmp_path / "local"))
    for name in ("step0", "step30"):
        ours, theirs = read_audit(tmp_path / "ray" / name), read_audit(tmp_path / "local" / name)
        assert encode(ours.probe) == encode(theirs.probe) and encode(ours.ablation) == encode(theirs.ablation)


def test_the_ray_executor_without_ray_is_one_line_before_anything_is_written(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    out = tmp_path / "sweep"
    assert main(["toy", "sweep", "--out", str(out), *SWEEP_ARGV, "--executor", "ray"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'sinkscope[ray]'" in err and "(--executor)" in err
    assert not out.exists()
    assert main(["toy", "sweep", "--out", str(out), *SWEEP_ARGV, "--ray-address", "auto"]) == 2
    assert "--ray-address is for --executor ray" in capsys.readouterr().err


def test_a_bad_ray_address_is_one_line_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["toy", "sweep", "--out", str(out), *SWEEP_ARGV, "--executor", "ray", "--ray-address", "no-port"]
    assert main(argv) == 2 and "not 'auto' or host:port" in capsys.readouterr().err
    assert not out.exists()  # refused before the sweep directory or its marker is made


def test_a_unit_that_raises_a_bug_shows_its_traceback_and_bad_input_names_its_flag(tmp_path, capsys, monkeypatch):
    """Locally, in this process (one worker): a unit's plain exception is a bug, shown with
    its traceback after the others ran (exit 1); an InputError in every unit is bad input."""

    def broken(group, out_dir, n_sequences, device="cpu", tracking=None, compile="auto"):
        raise TypeError("boom")

    monkeypatch.setattr(sinkscope.toy.experiment, "train_and_evaluate", broken)
    argv = ["toy", "sweep", "--out", str(tmp_path / "a"), *SWEEP_ARGV, "--workers", "1"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "raised:\nTraceback (most recent call last):" in err and "TypeError: boom" in err
    assert "sinkscope: run failed: 2 of 2 training units failed" in err  # one worker: seeds train together

    def refuse(group, out_dir, n_sequences, device="cpu", tracking=None, compile="auto"):
        raise InputError("max_steps is too small for this task", field="max_steps")

    monkeypatch.setattr(sinkscope.toy.experiment, "train_and_evaluate", refuse)
    assert main(["toy", "sweep", "--out", str(tmp_path / "b"), *SWEEP_ARGV, "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().endswith("(--max-steps)")


def test_on_ray_a_cuda_device_is_checked_on_the_node_not_the_driver():
    assert unit_device("cuda:1", "ray") == "cuda" and unit_device("cpu", "ray") == "cpu"
    with pytest.raises(InputError, match="pass cpu, cuda"):
        unit_device("tpu", "ray")
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="no CUDA device"):
            unit_device("cuda", "local")


def test_a_sweep_resumes_with_another_worker_count(tmp_path, monkeypatch):
    out = tmp_path / "sweep"
    first = sweep(dataclasses.replace(SWEEP, workers=1), out, progress=False)
    skipped = count_skipped_units(monkeypatch)
    again = sweep(SWEEP, out, progress=False)  # workers=2 now: the same settings otherwise
    assert len(skipped) == 4 and without_timing(again.models) == without_timing(first.models)  # read back
