"""Unit functions for tests/execution/test_worker_lifetime.py, at module level so that
spawned pool workers import them by name (tests/ is on their PYTHONPATH)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from sinkscope.execution import Unit, run_units


def heartbeat(out_dir: str, name: str) -> None:
    """Write the time to ``out_dir/name`` every 50 ms, forever: a unit that would outlive
    any driver that does not take its workers with it."""
    beat = Path(out_dir) / name
    while True:
        beat.write_text(repr(time.time()))
        time.sleep(0.05)


def out_of_memory(out_dir: str, name: str) -> None:
    """What torch raises when an allocation does not fit (on a GPU, and on a CPU in recent
    versions)."""
    raise torch.OutOfMemoryError(f"{name}: tried to allocate 40.00 GiB")


def drive_heartbeats(out_dir: str, workers: int) -> None:
    """A driver (run as a subprocess): ``workers`` heartbeat units in a local pool."""
    run_units([Unit(f"beat{i}", heartbeat, (out_dir, f"beat{i}")) for i in range(workers)], workers=workers)


def unpicklable_result(out_dir: str, name: str) -> object:
    """A return value that cannot travel back to the driver (a lock)."""
    import threading

    return threading.Lock()


def die(out_dir: str, name: str) -> None:
    """Kill this worker process outright, as the OOM killer would."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def terminated(out_dir: str, name: str) -> None:
    """Stop this worker process with SIGTERM, as a person or a scheduler would."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)  # the signal ends the process first


def sleep_then_return(out_dir: str, name: str, seconds: float) -> str:
    time.sleep(seconds)
    return name
