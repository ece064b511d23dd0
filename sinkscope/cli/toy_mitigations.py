"""`sinkscope toy mitigations`: every sink-removing attention kind on the paper's task,
with the theory's prediction of where its default state lives beside the measurement."""

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
    str_list,
    within,
)
from sinkscope.cli.inputs import CommandPaths, training_paths
from sinkscope.infra.bounds import SEEDS
from sinkscope.infra.codec import encode

EXAMPLES = """examples:
  sinkscope toy mitigations --quick --out sinkscope-out/mitigations-quick   # 1x1 models, 3 seeds: ~4 min on 2 cores
  sinkscope toy mitigations --out sinkscope-out/mitigations                 # 1x1, 2x2 and 4x4, 3 seeds each
  sinkscope toy mitigations --kinds softmax,learned_sink,gated_head --seeds 5 --out out/three-kinds
"""


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "mitigations",
        help="train every sink-removing attention kind on the paper's task; where does the default state go?",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--out",
        type=out_path,
        dest="out_dir",
        metavar="OUT",
        required=True,
        help="output directory (re-running resumes it)",
    )
    parser.add_argument(
        "--kinds",
        type=str_list,
        default=None,
        help="comma-separated attention kinds (default: softmax, relu and every mitigation kind)",
    )
    parser.add_argument("--seeds", type=within(SEEDS), default=None, help="seeds per kind and architecture (default 3)")
    parser.add_argument("--quick", action="store_true", help="reduced preset: the 1x1 models, at most 8,000 steps")
    parser.add_argument("--max-steps", type=POSITIVE, default=None, help="step cap per model (default 50,000)")
    add_experiment(parser, 1000, "test sequences for the tables and default-state tests")


def paths(args: argparse.Namespace) -> CommandPaths:
    return training_paths(args.out_dir, args.tensorboard_dir)


def run(args: argparse.Namespace) -> dict:
    check_executor(args)
    if not args.no_progress:  # torch's import is seconds of silence on a busy machine
        print("importing torch ...", file=sys.stderr, flush=True)
    from sinkscope.toy.mitigations import MitigationsConfig, compare_mitigations

    overrides: dict = {"n_sequences": args.n_sequences, "workers": args.workers}
    for name in ("kinds", "seeds", "max_steps"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    config = MitigationsConfig.quick(**overrides) if args.quick else MitigationsConfig(**overrides)
    summary = compare_mitigations(config, args.out_dir, **experiment_options(args))
    if not args.json:
        from sinkscope.reports.text import table_terminal
        from sinkscope.toy.mitigations_report import COST_TABLE, KIND_TABLE, kind_findings

        say(table_terminal(KIND_TABLE.table(summary.kinds)))
        say(table_terminal(COST_TABLE.table(summary.kinds)))
        for sentence in kind_findings(summary):
            say(sentence)
        say(f"wrote {Path(args.out_dir) / 'summary.json'}; `sinkscope report {args.out_dir}` writes its report")
    return encode(summary)
