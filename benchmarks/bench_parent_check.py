"""What the step-boundary parent check costs a pool worker's training, side by side.

    python benchmarks/bench_parent_check.py [--steps N] [--rounds R]

A pool worker checks at every training step that its driver is still its parent
(``sinkscope.execution.worker_lifetime.parent_gone``: one ``getppid`` call). The same
1x1 run of N steps (the cheapest step, so the largest share for the check; ``stop_linf=1e-12``
so it never stops early) is timed R times each way, alternating, in one process:
- ``off``: as in the driver process, where no parent is recorded (the check is one
  comparison);
- ``on``: as in a pool worker, with this process's parent recorded (the check calls
  ``getppid`` and finds it alive).
Speed is steps over the trainer's own wall time; the ratio is on over off (median of rounds).
The cost of one check, timed alone, is printed too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import timeit
from pathlib import Path

from sinkscope.execution import worker_lifetime
from sinkscope.toy.interrupt import StepBoundaryInterrupt
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.run_dir import RunConfig, TrainConfig
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.train import train


def steps_per_second(steps: int, parent: int | None, workdir: Path) -> float:
    worker_lifetime._parent_pid = parent
    config = RunConfig(
        ToyModelConfig(n_layers=1, n_heads=1),
        TaskConfig(),
        TrainConfig(max_steps=steps, stop_linf=1e-12, checkpoint_every=10 * steps),
    )
    result = train(config, Path(tempfile.mkdtemp(dir=workdir)) / "run", progress=False)
    worker_lifetime._parent_pid = None
    return result.steps / result.wall_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    speeds: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="bench_parent_check_") as tmp:
        steps_per_second(50, None, Path(tmp))  # warm-up
        for _ in range(args.rounds):
            speeds["off"].append(steps_per_second(args.steps, None, Path(tmp)))
            speeds["on"].append(steps_per_second(args.steps, os.getppid(), Path(tmp)))
    off, on = statistics.median(speeds["off"]), statistics.median(speeds["on"])
    latch = StepBoundaryInterrupt()
    worker_lifetime._parent_pid = os.getppid()
    per_check = min(timeit.repeat(lambda: latch.requested, number=100_000, repeat=5)) / 100_000
    worker_lifetime._parent_pid = None
    print(f"1x1, {args.steps} steps, {args.rounds} rounds each, alternating")
    print(f"off: {off:.1f} steps/s  (rounds: {', '.join(f'{s:.1f}' for s in speeds['off'])})")
    print(f"on:  {on:.1f} steps/s  (rounds: {', '.join(f'{s:.1f}' for s in speeds['on'])})")
    print(f"ratio on/off: {on / off:.3f}; one check: {per_check * 1e9:.0f} ns, {per_check * off:.2e} of a step")


if __name__ == "__main__":
    main()
