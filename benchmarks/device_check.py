"""Issues 26 and 38's GPU checks in one call on an accelerator machine; writes ``device_check.json``.

    bash benchmarks/device_check.sh          # on the device machine (it installs, then runs this)
    python benchmarks/device_check.py --out DIR [--budget-s 480] [--device cuda]

Sized for a 15-minute device lease (a few minutes to start the machine, then one call of
``--budget-s`` seconds): each stage gets its share of the budget plus whatever the stages
before it left unused, never more than is left. A stage that runs out is recorded as timed
out, with what it got so far, and the JSON is rewritten after every stage:
1. ``pytest -m cuda`` over tests/ (the CUDA tests; counts of passed, failed, skipped),
   with the project's addopts off (no pytest-xdist needed) and collection errors not fatal;
2. ``benchmarks/bench_compile.py`` for 4x4 at K = 1, 8, 64 and 512, one stage each (a few
   steps per round): steps/s and seed-steps/s, eager against compiled, and compile time;
3. ``sinkscope toy reproduce --seeds 8 --device cuda``: wall time and checks passed;
4. a slice of ``sinkscope toy sweep --preset phase --device cuda`` (softmax and relu, one
   layer, 1-2 heads, no LayerNorm or MLP: 16 models): models finished and models per minute.
The targets (issues 26, 38): 4x4 K = 1 >= 1,500 steps/s; K = 512 >= 20,000 seed-steps/s; the
reproduction within 90 s with every check passing; the phase diagram within 15 minutes.
``--device cpu`` runs the same stages small (a dry run of this script without a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Budget:
    def __init__(self, seconds: float) -> None:
        self.ends = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.ends - time.monotonic())


class Shares:
    """Each stage's seconds: its share of the whole budget plus what earlier stages left."""

    def __init__(self, budget: Budget, total: float) -> None:
        self.budget, self.total, self.saved = budget, total, 0.0

    def limit(self, share: float) -> float:
        return max(5.0, min(self.budget.left(), share * self.total + self.saved))

    def spent(self, limit: float, wall: float) -> None:
        self.saved = max(0.0, limit - wall)


def run_stage(command: list[str], shares: Shares, share: float, log: Path) -> dict:
    """``command`` with its share of the budget (``Shares``); its exit code, wall time and
    output (kept in ``log``)."""
    limit = shares.limit(share)
    started = time.monotonic()
    with log.open("w") as out:
        # its own process group, so that a timeout also ends the workers a stage started
        # (reproduce --workers 2), which would otherwise run on while the next stage is timed
        try:
            process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        except FileNotFoundError as error:  # the install failed: no sinkscope command
            out.write(f"cannot start {command[0]}: {error}\n")
            code: int | None = 127
        else:
            try:
                code = process.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                code = None
    wall = time.monotonic() - started
    shares.spent(limit, wall)
    return {
        "command": " ".join(command),
        "exit_code": code,
        "timed_out": code is None,
        "limit_s": round(limit, 1),
        "wall_s": round(wall, 1),
    }


def pytest_counts(text: str) -> dict:
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", text)}


def checks_passed(out_dir: Path) -> dict:
    summary = out_dir / "summary.json"
    if not summary.is_file():
        return {}
    checks = json.loads(summary.read_text()).get("checks", [])
    return {"checks": len(checks), "checks_passed": sum(1 for c in checks if c.get("passed"))}


def models_finished(out_dir: Path) -> int:
    return sum(1 for _ in out_dir.rglob("evaluation.json"))


# each stage's share of --budget-s (they sum to 1)
SHARES = {"pytest_cuda": 0.16, "bench_k": 0.11, "reproduce": 0.22, "phase_sweep": 0.18}
BENCH_KS = (1, 8, 64, 512)


def bench_stages(args: argparse.Namespace, shares: Shares, figures: dict, save: Callable[[], None]) -> None:
    """bench_compile at each K, one stage (and one JSON save) each."""
    small = args.device == "cpu"
    for k in (1, 2) if small else BENCH_KS:
        name = f"bench_4x4_k{k}" if not small else f"bench_1x1_k{k}"
        cmd = [sys.executable, "benchmarks/bench_compile.py", "--device", args.device, "--rounds", "2"]
        cmd += ["--cases", "1x1" if small else "4x4", "--seeds", str(k), "--steps", "20" if small else "50"]
        stage = run_stage(
            [*cmd, "--json", str(args.out / f"{name}.json")], shares, SHARES["bench_k"], args.out / f"{name}.log"
        )
        lines = (args.out / f"{name}.log").read_text().splitlines()
        stage["cases"] = [json.loads(line) for line in lines if line.startswith("{")]
        figures["stages"][name] = stage
        save()


def training_stages(args: argparse.Namespace, shares: Shares, figures: dict, save: Callable[[], None]) -> None:
    """The 8-seed reproduction, then the phase-sweep slice (models per minute)."""
    small = args.device == "cpu"
    work = args.out / "runs"  # this check's own: a shared folder would count another check's models
    repro_out = work / "reproduce"
    repro = ["sinkscope", "toy", "reproduce", "--seeds", "1" if small else "8", "--device", args.device]
    repro += ["--out", str(repro_out), "--overwrite", "--no-progress", "--workers", "2"] + (
        ["--quick"] if small else []
    )
    stage = run_stage(repro, shares, SHARES["reproduce"], args.out / "reproduce.log")
    figures["stages"]["reproduce"] = {**stage, **checks_passed(repro_out)}
    save()
    sweep_out = work / "sweep"
    sweep = ["sinkscope", "toy", "sweep", "--preset", "phase", "--device", args.device, "--out", str(sweep_out)]
    sweep += ["--attention", "softmax,relu", "--layers", "1", "--heads", "1,2", "--layer-norm", "off", "--mlp", "off"]
    sweep += ["--overwrite", "--no-progress"] + (
        ["--max-steps", "50", "--sequences", "20", "--seeds", "1"] if small else []
    )
    stage = run_stage(sweep, shares, SHARES["phase_sweep"], args.out / "sweep.log")
    finished = models_finished(sweep_out)
    per_minute = round(60 * finished / stage["wall_s"], 1) if stage["wall_s"] else None
    figures["stages"]["phase_sweep"] = {**stage, "models_finished": finished, "models_per_minute": per_minute}
    save()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT", "device-check-out")), help="figures and logs ($OUT)"
    )
    parser.add_argument("--budget-s", type=float, default=480.0, help="seconds all stages share (default 480)")
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu for a small dry run")
    args = parser.parse_args()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("device_check: no CUDA device here; run it on a GPU machine, or pass --device cpu", file=sys.stderr)
        raise SystemExit(2)
    if (args.out / "runs").exists():  # the previous check's models would be counted as this one's
        shutil.rmtree(args.out / "runs")
    args.out.mkdir(parents=True, exist_ok=True)
    shares, figures = Shares(Budget(args.budget_s), args.budget_s), {"device": args.device, "stages": {}}
    report = args.out / "device_check.json"

    def save() -> None:
        report.write_text(json.dumps(figures, indent=2) + "\n")

    tests = ["-m", "pytest", "-q", "-m", "cuda", "tests/", "-p", "no:cacheprovider", "-o", "addopts="]
    tests += ["--continue-on-collection-errors", "-rs"]
    stage = run_stage([sys.executable, *tests], shares, SHARES["pytest_cuda"], args.out / "pytest_cuda.log")
    figures["stages"]["pytest_cuda"] = {**stage, **pytest_counts((args.out / "pytest_cuda.log").read_text())}
    save()
    bench_stages(args, shares, figures, save)
    training_stages(args, shares, figures, save)
    print(json.dumps(figures, indent=2))
    unfinished = [name for name, stage in figures["stages"].items() if stage.get("exit_code") != 0]
    if unfinished:  # a check whose stages timed out or failed must not read as a pass
        print(f"device_check: stages not finished: {', '.join(unfinished)}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
