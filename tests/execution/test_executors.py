"""execution.run_units on the local executor and on a real two-node Ray cluster.

The cluster is started once for the module as separate processes, the way a user starts
one: ``ray start --head`` and a second ``ray start --address=...`` on this machine, each
node with one CPU, a small object store and its own short temporary directory. It is torn
down by killing exactly its processes (the process group each ``ray start`` created, and
the workers its raylets spawned, which sit in process groups of their own), not with
``ray stop``, which would stop every Ray instance of the user on the machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import ray_units
from ray_cluster import free_port, node_environment
from sinkscope.execution import Unit, UnitsReport, run_units, skip_finished
from sinkscope.infra.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def compute_units(out_dir: Path, n: int) -> list[Unit]:
    return [Unit(f"cell{i}", ray_units.compute, (str(out_dir), f"cell{i}", i)) for i in range(n)]


def outputs(out_dir: Path) -> dict[str, bytes]:
    return {path.parent.name: path.read_bytes() for path in sorted(out_dir.glob(f"*/{ray_units.RESULT}"))}


def failure_lines(report: UnitsReport) -> list[str]:
    return [failure.line() for failure in report.failed]


# --------------------------------------------------------------------------- local


def test_local_pool_equals_in_process(tmp_path: Path) -> None:
    reports = {}
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        units = [*compute_units(out, 4), Unit("broken", ray_units.fail, (str(out), "broken"))]
        reports[workers] = run_units(units, workers=workers)
    one, two = reports[1], reports[2]
    assert list(one.finished) == list(two.finished) == [f"cell{i}" for i in range(4)]
    assert one.finished == two.finished
    assert outputs(tmp_path / "w1") == outputs(tmp_path / "w2")
    assert failure_lines(one) == failure_lines(two) == ["broken: ValueError: unit broken refuses to run"]
    assert "raise ValueError" in two.failed[0].traceback  # formatted in the worker process


def test_local_skip_counts_finished_units(tmp_path: Path) -> None:
    units = compute_units(tmp_path, 5)
    run_units(units[:3])
    done: list[str] = []
    report = run_units(units, skip=skip_finished(tmp_path, ray_units.RESULT), on_done=lambda name, _: done.append(name))
    assert report.skipped == ["cell0", "cell1", "cell2"]
    assert done == list(report.finished) == ["cell3", "cell4"]


def test_bad_batches_are_input_errors(tmp_path: Path) -> None:
    unit = compute_units(tmp_path, 1)[0]
    with pytest.raises(InputError, match="unique"):
        run_units([unit, unit])
    with pytest.raises(InputError, match="executor") as error:
        run_units([unit], executor="slurm")
    assert error.value.field == "executor"
    with pytest.raises(InputError, match="workers"):
        run_units([unit], workers=0)
    with pytest.raises(InputError, match="directory-safe"):
        Unit("../escape", ray_units.compute)
    assert not (tmp_path / "cell0").exists()  # refused before anything ran


def test_ray_executor_without_ray_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    with pytest.raises(InputError, match=r"pip install 'sinkscope\[ray\]'") as error:
        run_units(compute_units(tmp_path, 1), executor="ray")
    assert error.value.field == "executor"
    assert str(error.value).count("\n") == 0


# --------------------------------------------------------------------------- ray


def test_unreachable_cluster_is_one_input_error(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    start = time.monotonic()
    with pytest.raises(InputError, match="cannot reach the Ray cluster") as error:
        run_units(compute_units(tmp_path, 1), executor="ray", ray_address=f"127.0.0.1:{free_port()}")
    assert error.value.field == "ray_address" and time.monotonic() - start < 10  # not ray.init's minutes
    with pytest.raises(InputError, match="host:port"):
        run_units(compute_units(tmp_path, 1), executor="ray", ray_address="head-node")


def test_local_ray_instance_matches_local_and_shuts_down(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    local = run_units(compute_units(tmp_path / "local", 3))
    on_ray = run_units(compute_units(tmp_path / "ray", 3), executor="ray", workers=2)
    assert on_ray.finished == local.finished and on_ray.ok
    assert outputs(tmp_path / "ray") == outputs(tmp_path / "local")
    assert not ray.is_initialized()  # the instance started for the run is gone again


def test_local_ray_instance_refuses_a_unit_it_cannot_place(tmp_path: Path) -> None:
    """A unit needing more than the instance has would wait forever: one InputError instead."""
    ray = pytest.importorskip("ray")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    units = [*compute_units(tmp_path, 1), Unit("on-gpu", ray_units.device_of, (0.0,), gpus=1)]
    with pytest.raises(InputError, match="needs 1 CPUs and 1 GPUs; the local Ray instance has 1 CPUs and 0 GPUs"):
        run_units(units, executor="ray", workers=1)
    assert not ray.is_initialized() and not (tmp_path / "cell0").exists()  # refused before scheduling


@pytest.mark.cuda
@needs_cuda
def test_local_ray_instance_gives_a_gpu_unit_its_gpu(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    units = [Unit("on-gpu", ray_units.device_of, (0.0,), gpus=1), Unit("on-cpu", ray_units.device_of, (0.0,))]
    report = run_units(units, executor="ray", workers=2)
    assert report.ok, report.summary()
    assert report.finished["on-gpu"][0] != "" and report.finished["on-gpu"][1]
    # Ray 2.60 no longer hides the GPUs from a unit that asked for none (it leaves
    # CUDA_VISIBLE_DEVICES alone): CPU units must choose the CPU themselves
    assert report.finished["on-cpu"][0] == os.environ.get("CUDA_VISIBLE_DEVICES", "")


def test_cluster_has_two_nodes_and_matches_local(cluster: str, tmp_path: Path) -> None:
    placed = run_units(
        [Unit(f"where{i}", ray_units.node_id, (1.0,)) for i in range(4)], executor="ray", ray_address=cluster
    )
    assert len(set(placed.finished.values())) == 2  # the units ran on both nodes

    local = run_units(compute_units(tmp_path / "local", 6))
    done: list[str] = []
    on_ray = run_units(
        compute_units(tmp_path / "ray", 6),
        executor="ray",
        ray_address=cluster,
        on_done=lambda name, _: done.append(name),
    )
    assert on_ray.ok and on_ray.finished == local.finished
    assert list(on_ray.finished) == [f"cell{i}" for i in range(6)]  # the batch's order
    assert sorted(done) == sorted(on_ray.finished)  # each reported as it finished
    assert outputs(tmp_path / "ray") == outputs(tmp_path / "local")


def test_cluster_failure_does_not_stop_the_others(cluster: str, tmp_path: Path) -> None:
    units = compute_units(tmp_path, 4)
    units.insert(1, Unit("broken", ray_units.fail, (str(tmp_path), "broken")))
    failed: list[str] = []
    report = run_units(
        units, executor="ray", ray_address=cluster, on_failed=lambda failure: failed.append(failure.name)
    )
    assert sorted(report.finished) == [f"cell{i}" for i in range(4)]
    assert failure_lines(report) == ["broken: ValueError: unit broken refuses to run"] and failed == ["broken"]
    assert "ray_units.py" in report.failed[0].traceback and "raise ValueError" in report.failed[0].traceback
    assert set(outputs(tmp_path)) == {f"cell{i}" for i in range(4)}


def test_cluster_retries_a_killed_worker(cluster: str, tmp_path: Path) -> None:
    out, marks = tmp_path / "out", tmp_path / "marks"
    marks.mkdir()
    units = compute_units(out, 4)
    units.insert(2, Unit("victim", ray_units.die_once, (str(out), "victim", 7, str(marks))))
    report = run_units(units, executor="ray", ray_address=cluster)
    assert report.ok, report.summary()
    assert (marks / "victim.attempt").exists()  # the first attempt did die
    assert set(report.finished) == {"victim", *(f"cell{i}" for i in range(4))}
    assert report.finished["victim"] == ray_units.compute(str(tmp_path / "check"), "victim", 7)
    assert set(outputs(out)) == set(report.finished)  # nothing finished was lost


def test_cluster_without_retries_reports_the_dead_worker(cluster: str, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    units = [*compute_units(tmp_path, 2), Unit("victim", ray_units.die_once, (str(tmp_path), "victim", 7, str(marks)))]
    report = run_units(units, executor="ray", ray_address=cluster, retries=0)
    assert sorted(report.finished) == ["cell0", "cell1"]
    [failure] = report.failed
    assert failure.name == "victim" and failure.error_type == "WorkerCrashedError"
    assert "died 1 times (retries=0)" in failure.message


def test_cluster_interrupted_driver_rerun_skips_finished(cluster: str, tmp_path: Path) -> None:
    n, seconds = 8, 1.0
    command = [
        sys.executable,
        "-c",
        "import ray_units, sys; ray_units.drive(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))",
    ]
    command += [cluster, str(tmp_path), str(n), str(seconds)]
    driver = subprocess.Popen(
        command, env=node_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 60
    while len(outputs(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    driver.send_signal(signal.SIGINT)  # Ctrl-C
    log, _ = driver.communicate(timeout=60)
    assert driver.returncode != 0, log
    before = set(outputs(tmp_path))
    assert 2 <= len(before) < n, log

    done: list[str] = []
    report = run_units(
        ray_units.slow_units(str(tmp_path), n, seconds),
        executor="ray",
        ray_address=cluster,
        skip=skip_finished(tmp_path, ray_units.RESULT),
        on_done=lambda name, _: done.append(name),
    )
    assert set(report.skipped) == before  # counted, not scheduled
    assert set(done) == set(report.finished) == {f"cell{i}" for i in range(n)} - before
    assert len(outputs(tmp_path)) == n
    # and the outputs equal a local run's
    local = run_units(compute_units(tmp_path / "local", n))
    assert {name: data for name, data in outputs(tmp_path).items()} == outputs(tmp_path / "local")
    assert all(json.loads(outputs(tmp_path)[name])["weights"] == value for name, value in local.finished.items())
