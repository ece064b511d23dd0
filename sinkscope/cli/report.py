"""`sinkscope report`: a result directory into report.html and report.md."""

from __future__ import annotations

import argparse
from pathlib import Path

from sinkscope.cli.args import add_common_output, out_path, say
from sinkscope.cli.inputs import CommandPaths
from sinkscope.infra.codec import encode

EXAMPLES = """examples:
  sinkscope report sinkscope-out/toy-quick                     # a reproduction: writes report.html, report.md there
  sinkscope report sinkscope-out/toy-quick/softmax-2x2-seed0/probe
  sinkscope report sinkscope-out/audit/minilm --out sinkscope-out/reports/minilm --overwrite
  sinkscope report sinkscope-out/audit/gpt2-family --json      # a comparison; print what was written as JSON

DIR: a result directory, recognised by its files (the report says which kind it made):
  audit             audit.json                         sinkscope audit MODEL (one model)
  comparison        comparison.json                    sinkscope audit with several models or --revision
                                                       values, or sinkscope compare DIR DIR ...
  toy reproduction  summary.json + reproduce.json      sinkscope toy reproduce
  toy sweep         summary.json + sweep.json          sinkscope toy sweep
  toy mitigations   summary.json + mitigations.json    sinkscope toy mitigations
  toy probe         probe.json + default_state.json    sinkscope toy probe
  toy patch         patching.json + patching_heads.json + patching_positions.json
                                                       sinkscope toy patch
  toy tradeoff      tradeoff.json                      sinkscope toy tradeoff
  mechanism         mechanism.json                     sinkscope compare --mechanism
  window test       window_test.json                   sinkscope window-test MODEL
  circuit           circuit.json                       sinkscope circuit MODEL
report.html is one self-contained page (figures embedded, no network needed); report.md has
the same findings and tables.
"""


def add_parser(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser(
        "report",
        help="turn a result directory into report.html (self-contained) and report.md",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report.add_argument(
        "result_dir",
        metavar="DIR",
        help="a result directory of one of the kinds listed below: audit, comparison, toy reproduction, toy sweep, "
        "toy mitigations, toy probe, toy patch, toy tradeoff, mechanism, window test or circuit",
    )
    report.add_argument(
        "--out",
        type=out_path,
        dest="out_dir",
        metavar="OUT",
        default=None,
        help="where to write the report (default DIR itself); a directory that holds another result is refused",
    )
    report.add_argument("--overwrite", action="store_true", help="replace an existing report in --out")
    add_common_output(report)


def paths(args: argparse.Namespace) -> CommandPaths:
    """It adds its pages to the output (by default the result directory itself, its own
    place), replacing only its figure folder, which ``write_report`` keeps off the result."""
    source = Path(args.result_dir)
    return CommandPaths(Path(args.out_dir) if args.out_dir else source, (source,), (source,), replaces_out=False)


def run(args: argparse.Namespace) -> dict:
    from sinkscope.reporting import report

    result = report(args.result_dir, args.out_dir, overwrite=args.overwrite)
    if not args.json:
        say(f"{result.kind} report:")
        say("\n".join(f"- {finding}" for finding in result.findings))
        say(f"wrote {result.html} and {result.markdown}")
    return encode(result)
