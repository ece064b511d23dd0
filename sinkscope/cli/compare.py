"""`sinkscope compare`: audits side by side, or toy runs and audits by sink head."""

from __future__ import annotations

import argparse
from pathlib import Path

from sinkscope.cli.args import add_common_output, fraction, out_path, say, within
from sinkscope.cli.inputs import CommandPaths
from sinkscope.infra.bounds import COUNT, SAMPLES
from sinkscope.infra.codec import encode
from sinkscope.infra.errors import InputError

EXAMPLES = """examples:
  sinkscope compare runs/a/pythia-70m-step1000 runs/b/pythia-70m-step143000 --out sinkscope-out/pythia-70m-steps
  sinkscope compare cluster-out/*/ --out sinkscope-out/all --overwrite && sinkscope report sinkscope-out/all

  sinkscope compare sinkscope-out/toy-quick sinkscope-out/audit/minilm --sink-eps 0.5 --out sinkscope-out/toy-vs-minilm
  sinkscope compare sinkscope-out/audit/gpt2 sinkscope-out/audit/pythia-70m --mechanism --out sinkscope-out/mech

When every DIR is an audit directory (audit.json), they must share their prompts and --sink-eps;
the audits are copied into --out (comparison.json), so the comparison and its report stand alone.
With a toy directory among them (a run, `toy probe` output, reproduction or sweep), an audit
comparison directory, or --mechanism, --out gets mechanism.json instead: every sink head of every
model with the shared probes (anchor mass, value-weighted anchor share, anchor value norm, dormant,
layer output norms and cancellation); --sink-eps implies it. A toy run without probe/probe.json
is probed here (nothing is written into it).
"""


def add_parser(commands: argparse._SubParsersAction) -> None:
    compare = commands.add_parser(
        "compare",
        help="compare audits written separately, or toy runs and audits side by side (shared probes per sink head)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    compare.add_argument(
        "directories",
        nargs="+",
        metavar="DIR",
        help="audit directories (audit.json), audit comparisons, toy runs, toy probes, reproductions or sweeps",
    )
    compare.add_argument(
        "--out", type=out_path, dest="out_dir", metavar="OUT", required=True, help="the comparison directory to write"
    )
    compare.add_argument(
        "--mechanism",
        action="store_true",
        help="write the toy-vs-pretrained sink-head comparison (mechanism.json) even when every DIR is an audit",
    )
    compare.add_argument(
        "--sequences",
        dest="n_sequences",
        type=within(SAMPLES),
        default=1000,
        help="figure-set sequences for a toy run probed here (no probe/probe.json; default 1000)",
    )
    compare.add_argument(
        "--sink-eps",
        type=fraction,
        default=None,
        help="sink heads have anchor mass >= 1 - EPS in every model (implies --mechanism; default: each "
        "probe's own, 0.1 unless audited otherwise; real LMs' heads rarely reach 0.9)",
    )
    compare.add_argument(
        "--allow-unfinished",
        action="store_true",
        help="probe toy runs that are still training or diverged (noted in the comparison) instead of refusing them",
    )
    compare.add_argument(
        "--steps",
        type=steps_flag,
        default=None,
        metavar="REV=STEP,...",
        help="training step of each revision, for a checkpoint suite drawn against the step (default: read from "
        "names such as step1000, checkpoint-1000)",
    )
    compare.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    add_common_output(compare)


def steps_flag(text: str) -> dict[str, int]:
    """``--steps``, parsed where argparse reads it (a bad pair: the one-line usage error)."""
    from sinkscope.pretrained_analysis.training_steps import parse_steps

    try:
        return parse_steps(text)
    except InputError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def paths(args: argparse.Namespace) -> CommandPaths:
    return CommandPaths(
        Path(args.out_dir), tuple(Path(directory) for directory in args.directories), reads_name="an input to compare"
    )


steps_flag.bound, steps_flag.value_format = COUNT, "main={}"  # type: ignore[attr-defined]  # read by tests


def run(args: argparse.Namespace) -> dict:
    from sinkscope.infra.atomic_io import claim_output_directory
    from sinkscope.mechanism import is_audit_directory

    out = Path(args.out_dir)
    seen: dict[Path, str] = {}
    for directory in args.directories:  # one directory twice would be compared with itself
        where = Path(directory).resolve()
        if where in seen:
            raise InputError(f"{directory} is given twice (as {seen[where]} too); name each directory once")
        seen[where] = directory
    # --sink-eps only means something side by side, so it asks for that comparison too
    mechanism = args.mechanism or args.sink_eps is not None
    if mechanism or not all(is_audit_directory(d) for d in args.directories):
        if args.steps is not None and (mechanism or all(Path(d).is_dir() for d in args.directories)):
            raise InputError(
                "--steps places audits of one model's checkpoints on the training step; it applies only when every "
                "DIR is an audit (no toy directory, --mechanism or --sink-eps): drop --steps",
                field="steps",
            )
        return _compare_mechanism(args, out)
    with claim_output_directory(out, args.overwrite, [Path(d) for d in args.directories], "an audit to compare"):
        from sinkscope.pretrained_analysis.suite import compare_directories

        comparison = compare_directories(args.directories, out, overwrite=args.overwrite, steps=args.steps)
    if not args.json:
        say(comparison.to_markdown())
        say(f"wrote {out / 'comparison.md'}, {out / 'comparison.json'} and a copy of each audit")
    return {"out": str(out), "comparison": encode(comparison)}


def _compare_mechanism(args: argparse.Namespace, out: Path) -> dict:
    """Toy and pretrained side by side (``sinkscope.mechanism``): mechanism.json in ``out``."""
    from sinkscope.infra.atomic_io import claim_output_directory
    from sinkscope.mechanism import compare_mechanism, write_mechanism

    with claim_output_directory(out, args.overwrite, [Path(d) for d in args.directories], "an input to compare"):
        comparison = compare_mechanism(
            args.directories,
            n_sequences=args.n_sequences,
            sink_eps=args.sink_eps,
            allow_unfinished=args.allow_unfinished,
        )
        write_mechanism(comparison, out, overwrite=args.overwrite)
    if not args.json:
        from sinkscope.probes.mechanism_report import mechanism_markdown

        say(mechanism_markdown(comparison))
        say(f"wrote {out / 'mechanism.md'}, {out / 'mechanism.json'} and {out / 'mechanism.png'}")
    return {"out": str(out), "mechanism": encode(comparison)}
