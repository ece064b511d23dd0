"""The ``sinkscope`` command line: one module per command (its subparser and its run
function), ``args`` (shared argument types and flags), ``parser`` (their assembly) and
``entry`` (``main`` and error handling). The only package that imports from every layer.
"""

from sinkscope.cli.entry import main
from sinkscope.cli.parser import build_parser

__all__ = ["build_parser", "main"]
