"""`sinkscope toy`: the group of toy trigger-task commands (one module each, registered in
``sinkscope.cli.commands``), its help and examples."""

from __future__ import annotations

import argparse

from sinkscope.cli.args import Parser

EXAMPLES = """examples:
  sinkscope toy reproduce --quick --out sinkscope-out/toy-quick   # the paper's six models, quick preset
  sinkscope toy mitigations --quick --out sinkscope-out/mitigations # every sink-removing kind, 1x1
  sinkscope toy train --attention relu --out runs/relu-1x1         # one model
  sinkscope toy probe runs/relu-1x1                                # sink probes + default-state test
  sinkscope toy tradeoff --run runs/softmax-1x1 --out out/tradeoff # Theorem 1's trade-off
  sinkscope toy TOY_COMMAND --help                                 # options and more examples
"""


def add_group(commands: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """The ``toy`` subparser; its commands are added to what this returns."""
    toy = commands.add_parser(
        "toy",
        help="toy trigger-conditional models (the paper's experiments)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return toy.add_subparsers(dest="toy_command", required=True, metavar="TOY_COMMAND", parser_class=Parser)
