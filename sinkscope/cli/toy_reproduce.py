"""`sinkscope toy reproduce`: the paper's six models, trained and evaluated."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sinkscope.cli.args import (
    POSITIVE,
    add_experiment,
    check_executor,
    experiment_options,
    out_path,
    say,
    within,
)
from sinkscope.cli.inputs import CommandPaths, training_paths
from sinkscope.infra.bounds import SEEDS
from sinkscope.infra.codec import encode

EXAMPLES = """examples:
  sinkscope toy reproduce --quick --out sinkscope-out/toy-quick   # ~4 min on 2 cores
  sinkscope toy reproduce --seeds 1 --out sinkscope-out/toy       # the paper's six models
  sinkscope toy reproduce --seeds 3 --out sinkscope-out/toy3      # three seeds each
  WANDB_MODE=offline sinkscope toy reproduce --quick --out sinkscope-out/toy-quick --wandb sinks  # W&B, no network
"""


def add_parser(commands: argparse._SubParsersAction) -> None:
    reproduce = commands.add_parser(
        "reproduce",
        help="train and evaluate the paper's six models; write summary.json/.md and heatmaps",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    reproduce.add_argument(
        "--out",
        type=out_path,
        dest="out_dir",
        metavar="OUT",
        required=True,
        help="output directory (re-running resumes it)",
    )
    reproduce.add_argument("--seeds", type=within(SEEDS), default=None, help="seeds per model (default 3; --quick: 1)")
    reproduce.add_argument("--quick", action="store_true", help="reduced preset: one seed, at most 8,000 steps")
    reproduce.add_argument("--max-steps", type=POSITIVE, default=None, help="step cap per model (default 50,000)")
    add_experiment(reproduce, 1000, "test sequences for heatmaps and tables")


def paths(args: argparse.Namespace) -> CommandPaths:
    return training_paths(args.out_dir, args.tensorboard_dir)


def run(args: argparse.Namespace) -> dict:
    check_executor(args)
    if not args.no_progress:  # torch's import is seconds of silence on a busy machine
        print("importing torch ...", file=sys.stderr, flush=True)
    from sinkscope.toy.reproduce import ReproduceConfig, reproduce

    overrides = {"n_sequences": args.n_sequences, "workers": args.workers}
    if args.seeds is not None:
        overrides["seeds"] = args.seeds
    if args.max_steps is not None:
        overrides["max_steps"] = args.max_steps
    config = ReproduceConfig.quick(**overrides) if args.quick else ReproduceConfig(**overrides)
    summary = reproduce(config, args.out_dir, **experiment_options(args))
    if not args.json:
        from sinkscope.reports.text import table_terminal
        from sinkscope.toy.paper_reference import PAPER_CITATION
        from sinkscope.toy.tables import MODEL_TABLE

        say(table_terminal(MODEL_TABLE.table(summary.models)))
        failed = [c for c in summary.checks if not c.passed]
        say(
            f"{len(summary.checks) - len(failed)} of {len(summary.checks)} checks against the paper pass"
            + (": failing: " + "; ".join(c.claim for c in failed) if failed else "")
        )
        say(f"the paper: {PAPER_CITATION}")
        say(f"wrote {Path(args.out_dir) / 'summary.json'}; `sinkscope report {args.out_dir}` writes its report")
    return encode(summary)
