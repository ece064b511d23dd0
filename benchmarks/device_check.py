"""Issue 26's GPU checks in one call on an accelerator machine; writes ``device_check.json``.

    bash benchmarks/device_check.sh          # on the device machine (it installs, then runs this)
    python benchmarks/device_check.py --out DIR [--budget-s 560] [--device cuda]

Stages, each bounded by what is left of ``--budget-s`` (a stage that runs out is recorded
as timed out, with what it got so far), the JSON rewritten after each:
1. ``pytest -m cuda`` over tests/ (the CUDA tests; counts of passed, failed, skipped);
2. ``benchmarks/bench_compile.py``: steps/s at K = 1 and seed-steps/s at K = 8, 64, 512,
   eager against compiled, for 4x4 (and 1x1 at K = 512), each with its compile time;
3. ``sinkscope toy reproduce --seeds 8 --device cuda``: wall time and checks passed (of 136);
4. ``sinkscope toy sweep --preset phase --device cuda``: models finished and wall time
   (the full diagram is 1,024 models; a stage cut short says how many finished).
The targets (issue 26): 4x4 >= 1,500 steps/s; K = 512 >= 20,000 seed-steps/s; the
reproduction within 90 s with 136/136 checks; the phase diagram within 15 minutes.
``--device cpu`` runs the same stages small (a dry run of this script without a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Budget:
    def __init__(self, seconds: float) -> None:
        self.ends = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.ends - time.monotonic())


def run_stage(command: list[str], budget: Budget, share: float, log: Path) -> dict:
    """``command`` with at most ``share`` of the budget left; its exit code, wall time and
    output (kept in ``log``)."""
    limit = max(5.0, budget.left() * share)
    started = time.monotonic()
    with log.open("w") as out:
        try:
            code = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            code = None
    return {
        "command": " ".join(command),
        "exit_code": code,
        "timed_out": code is None,
        "limit_s": round(limit, 1),
        "wall_s": round(time.monotonic() - started, 1),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "device-check-out")))
    parser.add_argument("--budget-s", type=float, default=560.0)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "sinkscope-device-check"
    small = args.device == "cpu"
    budget, figures = Budget(args.budget_s), {"device": args.device, "stages": {}}
    report = args.out / "device_check.json"

    def save() -> None:
        report.write_text(json.dumps(figures, indent=2) + "\n")

    tests = ["-m", "pytest", "-q", "-m", "cuda", "tests/", "-p", "no:cacheprovider"]
    stage = run_stage([sys.executable, *tests], budget, 0.2, args.out / "pytest_cuda.log")
    figures["stages"]["pytest_cuda"] = {**stage, **pytest_counts((args.out / "pytest_cuda.log").read_text())}
    save()
    bench = [sys.executable, "benchmarks/bench_compile.py", "--device", args.device, "--rounds", "2"]
    sizes = ["--cases", "1x1", "--seeds", "1,2", "--steps", "20"] if small else ["--steps", "200"]
    for name, extra in (
        ("bench_4x4", ["--cases", "4x4", "--seeds", "1,8,64,512"]),
        ("bench_1x1", ["--cases", "1x1", "--seeds", "512"]),
    ):
        json_path = args.out / f"{name}.json"
        cmd = [*bench, *(extra if not small else []), *sizes, "--json", str(json_path)]
        stage = run_stage(cmd, budget, 0.35, args.out / f"{name}.log")
        lines = (args.out / f"{name}.log").read_text().splitlines()
        stage["cases"] = [json.loads(line) for line in lines if line.startswith("{")]
        figures["stages"][name] = stage
        save()
    seeds = "1" if small else "8"
    repro_out = work / "reproduce"
    repro = ["sinkscope", "toy", "reproduce", "--seeds", seeds, "--device", args.device, "--out", str(repro_out)]
    repro += ["--overwrite", "--no-progress", "--workers", "2"] + (["--quick"] if small else [])
    stage = run_stage(repro, budget, 0.5, args.out / "reproduce.log")
    figures["stages"]["reproduce"] = {**stage, **checks_passed(repro_out)}
    save()
    sweep_out = work / "sweep"
    sweep = ["sinkscope", "toy", "sweep", "--preset", "phase", "--device", args.device, "--out", str(sweep_out)]
    sweep += ["--overwrite", "--no-progress"] + (["--max-steps", "50", "--sequences", "20"] if small else [])
    stage = run_stage(sweep, budget, 1.0, args.out / "sweep.log")
    figures["stages"]["phase_sweep"] = {**stage, "models_finished": models_finished(sweep_out)}
    save()
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
