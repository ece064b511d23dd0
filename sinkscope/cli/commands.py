"""The command registry: every ``sinkscope`` command, the module that implements it, and
what an interrupt leaves behind. A command is one module here plus one entry below.

A command module has ``add_parser(subparsers)`` (its flags, help and examples),
``paths(args) -> CommandPaths`` (every path it reads: ``sinkscope.cli.inputs``) and
``run(args) -> dict`` (what ``--json`` prints). A command that runs other commands
(``demo``) takes the entry point's one-command runner as ``run(args, run_command_line)``,
so no command module imports the entry point. The entry point refuses an ``--out`` over
the command's inputs before it calls ``run``, for every command.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from types import ModuleType

from sinkscope.cli import (
    audit,
    circuit,
    compare,
    demo,
    report,
    toy_mitigations,
    toy_patch,
    toy_probe,
    toy_reproduce,
    toy_sweep,
    toy_tradeoff,
    toy_train,
    window_test,
)

TOY_GROUP = "toy"
RUNS_AGAIN = "run the same command to continue: finished models are kept"
NOTHING_WRITTEN = "nothing was written; any old result is as it was"


@dataclass(frozen=True)
class Command:
    """words: how it is typed (``("toy", "train")``); module: its implementation;
    interrupted: what Ctrl-C (or SIGTERM) leaves, said after ``interrupted;``;
    runs_commands: whether ``run`` takes the one-command runner (``demo``)."""

    words: tuple[str, ...]
    module: ModuleType
    interrupted: str
    runs_commands: bool = False

    def __post_init__(self) -> None:
        missing = [name for name in ("add_parser", "paths", "run") if not callable(getattr(self.module, name, None))]
        if missing:
            raise TypeError(f"the command module {self.module.__name__} lacks {', '.join(missing)}")
        if not self.interrupted.strip():
            raise TypeError(f"the command {self.name} says nothing of what an interrupt leaves")

    @property
    def name(self) -> str:
        return " ".join(self.words)


# in the order --help lists them
COMMANDS: tuple[Command, ...] = (
    Command(
        (TOY_GROUP, "train"),
        toy_train,
        "training checkpointed the step it stopped at: re-run the same command with --resume to continue; "
        "an --overwrite restart discarded its new attempt and left the old run as it was",
    ),
    Command((TOY_GROUP, "reproduce"), toy_reproduce, f"{RUNS_AGAIN}; with --overwrite the old result is as it was"),
    Command((TOY_GROUP, "mitigations"), toy_mitigations, f"{RUNS_AGAIN}; with --overwrite the old result is as it was"),
    Command((TOY_GROUP, "probe"), toy_probe, NOTHING_WRITTEN),
    Command((TOY_GROUP, "patch"), toy_patch, NOTHING_WRITTEN),
    Command((TOY_GROUP, "sweep"), toy_sweep, f"{RUNS_AGAIN}; with --overwrite the old result is as it was"),
    Command((TOY_GROUP, "tradeoff"), toy_tradeoff, NOTHING_WRITTEN),
    Command(
        ("audit",),
        audit,
        "one model: nothing was written; several: the finished audits are kept, run the same command to "
        "continue; any old result is as it was",
    ),
    Command(("report",), report, "files already replaced are complete; re-run with --overwrite"),
    Command(("compare",), compare, "nothing was written; any old comparison is as it was"),
    Command(
        ("demo",),
        demo,
        "the step that stopped said what it kept; run sinkscope demo again to continue",
        runs_commands=True,
    ),
    Command(
        ("window-test",),
        window_test,
        "files are written only after every setting ran; re-run with --overwrite to replace any partial output",
    ),
    Command(
        ("circuit",),
        circuit,
        "files are written only after every edit ran; nothing was written, any old result is as it was",
    ),
)


def command_of(args: argparse.Namespace) -> Command:
    """The registry entry of the command ``args`` were parsed for."""
    words = (args.command, getattr(args, f"{args.command}_command", None))
    typed = tuple(word for word in words if word is not None)
    return next(command for command in COMMANDS if command.words == typed)
