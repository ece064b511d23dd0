"""`sinkscope toy probe`: sink probes and the default-state test on a trained run."""

from __future__ import annotations

import argparse

from sinkscope.cli.args import add_common_output, add_layers, out_path, say, within
from sinkscope.cli.inputs import CommandPaths, run_analysis_paths
from sinkscope.infra.bounds import SAMPLES
from sinkscope.infra.codec import encode

EXAMPLES = """examples:
  sinkscope toy probe sinkscope-out/toy-quick/softmax-2x2-seed0
  sinkscope toy probe runs/relu-1x1 --out probes/relu-1x1 --sequences 500 --json
  sinkscope toy probe runs/softmax-2x2 --layers 1 --out probes/softmax-2x2-layer1
"""


def add_parser(commands: argparse._SubParsersAction) -> None:
    probe = commands.add_parser(
        "probe",
        help="sink probes and the default-state test on a trained toy run",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    probe.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by toy train/reproduce")
    probe.add_argument(
        "--out",
        type=out_path,
        dest="out_dir",
        metavar="OUT",
        default=None,
        help="output directory (default RUN_DIR/probe)",
    )
    probe.add_argument(
        "--sequences",
        dest="n_sequences",
        metavar="SEQUENCES",
        type=within(SAMPLES),
        default=1000,
        help="test sequences (default 1000)",
    )
    probe.add_argument("--overwrite", action="store_true", help="replace an existing, non-empty --out")
    probe.add_argument(
        "--allow-unfinished",
        action="store_true",
        help="probe an interrupted or diverged run's latest weights anyway (the result says so)",
    )
    add_layers(probe, "the default-state test removes the sinks of sink heads in these layers")
    add_common_output(probe)


def paths(args: argparse.Namespace) -> CommandPaths:
    return run_analysis_paths(args.run_dir, args.out_dir, "probe")


def run(args: argparse.Namespace) -> dict:
    from sinkscope.toy.probe_run import probe_run

    report = probe_run(
        args.run_dir,
        args.out_dir,
        args.n_sequences,
        overwrite=args.overwrite,
        allow_unfinished=args.allow_unfinished,
        layers=args.layers,
    )
    if not args.json:
        state = report.default_state
        say(
            f"sink heads: {len(report.probe.sink_heads())} of {len(report.probe.heads)}; "
            f"layer outputs: norm of sum {report.probe.attn_out_norm_of_sum:.3g} vs sum of norms "
            f"{report.probe.attn_out_sum_of_norms:.3g}"
        )
        if state.default_error_before is not None:
            say(
                f"default-state test: default-position MSE {state.default_error_before:.2e} -> "
                f"{state.default_error_after_remove:.2e} with the sinks removed, "
                f"{state.default_error_after_control:.2e} with the matched control"
            )
        else:
            say(f"default-state test: {state.note}")
        for note in report.probe.notes:
            if "allow_unfinished" in note:
                say(f"note: {note}")
        say(f"wrote {', '.join(report.files)} in {report.out_dir}")
    return encode(report)
