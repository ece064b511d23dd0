"""Toy training on a shared machine: speed beside a CPU hog, as a ratio to idle speed.

    python benchmarks/bench_under_load.py [--steps N] [--hogs H] [--cases 1x1,4x4] [--json PATH]

A researcher's machine is rarely idle. For each case (a paper architecture, softmax
attention) and each way of training, the same run of N steps (``stop_linf=1e-12`` so it never
stops early; a fresh run directory each time) is timed twice in one session: on the idle
machine and beside H busy-looping processes (``--hogs``, default 1). Speed is steps over
the trainer's own wall time (``TrainResult.wall_seconds``), so process start-up is not
counted. The ways:
- ``api, 1 thread``: ``sinkscope.toy.train.train(config, run_dir)``, sinkscope's policy
  (``TRAIN_THREADS``);
- ``api, 2 threads``: ``train(..., threads=2)``: torch's default on a 2-core machine,
  what training used before the policy, the baseline;
- ``cli``: ``sinkscope toy train`` in a subprocess (the command-line path).
The ratio is loaded speed over idle speed (target >= 0.8 with one hog on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.run_dir import RunConfig, TrainConfig, read_train_result
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.train import train

CASES = {"1x1": (1, 1), "2x2": (2, 2), "4x4": (4, 4)}
WAYS = ("api, 1 thread", "api, 2 threads", "cli")


@dataclass(frozen=True)
class LoadRow:
    case: str
    way: str
    steps: int
    idle_steps_per_s: float
    loaded_steps_per_s: float

    @property
    def ratio(self) -> float:
        return self.loaded_steps_per_s / self.idle_steps_per_s


@contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """``count`` processes spinning on a core each for the block."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    time.sleep(0.5)  # let the scheduler see them busy
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def steps_per_second(case: str, way: str, steps: int, workdir: Path) -> float:
    layers, heads = CASES[case]
    run_dir = Path(tempfile.mkdtemp(dir=workdir)) / "run"
    if way == "cli":
        subprocess.run(
            [
                sys.executable,
                "-m",
                "sinkscope.cli",
                "toy",
                "train",
                "--out",
                str(run_dir),
                "--layers",
                str(layers),
                "--heads",
                str(heads),
                "--max-steps",
                str(steps),
                "--checkpoint-every",
                str(10 * steps),
                "--no-progress",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        result = read_train_result(run_dir)  # the default stop rule: a run that converges early still has a speed
    else:
        config = RunConfig(
            ToyModelConfig(n_layers=layers, n_heads=heads),
            TaskConfig(),
            TrainConfig(max_steps=steps, stop_linf=1e-12, checkpoint_every=10 * steps),
        )
        result = train(config, run_dir, progress=False, threads=1 if way == "api, 1 thread" else 2)
    return result.steps / result.wall_seconds


def bench(cases: list[str], steps: dict[str, int], hogs: int) -> list[LoadRow]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_under_load_") as tmp:
        workdir = Path(tmp)
        steps_per_second("1x1", "api, 1 thread", 20, workdir)  # warm-up
        for case in cases:
            for way in WAYS:
                idle = steps_per_second(case, way, steps[case], workdir)
                with cpu_hogs(hogs):
                    loaded = steps_per_second(case, way, steps[case], workdir)
                rows.append(LoadRow(case, way, steps[case], idle, loaded))
                print(
                    f"{case} {way}: idle {idle:.1f} steps/s, beside {hogs} hog(s) {loaded:.1f} steps/s "
                    f"({loaded / idle:.2f})",
                    flush=True,
                )
    return rows


def format_table(rows: list[LoadRow], hogs: int) -> str:
    lines = [
        f"| case | way | steps | idle steps/s | beside {hogs} hog(s) steps/s | ratio |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.case} | {r.way} | {r.steps} | {r.idle_steps_per_s:.1f} | {r.loaded_steps_per_s:.1f} | {r.ratio:.2f} |"
        for r in rows
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=None, help="steps per run (default 3000 for 1x1, 1200 for 2x2, 600 for 4x4)"
    )
    parser.add_argument("--hogs", type=int, default=1)
    parser.add_argument("--cases", default="1x1,4x4")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    cases = args.cases.split(",")
    steps = {case: args.steps or {"1x1": 3000, "2x2": 1200, "4x4": 600}[case] for case in cases}
    rows = bench(cases, steps, args.hogs)
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}\n")
    print(format_table(rows, args.hogs))
    if args.json:
        Path(args.json).write_text(json.dumps([{**asdict(r), "ratio": r.ratio} for r in rows], indent=2) + "\n")


if __name__ == "__main__":
    main()
