"""Pool workers die with their driver, and a unit that runs out of memory is one line.

A driver killed outright (SIGKILL: no handler runs, the pool cannot stop its workers) takes
its workers with it: on Linux the kernel sends each SIGTERM, which training turns into a
stop at the next step boundary with a checkpoint; everywhere, training checks at each
step boundary that its driver is still its parent. Nothing under ``--out`` changes once
they are gone, and the same command resumes the runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
import torch

import worker_units
from cli.test_faults import snapshot
from ray_cluster import is_zombie, processes
from sinkscope.cli import main
from sinkscope.execution import Unit, run_units
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.run_dir import FINAL_WEIGHTS, RunConfig, TrainConfig, checkpoint_dirs
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.train import train

# from the driver's death until no worker is left: a step is milliseconds, but the last
# checkpoint is synced to disk, which on a busy shared disk can take seconds
DEATH_SECONDS = 20
# two units of one seed each, about 1,100 steps (8 s) each on a busy 2-core machine
SWEEP = ["toy", "sweep", "--seq-len", "32", "--d-model", "8", "--attention", "softmax", "--seeds", "2"]
SWEEP += ["--workers", "2", "--max-steps", "2500", "--sequences", "16", "--no-progress"]


def descendants(pid: int) -> set[int]:
    """Every process started by ``pid``, directly or not."""
    table = processes()
    found: set[int] = set()
    parents = {pid}
    while parents:
        parents = {child for child, (parent, _) in table.items() if parent in parents} - found
        found |= parents
    return found


def wait_until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if not is_zombie(pid)}


def kill_all(pids: set[int]) -> None:
    """Clean up after a failed test: no runaway worker outlives it."""
    for pid in alive(pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_driver_once_workers_run(driver: subprocess.Popen, ready: Callable[[], bool]) -> set[int]:
    """SIGKILL ``driver`` once ``ready()``; its descendants (the pool's workers, its resource tracker)."""
    if not wait_until(ready, 120):
        driver.kill()
        pytest.fail(f"the workers never got going: {driver.communicate()[1]}")
    workers = descendants(driver.pid)
    driver.kill()
    driver.wait()
    return workers


def test_a_killed_drivers_pool_workers_die_with_it(tmp_path):
    """Units that never end (a heartbeat each): once the driver is SIGKILLed, its workers
    are gone within seconds and the heartbeats stop."""
    drive = "import sys, worker_units; worker_units.drive_heartbeats(sys.argv[1], 2)"
    driver = subprocess.Popen([sys.executable, "-c", drive, str(tmp_path)], stderr=subprocess.PIPE, text=True)
    beats = [tmp_path / "beat0", tmp_path / "beat1"]
    workers = kill_driver_once_workers_run(driver, lambda: all(beat.exists() for beat in beats))
    try:
        assert len(workers) >= 2, workers
        assert wait_until(lambda: not alive(workers), DEATH_SECONDS), f"still alive: {alive(workers)}"
        before = snapshot(tmp_path)
        time.sleep(0.3)  # six heartbeats' time
        assert snapshot(tmp_path) == before
    finally:
        kill_all(workers)


def test_a_killed_sweep_stops_its_workers_at_the_next_step_and_the_same_command_finishes_it(tmp_path, capsys):
    """A real ``sinkscope toy sweep --workers 2`` SIGKILLed while both units train: each
    run stops within a log interval (100 steps) of the kill, unfinished, with a
    checkpoint; nothing changes after; the same command then finishes both runs."""
    out = tmp_path / "sweep"
    argv = [*SWEEP, "--out", str(out)]
    driver = subprocess.Popen(
        [sys.executable, "-m", "sinkscope", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )

    def logged() -> dict[str, int]:
        return {log.parent.name: len(log.read_text().splitlines()) for log in out.glob("*/metrics.jsonl")}

    def both_training() -> bool:
        lines = logged()
        return len(lines) == 2 and all(lines.values())

    workers = kill_driver_once_workers_run(driver, both_training)
    # counted once the driver is dead: on a loaded machine the units log on while the test
    # finds the workers and sends the kill, so a count taken before it would be stale
    at_kill = logged()
    try:
        assert len(workers) >= 2, workers
        assert wait_until(lambda: not alive(workers), DEATH_SECONDS), f"still alive: {alive(workers)}"
    finally:
        kill_all(workers)
    # at most the line being written at the kill: a log line is 100 steps, a unit about 1,100
    assert all(lines <= at_kill[name] + 1 for name, lines in logged().items()), (at_kill, logged())
    runs = [out / name for name in sorted(at_kill)]
    assert not any((run / FINAL_WEIGHTS).exists() for run in runs)
    # step 0 and the step it stopped at (and a periodic one between, when the kill came late)
    checkpoints = {run.name: [path.name for path in checkpoint_dirs(run)] for run in runs}
    assert all(len(names) >= 2 for names in checkpoints.values()), (checkpoints, logged(), driver.stderr.read())
    before = snapshot(out)
    time.sleep(1)
    assert snapshot(out) == before
    assert main(argv) == 0  # the same command resumes both runs and finishes them
    capsys.readouterr()
    assert all((run / FINAL_WEIGHTS).is_file() and (run / "evaluation.json").is_file() for run in runs)


def test_an_orphaned_worker_stops_training_at_the_next_step_boundary_with_a_checkpoint(tmp_path, monkeypatch):
    """The portable check: once the driver is no longer this process's parent (here: the
    recorded driver pid is not the parent after step 100 is logged), training checkpoints
    the step it is at and stops; an ordinary resume finishes the run."""
    from sinkscope.execution import worker_lifetime

    config = RunConfig(ToyModelConfig(), TaskConfig(), TrainConfig(max_steps=400, stop_linf=1e-12))
    run = tmp_path / "run"

    def orphaned_at_step_100(step: int, record: dict) -> None:
        if step == 100:
            monkeypatch.setattr(worker_lifetime, "_parent_pid", os.getppid() + 1)

    with pytest.raises(KeyboardInterrupt):
        train(config, run, progress=False, on_log=orphaned_at_step_100)
    assert [path.name for path in checkpoint_dirs(run)] == ["step-00000000", "step-00000101"]
    logged = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert logged == [0, 100] and not (run / FINAL_WEIGHTS).exists()
    monkeypatch.setattr(worker_lifetime, "_parent_pid", None)  # a resume by a live driver
    assert train(config, run, progress=False).steps == 400


def test_the_parent_death_signal_sent_again_and_again_still_stops_with_a_checkpoint(tmp_path, monkeypatch):
    """A SIGKILLed driver's threads exit one by one and the kernel sends the worker its
    parent-death signal once per thread: every one of them asks for the step-boundary
    stop, none for the stop without a checkpoint that a second SIGTERM means."""
    from sinkscope.execution import worker_lifetime

    monkeypatch.setattr(worker_lifetime, "_parent_pid", os.getppid())  # a pool worker whose driver lives
    config = RunConfig(ToyModelConfig(), TaskConfig(), TrainConfig(max_steps=400, stop_linf=1e-12))
    run = tmp_path / "run"
    handlers = []

    def driver_dies_at_step_100(step: int, record: dict) -> None:
        if step == 100:
            handlers.append(signal.getsignal(worker_lifetime.PARENT_DEATH_SIGNAL))
            if callable(handlers[-1]):  # with the default action the signal would end pytest itself
                for _ in range(3):
                    os.kill(os.getpid(), worker_lifetime.PARENT_DEATH_SIGNAL)

    with pytest.raises(KeyboardInterrupt):
        train(config, run, progress=False, on_log=driver_dies_at_step_100)
    assert callable(handlers[0]), handlers
    assert [path.name for path in checkpoint_dirs(run)] == ["step-00000000", "step-00000101"]
    assert signal.getsignal(worker_lifetime.PARENT_DEATH_SIGNAL) is signal.SIG_DFL  # restored


@pytest.mark.parametrize("workers", [1, 2], ids=["in-process", "pool"])
def test_a_unit_out_of_memory_is_an_input_failure_naming_the_fix(tmp_path, workers):
    units = [Unit(f"big{i}", worker_units.out_of_memory, (str(tmp_path), f"big{i}")) for i in range(2)]
    report = run_units(units, workers=workers)
    assert [failure.name for failure in report.failed] == ["big0", "big1"]
    for failure in report.failed:
        assert (failure.kind, failure.field, failure.error_type) == ("input", "workers", "OutOfMemoryError")
        assert failure.message.startswith(f"out of memory ({failure.name}: tried to allocate 40.00 GiB); ")
        assert "fewer units at once (workers)" in failure.message and "batch_size" in failure.message


@pytest.mark.parametrize("raised", [MemoryError(), torch.OutOfMemoryError("CUDA out of memory. Tried to allocate")])
def test_a_sweep_whose_units_run_out_of_memory_is_one_line_naming_workers(tmp_path, capsys, monkeypatch, raised):
    import sinkscope.toy.experiment as experiment

    def out_of_memory(*args, **kwargs):
        raise raised

    monkeypatch.setattr(experiment, "train_and_evaluate", out_of_memory)
    tmp_path.joinpath("keep.txt").write_text("keep")
    before = snapshot(tmp_path)
    argv = [*SWEEP, "--workers", "1", "--out", str(tmp_path / "sweep")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "out of memory" in err and "(--workers)" in err, err
    after = snapshot(tmp_path)
    # besides what was there, only the sweep's settings, which the same command reads to resume it
    assert sorted(set(after) - set(before)) == ["sweep", "sweep/sweep.json"], after
    assert {path: after[path] for path in before} == before


def test_a_unit_whose_worker_is_killed_fails_as_lost_and_the_others_finish(tmp_path):
    """A pool worker killed mid-unit (the OOM killer, a kill -9): the pool would wait for
    that unit forever; it is one lost failure naming the fix, and the other units finish."""
    import threading

    import ray_units

    marks = tmp_path / "marks"
    marks.mkdir()
    units = [Unit("victim", ray_units.die_once, (str(tmp_path), "victim", 7, str(marks)))]
    units += [Unit(f"cell{i}", ray_units.compute, (str(tmp_path), f"cell{i}", i)) for i in range(3)]
    reports = []
    batch = threading.Thread(target=lambda: reports.append(run_units(units, workers=2)), daemon=True)
    batch.start()
    batch.join(timeout=120)
    assert reports, "run_units waited for the killed worker's unit"
    [report] = reports
    assert sorted(report.finished) == ["cell0", "cell1", "cell2"]
    [failure] = report.failed
    assert (failure.name, failure.kind, failure.error_type) == ("victim", "lost", "WorkerDied")
    assert "worker process died" in failure.message and "fewer units at once (workers)" in failure.message
