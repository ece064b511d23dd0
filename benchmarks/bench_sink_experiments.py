"""What the sink experiments add to an audit, on the shapes of ``bench_audit.py``.

    python benchmarks/bench_sink_experiments.py [--shape smollm2-135m] [--prompts N] [--tokens T] [--repeats R]

Same model and prompts as ``bench_audit.py`` (random weights, N random-token prompts of T
tokens, BOS first, batches of 16, one CPU thread). Ways, each the median over R timed
runs after one warm-up, the order rotating between repeats, timed as the process's CPU
time (``time.process_time``: one thread, so the work done, which a busy machine's other
processes do not inflate as they do wall-clock time):
- ``bare trunk``: the bridge's forward ended after the last block (where the audit ends);
- ``audit``: the default audit (no experiment; figures not drawn);
- ``+ eps curve``: the audit with ``eps_curve`` of 9 values (the same pass keeps each prompt's alpha);
- ``+ lengths``: the audit with ``lengths`` T/8, T/4, T/2, T (read from the same pass);
- ``+ input types``: the audit with prompts, random and repeated (two more pattern-only passes);
- ``+ all``: all three.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_audit import SHAPES, Setup, build_model, harness, runner  # noqa: E402
from sinkscope.pretrained_analysis.audit import AuditConfig, audit  # noqa: E402

EPS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def configs(tokens: int, batch_size: int) -> dict[str, AuditConfig]:
    lengths = tuple(sorted({max(2, tokens // 8), max(2, tokens // 4), max(2, tokens // 2), tokens}))
    kinds = ("prompts", "random", "repeated")
    base = {"batch_size": batch_size, "n_examples": 0}
    return {
        "audit": AuditConfig(**base),
        "+ eps curve": AuditConfig(**base, eps_curve=EPS),
        "+ lengths": AuditConfig(**base, lengths=lengths),
        "+ input types": AuditConfig(**base, input_types=kinds),
        "+ all": AuditConfig(**base, input_types=kinds, eps_curve=EPS, lengths=lengths),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=tuple(SHAPES), default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench_sink_experiments_") as model_dir:
        build_model(model_dir, args.shape)
        setup = Setup(model_dir, args.prompts, args.tokens, 16)
        h = harness(setup, "audit")
        runs = {"bare trunk": runner(h, "bare trunk", setup.batch_size)}
        for name, config in configs(args.tokens, setup.batch_size).items():
            runs[name] = lambda config=config: audit(h.loaded, h.prompt_set, config, progress=False)
        times: dict[str, list[float]] = {name: [] for name in runs}
        names = list(runs)
        for run in runs.values():
            run()
        for repeat in range(args.repeats):
            shift = repeat % len(names)
            for name in names[shift:] + names[:shift]:
                started = time.process_time()
                runs[name]()
                times[name].append(time.process_time() - started)
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"{SHAPES[args.shape]}, {args.prompts} prompts x {args.tokens} tokens, {args.repeats} repeats, 1 thread")
    print(f"{'way':<16}{'CPU s':>9}{'x trunk':>9}{'x audit':>9}")
    for name, seconds in median.items():
        print(f"{name:<16}{seconds:>9.2f}{seconds / median['bare trunk']:>9.2f}{seconds / median['audit']:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
