"""`sinkscope report`: a result directory into report.html and report.md."""

from __future__ import annotations

import argparse

from sinkscope.cli.args import add_common_output, out_path, say
from sinkscope.infra.codec import encode

EXAMPLES = """examples:
  sinkscope report sinkscope-out/toy-quick                     # a reproduction: writes report.html, report.md there
  sinkscope report sinkscope-out/toy-quick/softmax-2x2-seed0/probe
  sinkscope report sinkscope-out/audit/minilm --out reports/minilm --overwrite
  sinkscope report sinkscope-out/audit/gpt2-family --json      # a comparison; print what was written as JSON

DIR: a directory written by `sinkscope toy reproduce`, `toy probe`, `toy tradeoff` or `audit`
(one model, or a comparison of several). report.html is one self-contained page (figures
embedded, no network needed); report.md has the same findings and tables.
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
        help="a result directory: toy reproduce, sweep, probe, patch or tradeoff; audit; compare (audits or --mechanism)",
    )
    report.add_argument(
        "--out",
        type=out_path,
        dest="out_dir",
        metavar="OUT",
        default=None,
        help="where to write the report (default DIR itself)",
    )
    report.add_argument("--overwrite", action="store_true", help="replace an existing report in --out")
    add_common_output(report)


def run(args: argparse.Namespace) -> dict:
    from sinkscope.reporting import report

    result = report(args.result_dir, args.out_dir, overwrite=args.overwrite)
    if not args.json:
        say(f"{result.kind} report:")
        say("\n".join(f"- {finding}" for finding in result.findings))
        say(f"wrote {result.html} and {result.markdown}")
    return encode(result)
