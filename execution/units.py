"""Units of work: what an executor runs, and what it reports back.

A ``Unit`` is one call, ``function(*args)``, with a name that is unique in its batch and
safe as a directory name (callers give each unit its own output directory of that name).
``function`` must be a module-level callable so that another process can import it: the
local executor's spawned workers and Ray's workers unpickle it by reference.

Resumability is the unit function's own: it builds its output directory atomically
(``sinkscope.infra.atomic_io.atomic_directory``) and returns early when that directory already
exists, so Ctrl-C or a crash loses only the units in flight. ``finished`` is the test
such a function and its caller share, and ``skip_finished`` turns it into the ``skip``
predicate of ``sinkscope.execution.executors.run_units``, which then counts finished units as
skipped without scheduling them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sinkscope.infra.errors import InputError, RunFailed

# letters, digits and . _ - = + , @ (a sweep cell "softmax_L2_H2_seed=3", an audit
# "EleutherAI--pythia-70m@step1000"); not "." or ".."
_NAME = re.compile(r"[A-Za-z0-9._=+,@-]+")
# what a unit that ran out of memory, or whose worker was killed, should do differently
OUT_OF_MEMORY_FIX = "run fewer units at once (workers), or make each smaller (batch_size, the model's size)"


class UnitsFailed(RunFailed):
    """Some units of a batch failed (their errors in the message); the others finished and
    kept their results. ``failures`` carry each error's kind and traceback, so the CLI can
    show a bug's traceback and treat a batch that failed only on bad input as bad input."""

    def __init__(self, message: str, failures: Sequence[UnitFailure] = ()) -> None:
        inputs = [failure for failure in failures if failure.kind == "input"]
        fields = {failure.field for failure in inputs}
        only_input = bool(failures) and len(inputs) == len(failures) and len(fields) == 1
        super().__init__(message, field=fields.pop() if only_input else None)
        self.failures = tuple(failures)


@dataclass(frozen=True)
class Unit:
    """``function(*args)`` run once by an executor, needing ``cpus`` CPUs and ``gpus`` GPUs
    (what Ray schedules by; fractions share a device). A worker gives the unit
    ``max(1, int(cpus))`` torch threads."""

    name: str
    function: Callable[..., Any]
    args: tuple[Any, ...] = ()
    cpus: float = 1
    gpus: float = 0

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name) or self.name in (".", ".."):
            raise InputError(
                f"unit name {self.name!r} is not a directory-safe name (letters, digits and . _ - = + , @ only)",
                field="name",
            )
        if not callable(self.function):
            raise InputError(f"unit {self.name}: function {self.function!r} is not callable", field="function")
        if not self.cpus >= 0 or not self.gpus >= 0 or self.cpus + self.gpus == 0:
            raise InputError(
                f"unit {self.name}: cpus={self.cpus} and gpus={self.gpus}; both must be >= 0, one of them > 0",
                field="cpus",
            )


@dataclass(frozen=True)
class UnitFailure:
    """A unit that raised (or whose worker died more often than the retries allow):
    the error's type name, its message, and the traceback text from the worker.
    kind: ``"input"`` (an ``InputError``: bad input, ``field`` the setting at fault),
    ``"run"`` (``RunFailed``: the run's result cannot be trusted, e.g. it diverged),
    ``"lost"`` (the worker process died) or ``"bug"`` (any other exception)."""

    name: str
    error_type: str
    message: str
    traceback: str
    kind: str = "bug"
    field: str | None = None

    def line(self) -> str:
        """One line for a summary: ``name: ErrorType: message`` (the message's first line)."""
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return f"{self.name}: {self.error_type}: {first}" if first else f"{self.name}: {self.error_type}"


@dataclass
class UnitsReport:
    """The outcome of a batch: ``finished`` (name -> return value, in the batch's order),
    ``skipped`` (names, not scheduled) and ``failed`` (in the batch's order). The caller
    decides what a failure means (the CLI: exit 1 naming them)."""

    finished: dict[str, Any] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    failed: list[UnitFailure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> str:
        """``N finished, N skipped, N failed``, then one line per failure."""
        head = f"{len(self.finished)} finished, {len(self.skipped)} skipped, {len(self.failed)} failed"
        return "\n".join([head, *(f"  {failure.line()}" for failure in self.failed)])


def units_failed(failures: Sequence[UnitFailure], total: int, what: str) -> UnitsFailed:
    """The error for a batch whose ``failures`` (of ``total`` units) failed, listing each."""
    listed = "; ".join(failure.line() for failure in failures)
    # the same command would fail the same way on bad input (or too little memory)
    again = "fix that and run" if all(failure.kind == "input" for failure in failures) else "run the same command"
    return UnitsFailed(
        f"{len(failures)} of {total} {what} units failed ({listed}); the finished ones are kept: "
        f"{again} again to redo the rest",
        failures,
    )


def finished(directory: str | os.PathLike, marker: str | None = None) -> bool:
    """Whether a unit's output ``directory`` is complete: with ``marker``, whether the file
    ``directory/marker`` exists; without, whether ``directory`` exists and holds anything
    (a directory built by ``atomic_directory`` appears only once complete)."""
    directory = Path(directory)
    if marker is not None:
        return (directory / marker).is_file()
    return directory.is_dir() and any(directory.iterdir())


def skip_finished(out_dir: str | os.PathLike, marker: str | None = None) -> Callable[[Unit], bool]:
    """The ``skip`` predicate for units whose output is ``out_dir/<unit name>``:
    ``finished(out_dir / unit.name, marker)``."""
    root = Path(out_dir)
    return lambda unit: finished(root / unit.name, marker)
