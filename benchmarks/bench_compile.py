"""The toy training step compiled (``torch.compile``) against eager, in one run.

    python benchmarks/bench_compile.py [--device cpu] [--cases 1x1,2x2,4x4] [--seeds 1,8]
                                       [--steps 300] [--rounds 3] [--json PATH]

For each case (a paper architecture, softmax attention) and each K (seeds trained as one
stack), two stacks of the same K seeds are built from fresh run directories:
- ``eager``: what ``train_seeds(..., compile="off")`` steps on that device: on the CPU the
  host-side stop rule (one read of the step's L-inf per step), on CUDA the device-side
  rule (no read per step);
- ``compiled``: the device-side step (``sinkscope.toy.device_stop.device_step``) under
  ``torch.compile`` (CUDA: ``mode="reduce-overhead"``), what ``compile="on"`` steps.
Both draw each seed's batch from its own generator, as the trainer does; the compiled
step covers forward, MSE, backward and Adam. After one host step (Adam's state) and the
compile (its first calls, timed: ``compile_s``), blocks of ``--steps`` steps alternate
between the two ways for ``--rounds`` rounds; steps per second is the median over the
rounds, seed-steps per second is that times K, and the ratio is compiled over eager;
``cudagraph_skips`` counts the graphs inductor ran without CUDA graphs (0 is the aim).
``stop_linf=1e-12`` so no seed stops. One torch thread on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch._dynamo.utils import counters

from sinkscope.toy.device_stop import DeviceStop, device_step
from sinkscope.toy.interrupt import StepBoundaryInterrupt
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.run_dir import RunConfig, TrainConfig
from sinkscope.toy.run_member import RunMember, open_run
from sinkscope.toy.seed_stack import StackTraining
from sinkscope.toy.task import TaskConfig

NEVER = 10**9  # no log, checkpoint or end inside a timed block


def _training(layers: int, heads: int, k: int, device: torch.device, root: Path, name: str) -> StackTraining:
    members = []
    for seed in range(k):
        config = RunConfig(
            ToyModelConfig(n_layers=layers, n_heads=heads),
            TaskConfig(),
            TrainConfig(seed=seed, max_steps=NEVER, stop_linf=1e-12, log_every=NEVER, checkpoint_every=NEVER),
        )
        member = open_run(config, root / f"{name}{seed}", False, device)
        assert isinstance(member, RunMember)
        members.append(member)
    training = StackTraining(members, False, None, device.type != "cpu", False)
    training.train_step(StepBoundaryInterrupt())  # step 0: a host step makes Adam's state
    return training


def _stepper(training: StackTraining, compiled: bool) -> Callable[[], None]:
    """One training step of ``training``'s stack, the way ``compile=on|off`` takes it."""
    stack, interrupt = training.stack, StepBoundaryInterrupt()
    assert stack is not None
    device = stack.parameters()[0].device
    if not compiled and device.type == "cpu":
        return lambda: None if training.train_step(interrupt) else None
    stop = DeviceStop(len(stack.members), training.train_cfg.stop_linf, device)
    step_once = device_step(
        stack.forward, stack.functional_forward, stack.parameters(), stack.optimizer, stop, compiled
    )

    def step() -> None:
        _, tokens, targets = training._draw_batches()
        step_once(tokens, targets)

    return step


def _timed(step: Callable[[], None], steps: int, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def measure_case(layers: int, heads: int, k: int, device: torch.device, steps: int, rounds: int) -> dict:
    """Steps per second, eager and compiled, for one architecture and K."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        eager = _stepper(_training(layers, heads, k, device, root, "e"), compiled=False)
        compiled = _stepper(_training(layers, heads, k, device, root, "c"), compiled=True)
        compile_s = _timed(compiled, 3, device)
        _timed(eager, 10, device)
        times: dict[str, list[float]] = {"eager": [], "compiled": []}
        for index in range(rounds):
            order = ("eager", "compiled") if index % 2 == 0 else ("compiled", "eager")
            for way in order:
                times[way].append(_timed(eager if way == "eager" else compiled, steps, device))
    rates = {way: steps / statistics.median(seconds) for way, seconds in times.items()}
    return {
        "case": f"{layers}x{heads}",
        "k": k,
        "eager_steps_per_s": round(rates["eager"], 1),
        "compiled_steps_per_s": round(rates["compiled"], 1),
        "eager_seed_steps_per_s": round(rates["eager"] * k, 1),
        "compiled_seed_steps_per_s": round(rates["compiled"] * k, 1),
        "ratio": round(rates["compiled"] / rates["eager"], 3),
        "compile_s": round(compile_s, 1),
        # issue 38: a skipped CUDA graph (inductor's count, this process so far) leaves the step launch-bound
        "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
    }


def markdown_table(cases: list[dict]) -> str:
    """The figures as RESULTS.md's table: one row per case and K."""
    lines = [
        "| case | K | eager steps/s | compiled steps/s | eager seed-steps/s | compiled seed-steps/s "
        "| compiled / eager | compile time (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in cases:
        lines.append(
            f"| {row['case']} | {row['k']} | {row['eager_steps_per_s']:,.1f} | {row['compiled_steps_per_s']:,.1f} "
            f"| {row['eager_seed_steps_per_s']:,.1f} | {row['compiled_seed_steps_per_s']:,.1f} "
            f"| {row['ratio']:.2f}x | {row['compile_s']:.0f} |"
        )
    return "\n".join(lines)


def machine() -> dict:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    info = {"torch": torch.__version__, "python": platform.python_version(), "load_1min": load}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    info["cores"] = os.cpu_count()
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cases", default="1x1,2x2,4x4")
    parser.add_argument("--seeds", default="1,8", help="the K values, comma-separated")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    report = {"device": str(device), "machine_start": machine(), "steps": args.steps, "rounds": args.rounds}
    report["cases"] = []
    for case in args.cases.split(","):
        layers, heads = (int(n) for n in case.split("x"))
        for k in (int(n) for n in args.seeds.split(",")):
            row = measure_case(layers, heads, k, device, args.steps, args.rounds)
            report["cases"].append(row)
            print(json.dumps(row), flush=True)
    report["machine_end"] = machine()
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(markdown_table(report["cases"]))


if __name__ == "__main__":
    main()
