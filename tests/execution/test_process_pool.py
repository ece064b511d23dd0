"""The local process pool (``sinkscope.execution.process_pool``) on the failures a shared
pool hangs or garbles on: workers killed mid-unit, one after another or all at once,
units that cannot be sent to a worker, results that cannot be sent back, and a driver
that fails while units run. Every batch ends, and no worker outlives it."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from test_worker_lifetime import alive, descendants, wait_until

import ray_units
import worker_units
from sinkscope.execution import Unit, UnitsReport, run_units

BATCH_SECONDS = 120  # a batch that takes longer is hung: each unit here takes well under a second


def run_batch(units: list[Unit], workers: int, **kwargs) -> UnitsReport:
    """``run_units`` in a thread, so that a hang fails the test instead of stopping it."""
    reports: list[UnitsReport] = []
    batch = threading.Thread(target=lambda: reports.append(run_units(units, workers=workers, **kwargs)), daemon=True)
    batch.start()
    batch.join(timeout=BATCH_SECONDS)
    assert reports, "the batch never ended"
    return reports[0]


def no_workers_left() -> bool:
    return wait_until(lambda: not alive(descendants(os.getpid()) - resource_trackers()), 20)


def resource_trackers() -> set[int]:
    """multiprocessing's resource tracker: one per driver process, started once, kept."""
    found = set()
    for pid in descendants(os.getpid()):
        try:
            if b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.add(pid)
        except OSError:
            pass  # exited meanwhile
    return found


def compute(out: Path, name: str, seed: int) -> Unit:
    return Unit(name, ray_units.compute, (str(out), name, seed))


def test_every_worker_killed_loses_every_unit_and_the_batch_ends(tmp_path):
    units = [Unit(f"victim{i}", worker_units.die, (str(tmp_path), f"victim{i}")) for i in range(3)]
    report = run_batch(units, workers=2)
    assert not report.finished
    assert [(f.name, f.kind, f.error_type) for f in report.failed] == [(u.name, "lost", "WorkerDied") for u in units]
    assert no_workers_left()


def test_killed_workers_between_good_units_lose_only_their_own(tmp_path):
    units = []
    for i in range(4):
        units += [compute(tmp_path, f"cell{i}", i), Unit(f"victim{i}", worker_units.die, (str(tmp_path), f"v{i}"))]
    report = run_batch(units, workers=3)
    assert list(report.finished) == [f"cell{i}" for i in range(4)]
    assert [f.name for f in report.failed] == [f"victim{i}" for i in range(4)]
    assert all("worker process died" in f.message and "(workers)" in f.message for f in report.failed)
    assert no_workers_left()


def test_a_unit_that_cannot_be_sent_fails_alone(tmp_path):
    local = lambda: None  # noqa: E731  (a lambda is pickled by name, which it has not)
    units = [compute(tmp_path, "cell0", 0), Unit("local", local), compute(tmp_path, "cell1", 1)]
    report = run_batch(units, workers=2)
    assert list(report.finished) == ["cell0", "cell1"]
    [failure] = report.failed
    assert failure.name == "local" and failure.message.startswith("it could not be sent to a worker process: ")
    assert failure.kind == "bug" and "Traceback" in failure.traceback


def test_a_result_that_cannot_be_sent_back_fails_alone(tmp_path):
    units = [Unit("lock", worker_units.unpicklable_result, (str(tmp_path), "lock")), compute(tmp_path, "cell0", 0)]
    report = run_batch(units, workers=2)
    assert list(report.finished) == ["cell0"]
    [failure] = report.failed
    assert failure.name == "lock" and failure.message.startswith("its result could not be sent back: ")
    assert "lock" in failure.message.lower()


def test_more_workers_than_units_and_units_in_batch_order(tmp_path):
    seconds = [0.6, 0.0, 0.3]
    units = [Unit(f"u{i}", worker_units.sleep_then_return, (str(tmp_path), f"u{i}", s)) for i, s in enumerate(seconds)]
    finished_order: list[str] = []
    report = run_batch(units, workers=8, on_done=lambda name, value: finished_order.append(name))
    assert list(report.finished) == ["u0", "u1", "u2"] and report.finished["u2"] == "u2"
    assert sorted(finished_order) == ["u0", "u1", "u2"]
    assert no_workers_left()


def test_an_error_in_the_driver_stops_every_worker(tmp_path):
    units = [Unit(f"slow{i}", worker_units.sleep_then_return, (str(tmp_path), f"slow{i}", 60)) for i in range(2)]
    units.insert(0, Unit("quick", worker_units.sleep_then_return, (str(tmp_path), "quick", 0)))

    def refuse(name: str, value: object) -> None:
        raise RuntimeError(f"on_done refused {name}")

    with pytest.raises(RuntimeError, match="on_done refused quick"):
        run_units(units, workers=3, on_done=refuse)
    assert no_workers_left()


def test_a_worker_stopped_by_a_signal_is_not_blamed_on_memory(tmp_path):
    """SIGKILL is what the out-of-memory killer sends, and its failure names the memory fix;
    another signal was sent by someone, and the failure says which and how to resume."""
    units = [
        Unit("terminated", worker_units.terminated, (str(tmp_path), "terminated")),
        Unit("killed", worker_units.die, (str(tmp_path), "killed")),
    ]
    report = run_batch(units, workers=2)
    messages = {failure.name: failure.message for failure in report.failed}
    assert messages["terminated"].startswith("its worker process was stopped by SIGTERM from outside")
    assert "memory" not in messages["terminated"] and "run the same command again" in messages["terminated"]
    assert "memory ran out" in messages["killed"]
    assert no_workers_left()
