"""The ``sinkscope`` parser, assembled from each registered command module's own subparser
(``sinkscope.cli.commands``)."""

from __future__ import annotations

import argparse

import sinkscope
from sinkscope.cli import toy
from sinkscope.cli.args import Parser, add_debug
from sinkscope.cli.commands import COMMANDS, TOY_GROUP

MAIN_EXAMPLES = """examples:
  sinkscope toy reproduce --quick --out sinkscope-out/toy-quick && sinkscope report sinkscope-out/toy-quick
  sinkscope audit gpt2 --ablate --out sinkscope-out/audit/gpt2 && sinkscope report sinkscope-out/audit/gpt2
  sinkscope COMMAND --help                                      # every command's options and examples

exit codes: 0 ok, 1 run failed, 2 bad usage or input (one line naming the fix)
"""


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
    toy_commands = None
    for command in COMMANDS:
        if command.words[0] != TOY_GROUP:
            command.module.add_parser(commands)
            continue
        if toy_commands is None:  # the group, where its first command is listed
            toy_commands = toy.add_group(commands)
        command.module.add_parser(toy_commands)
    return parser
