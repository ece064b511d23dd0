"""The Ray executor's overhead against the local one on the same batch of small units.

    python benchmarks/bench_executors.py [--units N] [--seconds S] [--workers W] [--repeats R] [--json PATH]

The batch: N units (default 8), each about S seconds (default 0.5) of single-threaded
torch work (a fixed number of 128x128 matrix products, calibrated once in this process),
each writing its result atomically into its own directory, as sinkscope's units do.
Three ways, each on a fresh output directory, W workers (default 2):
- ``local``: ``run_units(executor="local", workers=W)``, the spawned process pool
  (its start-up included);
- ``ray``: ``run_units(executor="ray", workers=W)``, which starts a local Ray instance of
  W CPUs for the run and shuts it down at the end (what a command pays);
- ``ray warm``: the same on a Ray instance this process started beforehand and whose
  workers have run the batch once (what each batch costs on a running cluster).
Times are medians over R repeats (default 3), the order of the ways alternating. The
ratios are ray / local and ray warm / local (overhead when > 1). Prints a table, then one
JSON line; ``--json`` also writes that JSON to a file.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sinkscope.execution import Unit, run_units  # noqa: E402
from sinkscope.infra.atomic_io import atomic_directory, atomic_write_json  # noqa: E402

SIZE = 128


def work(out_dir: str, name: str, seed: int, products: int) -> float:
    """``products`` matrix products on seeded data, one torch thread; the result is
    written to ``out_dir/name/result.json``."""
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(SIZE, SIZE, generator=generator) / SIZE**0.5
    x = torch.randn(SIZE, SIZE, generator=generator)
    for _ in range(products):
        x = torch.tanh(a @ x)
    value = float(x.sum())
    with atomic_directory(Path(out_dir) / name, replace=False) as staging:
        atomic_write_json(staging / "result.json", {"name": name, "value": value})
    return value


def calibrate(seconds: float) -> int:
    """How many products take about ``seconds`` here (one thread)."""
    with tempfile.TemporaryDirectory(prefix="bench_executors_calibrate_") as tmp:
        work(tmp, "warmup", 0, 200)
        start = time.perf_counter()
        work(tmp, "probe", 0, 2000)
        per_product = (time.perf_counter() - start) / 2000
    return max(1, round(seconds / per_product))


def units(out_dir: Path, n: int, products: int) -> list[Unit]:
    return [Unit(f"unit{i}", work, (str(out_dir), f"unit{i}", i, products)) for i in range(n)]


def timed(run: Callable[[], dict[str, float]]) -> tuple[float, dict[str, float]]:
    start = time.perf_counter()
    values = run()
    return time.perf_counter() - start, values


def bench(n: int, seconds: float, workers: int, repeats: int) -> dict:
    import ray

    # Ray's workers import this module (or unpickle its functions) with the same paths
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(BENCH_DIR), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    )
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    products = calibrate(seconds)
    times: dict[str, list[float]] = {"local": [], "ray": [], "ray warm": []}
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_executors_") as tmp:
        counter = iter(range(10**6))

        def way(name: str) -> Callable[[], dict[str, float]]:
            executor = "local" if name == "local" else "ray"
            return lambda: (
                run_units(
                    units(Path(tmp) / f"{next(counter)}", n, products), executor=executor, workers=workers
                ).finished
            )

        for repeat in range(repeats):
            order = ["local", "ray"] if repeat % 2 == 0 else ["ray", "local"]
            for name in order:
                elapsed, results[name] = timed(way(name))
                times[name].append(elapsed)
        ray.init(address="local", num_cpus=workers, include_dashboard=False, logging_level=logging.WARNING)
        try:
            timed(way("ray warm"))  # start the workers and import torch in them
            for _ in range(repeats):
                elapsed, results["ray warm"] = timed(way("ray warm"))
                times["ray warm"].append(elapsed)
        finally:
            ray.shutdown()
    if not results["local"] == results["ray"] == results["ray warm"]:
        raise RuntimeError("the executors returned different results for the same units")
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {
        "benchmark": "executors",
        "units": n,
        "unit_seconds": seconds,
        "products_per_unit": products,
        "workers": workers,
        "repeats": repeats,
        "cpus": os.cpu_count(),
        "ideal_s": n * seconds / workers,
        "local_s": round(medians["local"], 3),
        "ray_s": round(medians["ray"], 3),
        "ray_warm_s": round(medians["ray warm"], 3),
        "ratio": round(medians["ray"] / medians["local"], 3),
        "ratio_warm": round(medians["ray warm"] / medians["local"], 3),
        "times": {name: [round(value, 3) for value in values] for name, values in times.items()},
        "ray_version": ray.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def bench_default_sweep(workers: int = 2) -> dict:
    """The default ``toy sweep`` grid (54 models) once with the local executor and once on
    a local Ray instance started for the run, each into a fresh directory; the models must
    come out identical. Returns the walls and ray / local."""
    from sinkscope.infra.codec import encode
    from sinkscope.toy.sweep import SweepConfig, sweep

    config = SweepConfig(workers=workers)
    walls, models = {}, {}
    for executor in ("local", "ray"):
        with tempfile.TemporaryDirectory(prefix=f"bench_sweep_{executor}_") as tmp:
            start = time.perf_counter()
            result = sweep(config, Path(tmp) / "sweep", progress=False, executor=executor)
            walls[executor] = time.perf_counter() - start
            models[executor] = [{k: v for k, v in encode(m).items() if k != "wall_seconds"} for m in result.models]
    if models["ray"] != models["local"]:
        raise RuntimeError("the Ray executor's sweep differs from the local one")
    return {
        "models": len(models["local"]),
        "workers": workers,
        "local_s": walls["local"],
        "ray_s": walls["ray"],
        "ratio": walls["ray"] / walls["local"],
    }


def format_table(result: dict) -> str:
    rows = [
        ("local (process pool)", result["local_s"], 1.0),
        ("ray (instance started for the run)", result["ray_s"], result["ratio"]),
        ("ray warm (running instance)", result["ray_warm_s"], result["ratio_warm"]),
    ]
    lines = [f"{'executor':<36} {'wall s':>8} {'/ local':>8}"]
    lines += [f"{name:<36} {wall:>8.2f} {ratio:>8.2f}" for name, wall, ratio in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=8, help="units in the batch (default 8)")
    parser.add_argument("--seconds", type=float, default=0.5, help="work per unit in seconds (default 0.5)")
    parser.add_argument("--workers", type=int, default=2, help="processes / Ray CPUs (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per way; the median is reported (default 3)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if min(args.units, args.workers, args.repeats) < 1 or args.seconds <= 0:
        parser.error("--units, --workers and --repeats must be >= 1 and --seconds > 0")
    try:
        import ray  # noqa: F401
    except ImportError:
        print("ray executor overhead: not available (Ray is not installed: pip install 'sinkscope[ray]')")
        return 0
    torch.set_num_threads(1)
    result = bench(args.units, args.seconds, args.workers, args.repeats)
    print(
        f"{args.units} units of ~{args.seconds:g} s, {args.workers} workers, medians of {args.repeats}; "
        f"ideal {result['ideal_s']:.2f} s; ray {result['ray_version']}, torch {result['torch']}"
    )
    print(format_table(result))
    print(json.dumps(result))
    if args.json is not None:
        atomic_write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
