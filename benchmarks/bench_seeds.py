"""K seeds trained as one vectorised computation against K training runs one after another.

    python benchmarks/bench_seeds.py [--seeds K] [--steps N] [--repeats R] [--cases 1x1,2x2] [--json PATH]

For each case (a paper architecture, softmax attention), K run configs that differ only in
the seed (0 .. K-1), each ``TrainConfig(max_steps=N, stop_linf=1e-12)`` so no run stops
early and both ways do exactly N steps per seed, with the trainer's defaults otherwise
(batches of 128, metrics logged every 100 steps, a checkpoint and the final weights
written at the end):
- ``sequential``: ``sinkscope.toy.train.train(config, run_dir)`` for each seed in turn;
- ``batched``: ``sinkscope.toy.train.train_seeds(configs, run_dirs)``, one call.
Every run writes into a fresh temporary directory (an existing one would resume). One CPU
thread, both ways in one process after a short warm-up of each, the order alternating
between repeats; each time is the median over the repeats. The ratio is sequential time
over batched time (target >= 3). The last repeat's results are compared seed by seed:
status, steps, and the largest relative difference in final loss and L-inf error.

When ``sinkscope.toy.train.train_seeds`` cannot be imported the benchmark reports it as not available.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from sinkscope.infra.codec import encode
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.run_dir import RunConfig, TrainConfig, TrainResult
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.train import train

CASES: dict[str, ToyModelConfig] = {
    "1x1": ToyModelConfig(n_layers=1, n_heads=1, attention="softmax"),
    "2x2": ToyModelConfig(n_layers=2, n_heads=2, attention="softmax"),
    "4x4": ToyModelConfig(n_layers=4, n_heads=4, attention="softmax"),
}
NEVER_STOP = 1e-12
WARMUP_STEPS = 5

BatchedTrainer = Callable[..., list[TrainResult]]


def load_batched_trainer() -> tuple[BatchedTrainer | None, str]:
    """``sinkscope.toy.train.train_seeds``, or None and why it is not available."""
    try:
        from sinkscope.toy.train import train_seeds as train_batched
    except Exception as error:  # ImportError, or a module that fails while importing
        return None, f"sinkscope.toy.train.train_seeds is not available ({type(error).__name__}: {error})"
    return train_batched, "sinkscope.toy.train.train_seeds"


def seed_configs(model: ToyModelConfig, k: int, steps: int) -> list[RunConfig]:
    """K configs identical except the seed."""
    task = TaskConfig(d_model=model.d_model, seq_len=model.seq_len)
    return [RunConfig(model, task, TrainConfig(seed=seed, max_steps=steps, stop_linf=NEVER_STOP)) for seed in range(k)]


def run_sequential(configs: list[RunConfig], root: Path) -> tuple[float, list[TrainResult]]:
    dirs = [root / f"seed{config.train.seed}" for config in configs]
    started = time.perf_counter()
    results = [train(config, run_dir, resume=False, progress=False) for config, run_dir in zip(configs, dirs)]
    return time.perf_counter() - started, results


def run_batched(train_batched: BatchedTrainer, configs: list[RunConfig], root: Path) -> tuple[float, list[TrainResult]]:
    dirs = [root / f"seed{config.train.seed}" for config in configs]
    started = time.perf_counter()
    results = list(train_batched(configs, dirs, progress=False))
    return time.perf_counter() - started, results


def _rel(a: float, b: float) -> float:
    if a == b:
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def agreement(sequential: list[TrainResult], batched: list[TrainResult]) -> dict:
    """How the batched results match the one-by-one results, seed by seed."""
    if len(sequential) != len(batched):
        return {
            "same_count": False,
            "same_status": False,
            "same_steps": False,
            "max_rel_loss": math.inf,
            "max_rel_linf": math.inf,
        }
    return {
        "same_count": True,
        "same_status": all(s.status == b.status for s, b in zip(sequential, batched)),
        "same_steps": all(s.steps == b.steps for s, b in zip(sequential, batched)),
        "max_rel_loss": max(_rel(s.loss, b.loss) for s, b in zip(sequential, batched)),
        "max_rel_linf": max(_rel(s.linf_error, b.linf_error) for s, b in zip(sequential, batched)),
    }


def bench_case(train_batched: BatchedTrainer, name: str, k: int, steps: int, repeats: int) -> dict:
    model = CASES[name]
    configs = seed_configs(model, k, steps)
    with tempfile.TemporaryDirectory(prefix="bench_seeds_") as tmp:
        root = Path(tmp)
        run_sequential(seed_configs(model, k, WARMUP_STEPS), root / "warm-seq")
        run_batched(train_batched, seed_configs(model, k, WARMUP_STEPS), root / "warm-batched")
        times: dict[str, list[float]] = {"sequential": [], "batched": []}
        last: dict[str, list[TrainResult]] = {}
        for repeat in range(repeats):
            order = ("sequential", "batched") if repeat % 2 == 0 else ("batched", "sequential")
            for way in order:
                target = root / f"{way}-{repeat}"
                if way == "sequential":
                    seconds, results = run_sequential(configs, target)
                else:
                    seconds, results = run_batched(train_batched, configs, target)
                times[way].append(seconds)
                last[way] = results
    sequential, batched = statistics.median(times["sequential"]), statistics.median(times["batched"])
    return {
        "case": f"{name} {model.attention}",
        "model": encode(model),
        "seeds": k,
        "steps": steps,
        "repeats": repeats,
        "sequential_s": sequential,
        "batched_s": batched,
        "speedup": sequential / batched,
        "median_paired_speedup": statistics.median(s / b for s, b in zip(times["sequential"], times["batched"])),
        "sequential_runs_s": times["sequential"],
        "batched_runs_s": times["batched"],
        "agreement": agreement(last["sequential"], last["batched"]),
    }


def format_table(results: list[dict]) -> str:
    header = (
        f"{'config':<12} {'K':>3} {'steps':>6} {'sequential s':>13} {'batched s':>10} {'speedup':>8} "
        f"{'paired':>7} {'same status':>12} {'max rel loss diff':>18}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        a = r["agreement"]
        lines.append(
            f"{r['case']:<12} {r['seeds']:>3} {r['steps']:>6} {r['sequential_s']:>13.2f} {r['batched_s']:>10.2f} "
            f"{r['speedup']:>8.2f} {r['median_paired_speedup']:>7.2f} {str(a['same_status'] and a['same_steps']):>12} "
            f"{a['max_rel_loss']:>18.2e}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=8, help="K, the seeds trained together (default 8)")
    parser.add_argument("--steps", type=int, default=300, help="training steps per seed (default 300)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per way; the median is reported (default 3)")
    parser.add_argument(
        "--cases", default="1x1,2x2", help=f"comma-separated architectures among {', '.join(CASES)} (default 1x1,2x2)"
    )
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    cases = [case.strip() for case in args.cases.split(",") if case.strip()]
    unknown = [case for case in cases if case not in CASES]
    if unknown or not cases:
        parser.error(f"--cases takes names among {', '.join(CASES)}, got {args.cases!r}")
    if min(args.seeds, args.steps, args.repeats) < 1:
        parser.error("--seeds, --steps and --repeats must be >= 1")

    torch.set_num_threads(1)
    train_batched, source = load_batched_trainer()
    if train_batched is None:
        print(f"K={args.seeds} seeds vectorised vs sequential: not available: {source}")
        return 0
    results = [bench_case(train_batched, case, args.seeds, args.steps, args.repeats) for case in cases]
    print(
        f"K={args.seeds} seeds, batched vs sequential, {args.steps} steps x {args.repeats} repeats, 1 thread, torch {torch.__version__}"
    )
    print(format_table(results))
    worst = min(r["speedup"] for r in results)
    print(f"worst speedup {worst:.2f}x (target >= 3x): {'ok' if worst >= 3 else 'NOT MET'}")
    if args.json is not None:
        from sinkscope.infra.atomic_io import atomic_write_json

        atomic_write_json(
            args.json,
            {
                "benchmark": "seeds",
                "torch": torch.__version__,
                "python": platform.python_version(),
                "threads": torch.get_num_threads(),
                "results": results,
            },
        )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
