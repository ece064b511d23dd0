"""`sinkscope toy patch`: activation patching on a trained run."""

from __future__ import annotations

import argparse
from pathlib import Path

from sinkscope.cli.args import add_common_output, out_path, say, within
from sinkscope.cli.inputs import CommandPaths, run_analysis_paths
from sinkscope.infra.bounds import SAMPLES
from sinkscope.infra.codec import encode

EXAMPLES = """examples:
  sinkscope toy patch sinkscope-out/toy-quick/softmax-2x2-seed0
  sinkscope toy patch runs/softmax-1x1 --out patches/softmax-1x1 --inputs 128 --json
"""


def add_parser(commands: argparse._SubParsersAction) -> None:
    patch = commands.add_parser(
        "patch",
        help="activation patching: triggered -> untriggered inputs, per head and per position",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    patch.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by toy train/reproduce")
    patch.add_argument(
        "--out",
        type=out_path,
        dest="out_dir",
        metavar="OUT",
        default=None,
        help="output directory (default RUN_DIR/patch)",
    )
    patch.add_argument(
        "--inputs",
        dest="n_inputs",
        metavar="INPUTS",
        type=within(SAMPLES),
        default=256,
        help="paired inputs (default 256)",
    )
    patch.add_argument("--overwrite", action="store_true", help="replace an existing, non-empty --out")
    patch.add_argument(
        "--allow-unfinished",
        action="store_true",
        help="patch an interrupted or diverged run's latest weights anyway (the result says so)",
    )
    add_common_output(patch)


def paths(args: argparse.Namespace) -> CommandPaths:
    return run_analysis_paths(args.run_dir, args.out_dir, "patch")


def run(args: argparse.Namespace) -> dict:
    from sinkscope.probes.tables import shown_position
    from sinkscope.toy.patching import patch_run

    result, files = patch_run(
        args.run_dir, args.out_dir, args.n_inputs, overwrite=args.overwrite, allow_unfinished=args.allow_unfinished
    )
    if not args.json:
        heads = result.per_head.matrix()
        say("z patched per (layer, head), normalised effect (1 = carries the trigger); layers and heads from 0:")
        for layer, row in enumerate(heads.tolist()):
            say(f"  layer {layer}: " + "  ".join(f"{value:+.2f}" for value in row))
        positions = result.per_position.matrix()
        strongest = int(positions.nan_to_num().abs().amax(dim=0).argmax())
        trigger = result.trigger_position
        say(
            f"resid_pre: the trigger lives at position {shown_position(strongest)} (the trigger is at position "
            f"{shown_position(trigger)}; positions counted from 1, BOS at 1)"
        )
        for note in result.per_head.notes:
            if "allow_unfinished" in note:
                say(f"note: {note}")
        out = args.out_dir or str(Path(args.run_dir) / "patch")
        say(f"wrote {', '.join(files)} in {out}")
    return encode(result)
