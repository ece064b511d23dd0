"""The ``sinkscope`` parser, assembled from each command module's own subparser, and
which module's ``run`` handles the parsed arguments."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import sinkscope
from sinkscope.cli import audit, circuit, compare, demo, report, toy, window_test
from sinkscope.cli.args import Parser, add_debug

MAIN_EXAMPLES = """examples:
  sinkscope toy reproduce --quick --out sinkscope-out/toy-quick && sinkscope report sinkscope-out/toy-quick
  sinkscope audit gpt2 --ablate --out sinkscope-out/audit/gpt2 && sinkscope report sinkscope-out/audit/gpt2
  sinkscope COMMAND --help                                      # every command's options and examples

exit codes: 0 ok, 1 run failed, 2 bad usage or input (one line naming the fix)
"""

# (command, toy command) -> the function that runs it and returns its JSON-able result
HANDLERS: dict[tuple[str, str | None], Callable[[argparse.Namespace], dict]] = {
    ("audit", None): audit.run,
    **{("toy", name): module.run for name, module in toy.COMMANDS.items()},
    ("report", None): report.run,
    ("compare", None): compare.run,
    ("demo", None): demo.run,
    ("window-test", None): window_test.run,
    ("circuit", None): circuit.run,
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="sinkscope",
        description="Measure attention sinks: toy trigger-task models, probes, interventions, reports.",
        epilog=MAIN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"sinkscope {sinkscope.__version__}")
    add_debug(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    toy.add_parser(commands)
    audit.add_parser(commands)
    report.add_parser(commands)
    compare.add_parser(commands)
    demo.add_parser(commands)
    window_test.add_parser(commands)
    circuit.add_parser(commands)
    return parser


def handler(args: argparse.Namespace) -> Callable[[argparse.Namespace], dict]:
    """The run function of the command ``args`` were parsed for."""
    return HANDLERS[(args.command, getattr(args, f"{args.command}_command", None))]
