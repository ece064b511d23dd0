"""Run units in a pool of spawned worker processes, each with a pipe of its own.

Each worker talks to the driver over its own pipe, and nothing is shared between
workers: no queue, and no lock that a killed worker could leave held.
``multiprocessing.Pool`` shares such a lock, and that can hang its driver:
- every idle worker waits for the next task holding the task queue's read lock;
- a worker killed while it waits (by the OOM killer, say, or by the kernel's signal when
  the pool thread that started it ends) takes the lock with it;
- the driver's ``terminate()`` then waits for that lock forever.

A worker starts with a unit to run and is handed the next one when it reports back, so
every worker that dies was running a unit: that unit is lost (one failure naming the
fix), and a fresh worker takes the next unit. Workers are started from the thread that
calls ``run_in_processes`` and are gone when it returns or raises, so the signal that
``die_with_parent`` asks the kernel for comes only when the driver itself dies.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from sinkscope.execution.units import OUT_OF_MEMORY_FIX, Unit, UnitFailure
from sinkscope.execution.worker_lifetime import die_with_parent

# what a worker sends back: ("done", return value) or ("failed", UnitFailure)
Outcome = tuple[str, Any]
RunUnit = Callable[[Unit], Outcome]
Record = Callable[[str, Outcome], None]

# a worker told to stop (an interrupt, an error in the driver) checkpoints at its next
# training step and exits; one still running after this long is killed
STOP_SECONDS = 30.0
WORKER_DIED = (
    "its worker process died (killed from outside, often by the system when memory ran out); " + OUT_OF_MEMORY_FIX
)


@dataclass
class Worker:
    """A worker process, the driver's end of its pipe, and the unit it is running."""

    process: Any  # multiprocessing's SpawnProcess
    connection: Connection
    unit: str = ""


def run_in_processes(units: list[Unit], workers: int, run_unit: RunUnit, record: Record) -> None:
    """Run ``units`` in at most ``workers`` spawned processes, each calling ``run_unit``
    (a module-level function); ``record(name, outcome)`` runs in this process as each unit
    finishes, fails or loses its worker. An exception here (``KeyboardInterrupt`` too)
    stops every worker before it propagates."""
    context = multiprocessing.get_context("spawn")
    waiting = list(reversed(units))  # popped from the end: the batch's order
    running: list[Worker] = []
    try:
        while waiting and len(running) < workers:
            _start(context, run_unit, waiting, running, record)
        while running:
            ready = set(wait([w.connection for w in running] + [w.process.sentinel for w in running]))
            for worker in [w for w in running if w.connection in ready or w.process.sentinel in ready]:
                outcome = _receive(worker)
                record(worker.unit, outcome)
                if _is_lost(outcome):
                    _close(worker, running)
                    if waiting:
                        _start(context, run_unit, waiting, running, record)
                elif not _hand_out(worker, waiting, record):
                    worker.connection.send(None)  # no more units: the worker exits
                    _close(worker, running)
    finally:
        _stop(running)


def _start(context: Any, run_unit: RunUnit, waiting: list[Unit], running: list[Worker], record: Record) -> None:
    """A new worker, handed the next unit (none is started when no unit can be sent)."""
    ours, theirs = context.Pipe()
    process = context.Process(target=_serve, args=(theirs, os.getpid(), run_unit), daemon=True)
    process.start()
    theirs.close()
    worker = Worker(process, ours)
    running.append(worker)
    if not _hand_out(worker, waiting, record):
        worker.connection.send(None)
        _close(worker, running)


def _hand_out(worker: Worker, waiting: list[Unit], record: Record) -> bool:
    """Send ``worker`` the next unit that can be sent; a unit that cannot be pickled
    (a lambda, a local function) fails here. False when no unit is left."""
    while waiting:
        unit = waiting.pop()
        try:
            payload = pickle.dumps(unit)
        except Exception as error:
            record(unit.name, _failure(unit.name, error, "it could not be sent to a worker process"))
            continue
        worker.unit = unit.name
        try:
            worker.connection.send((unit.name, payload))
        except OSError:
            pass  # the worker just died: its sentinel says so at the next wait, and this unit is lost
        return True
    return False


def _receive(worker: Worker) -> Outcome:
    """What ``worker`` sent back for its unit, or a lost failure when it died first."""
    try:
        if worker.connection.poll():
            return worker.connection.recv()
    except (EOFError, OSError):
        pass  # it died before (or while) sending
    except Exception as error:  # e.g. a returned object whose class this process cannot import
        return _failure(worker.unit, error, "its result could not be read back")
    return "failed", UnitFailure(worker.unit, "WorkerDied", _death(worker), "", "lost")


def _death(worker: Worker) -> str:
    """Why ``worker`` died, as far as its exit status says: a signal other than SIGKILL was
    sent by someone (the system's out-of-memory killer sends SIGKILL)."""
    worker.process.join(1.0)  # its sentinel fired: the exit status is a moment away
    code = worker.process.exitcode
    if code is not None and code < 0 and -code != signal.SIGKILL:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        return f"its worker process was stopped by {name} from outside; run the same command again to resume"
    return WORKER_DIED


def _is_lost(outcome: Outcome) -> bool:
    status, payload = outcome
    return status == "failed" and payload.kind == "lost"


def _failure(name: str, error: Exception, what: str) -> Outcome:
    return "failed", UnitFailure(name, type(error).__name__, f"{what}: {error}", traceback.format_exc())


def _close(worker: Worker, running: list[Worker]) -> None:
    """Wait for a worker that was told to stop (or has died) and forget it."""
    running.remove(worker)
    worker.process.join(STOP_SECONDS)
    if worker.process.exitcode is None:
        worker.process.kill()
        worker.process.join()
    worker.connection.close()


def _stop(running: list[Worker]) -> None:
    """SIGTERM every worker still running (training checkpoints and stops at its next
    step), then wait for each; one still alive after ``STOP_SECONDS`` is killed."""
    for worker in running:
        if worker.process.exitcode is None:
            worker.process.terminate()
    for worker in list(running):
        _close(worker, running)


def _serve(connection: Connection, parent_pid: int, run_unit: RunUnit) -> None:
    """A worker's life: run each unit it is sent and send back the outcome, until it is
    sent ``None``. An interrupt (the driver's SIGTERM; Ctrl-C reaches every process)
    exits quietly instead of printing a traceback per process; a unit's output directory
    is written atomically, so nothing half-done is left."""
    die_with_parent(parent_pid)
    try:
        while (message := connection.recv()) is not None:
            name, payload = message
            try:
                unit = pickle.loads(payload)
            except Exception as error:  # e.g. its function's module cannot be imported here
                connection.send(_failure(name, error, "a worker process could not read it"))
                continue
            _send_back(connection, name, run_unit(unit))
    except KeyboardInterrupt as error:
        raise SystemExit(1) from error
    except EOFError:
        pass  # the driver is gone


def _send_back(connection: Connection, name: str, outcome: Outcome) -> None:
    try:
        connection.send(outcome)
    except (pickle.PicklingError, TypeError, AttributeError) as error:  # e.g. a return value that cannot be pickled
        connection.send(_failure(name, error, "its result could not be sent back"))
