"""`sinkscope toy tradeoff`: Theorem 1's trade-off made visible."""

from __future__ import annotations

import argparse
from pathlib import Path

from sinkscope.cli.args import add_common_output, out_path, say
from sinkscope.cli.inputs import CommandPaths
from sinkscope.infra.codec import encode

EXAMPLES = """examples:
  sinkscope toy tradeoff --out sinkscope-out/tradeoff
  sinkscope toy tradeoff --run sinkscope-out/toy/softmax-1x1-seed0 --out sinkscope-out/tradeoff
"""


def add_parser(commands: argparse._SubParsersAction) -> None:
    tradeoff = commands.add_parser(
        "tradeoff",
        help="Theorem 1 made visible: off-trigger BOS mass vs default-position error",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tradeoff.add_argument(
        "--out",
        type=out_path,
        dest="out_dir",
        metavar="OUT",
        required=True,
        help="directory for tradeoff.json and tradeoff.png",
    )
    tradeoff.add_argument(
        "--run", action="append", default=[], help="a trained single-layer run directory to add (repeatable)"
    )
    tradeoff.add_argument("--overwrite", action="store_true", help="replace an existing, non-empty --out")
    tradeoff.add_argument(
        "--allow-unfinished",
        action="store_true",
        help="measure an interrupted or diverged run's latest weights anyway (the result says so)",
    )
    add_common_output(tradeoff)


def paths(args: argparse.Namespace) -> CommandPaths:
    return CommandPaths(Path(args.out_dir), tuple(Path(run) for run in args.run), reads_name="the run")


def run(args: argparse.Namespace) -> dict:
    from sinkscope.infra.atomic_io import atomic_directory, claim_output_directory
    from sinkscope.toy.tradeoff import unfinished_notes, write_tradeoff

    unfinished_notes([Path(run) for run in args.run], args.allow_unfinished)  # refused before --out is touched
    with claim_output_directory(args.out_dir, args.overwrite, args.run, "the run"):
        with atomic_directory(args.out_dir, replace=args.overwrite) as tmp:
            result = write_tradeoff(tmp, args.run, allow_unfinished=args.allow_unfinished)
    if not args.json:
        for note in result.notes:
            say(f"note: {note}")
        say(f"wrote {Path(args.out_dir) / 'tradeoff.png'} and {Path(args.out_dir) / 'tradeoff.json'}")
    return encode(result)
