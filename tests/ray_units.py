"""Unit functions for tests/execution/test_executors.py, at module level so that spawned pool workers
and Ray workers import them by name (tests/ is on the Ray nodes' PYTHONPATH).

Each writes its own output directory ``out_dir/name`` atomically and returns early when
it exists, as sinkscope's real units do; ``drive`` is a driver run as a subprocess by the
interrupt test.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch

from sinkscope.execution import Unit, run_units, skip_finished
from sinkscope.execution.units import finished
from sinkscope.infra.atomic_io import atomic_directory, atomic_write_json, read_json

RESULT = "result.json"


def compute(out_dir: str, name: str, seed: int) -> list[float]:
    """A few steps of least squares on seeded data, written to ``out_dir/name/result.json``;
    the values are read back when that directory is already finished."""
    target = Path(out_dir) / name
    if finished(target, RESULT):
        return list(read_json(target / RESULT)["weights"])
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 4, generator=generator, dtype=torch.float64)
    y = x @ torch.randn(4, generator=generator, dtype=torch.float64)
    w = torch.zeros(4, dtype=torch.float64)
    for _ in range(50):
        w -= 0.1 * (2 * x.T @ (x @ w - y) / len(x))
    weights = w.tolist()
    with atomic_directory(target, replace=False) as staging:
        atomic_write_json(staging / RESULT, {"name": name, "seed": seed, "weights": weights})
    return weights


def fail(out_dir: str, name: str) -> None:
    raise ValueError(f"unit {name} refuses to run")


def die_once(out_dir: str, name: str, seed: int, marks: str) -> list[float]:
    """``compute``, except that the first attempt (marked by a file in ``marks``) kills its
    own worker process midway with SIGKILL, as the OOM killer or a lost node would."""
    mark = Path(marks) / f"{name}.attempt"
    if not mark.exists():
        mark.touch()
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    return compute(out_dir, name, seed)


def slow_compute(out_dir: str, name: str, seed: int, seconds: float) -> list[float]:
    if not finished(Path(out_dir) / name, RESULT):
        time.sleep(seconds)
    return compute(out_dir, name, seed)


def node_id(seconds: float) -> str:
    """The Ray node this unit ran on (after ``seconds``, so a batch spreads over the nodes)."""
    import ray

    time.sleep(seconds)
    return str(ray.get_runtime_context().get_node_id())


def device_of(seconds: float) -> tuple[str, bool]:
    """CUDA_VISIBLE_DEVICES as Ray set it for this unit, and whether torch sees a GPU."""
    return os.environ.get("CUDA_VISIBLE_DEVICES", ""), torch.cuda.is_available()


def slow_units(out_dir: str, n: int, seconds: float) -> list[Unit]:
    return [Unit(f"cell{i}", slow_compute, (out_dir, f"cell{i}", i, seconds)) for i in range(n)]


def drive(address: str, out_dir: str, n: int, seconds: float) -> None:
    """A driver as a command would run it: the slow units on the cluster at ``address``,
    finished ones skipped; prints the counts as one JSON line."""
    report = run_units(
        slow_units(out_dir, n, seconds),
        executor="ray",
        ray_address=address,
        skip=skip_finished(out_dir, RESULT),
        on_done=lambda name, _: print(f"done {name}", flush=True),
    )
    print(json.dumps({"finished": len(report.finished), "skipped": len(report.skipped)}), flush=True)


if __name__ == "__main__":
    drive(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
