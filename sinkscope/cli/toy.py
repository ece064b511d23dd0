"""`sinkscope toy`: the group of toy trigger-task commands, one module each."""

from __future__ import annotations

import argparse

from sinkscope.cli import toy_mitigations, toy_patch, toy_probe, toy_reproduce, toy_sweep, toy_tradeoff, toy_train
from sinkscope.cli.args import Parser

EXAMPLES = """examples:
  sinkscope toy reproduce --quick --out sinkscope-out/toy-quick   # the paper's six models, quick preset
  sinkscope toy mitigations --quick --out sinkscope-out/mitigations # every sink-removing kind, 1x1
  sinkscope toy train --attention relu --out runs/relu-1x1         # one model
  sinkscope toy probe runs/relu-1x1                                # sink probes + default-state test
  sinkscope toy tradeoff --run runs/softmax-1x1 --out out/tradeoff # Theorem 1's trade-off
  sinkscope toy TOY_COMMAND --help                                 # options and more examples
"""

# each toy command: its module (add_parser, run), in the order --help lists them
COMMANDS = {
    "train": toy_train,
    "reproduce": toy_reproduce,
    "mitigations": toy_mitigations,
    "probe": toy_probe,
    "patch": toy_patch,
    "sweep": toy_sweep,
    "tradeoff": toy_tradeoff,
}


def add_parser(commands: argparse._SubParsersAction) -> None:
    toy = commands.add_parser(
        "toy",
        help="toy trigger-conditional models (the paper's experiments)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    toy_commands = toy.add_subparsers(dest="toy_command", required=True, metavar="TOY_COMMAND", parser_class=Parser)
    for module in COMMANDS.values():
        module.add_parser(toy_commands)
