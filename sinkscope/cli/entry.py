"""``main``: parse, run the command, and turn the errors sinkscope means into one line.

Exit codes: 0 ok, 1 the run failed (``RunFailed``, e.g. training diverged), 2 bad usage
or input (``InputError``, argparse's own errors, out of memory). Any other exception is a
bug and shows its traceback. With ``--debug`` or ``SINKSCOPE_DEBUG=1`` an error that is
otherwise one line shows its full traceback with its chained causes instead (same exit
code).
"""

from __future__ import annotations

import argparse
import errno
import io
import json
import os
import signal
import sys
import threading
import traceback
from pathlib import Path

from sinkscope.cli.args import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from sinkscope.cli.parser import build_parser, handler
from sinkscope.execution.units import UnitsFailed
from sinkscope.infra.devices import is_out_of_memory
from sinkscope.infra.errors import InputError, RunFailed, SinkscopeError

DEBUG_VARIABLE = "SINKSCOPE_DEBUG"
# what the machine, not sinkscope or its input, caused: a full disk or quota, a read-only filesystem
ENVIRONMENT_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
OUT_OF_MEMORY_FIX = (
    "lower the sizes and counts (--sequences, --inputs, --heads, --d-model, --batch-size, --n-prompts, "
    "--max-len), or pass --device cpu when a GPU's memory ran out"
)


INTERRUPTED = {
    "toy": "training checkpointed the step it stopped at: re-run toy train with --resume, or reproduce, "
    "mitigations and sweep with the same settings, to continue; an --overwrite run (toy train's too, its new "
    "attempt discarded; and probe, patch, tradeoff) left the old result as it was",
    "audit": "one model: nothing was written; several: the finished audits are kept, run the same command to "
    "continue; any old result is as it was",
    "report": "files already replaced are complete; re-run with --overwrite",
    "compare": "nothing was written; any old comparison is as it was",
    "demo": "the step that stopped said what it kept; run sinkscope demo again to continue",
    "window-test": "files are written only after every setting ran; re-run with --overwrite to replace any partial output",
    "circuit": "files are written only after every edit ran; nothing was written, any old result is as it was",
}


def _active_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the command that ran, e.g. ``toy train``'s."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return _active_parser(action.choices[getattr(args, action.dest)], args)
    return parser


def _with_flag(error: SinkscopeError, parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """``error``'s one line, with the flag of the setting it names (its ``field``) appended:
    library messages name settings (``max_len``), the command line names flags (``--max-len``)."""
    message = str(error)
    if error.field is None:
        return message
    actions = {action.dest: action for action in _active_parser(parser, args)._actions}
    action = actions.get(error.field)  # every flag's dest is the name of the setting it sets
    if action is None or not action.option_strings:  # no such flag on this command, or a positional
        return message
    return f"{message} ({'/'.join(action.option_strings)})"


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM (a scheduler or ``kill``) ends a run as Ctrl-C does: temporaries removed,
    finished checkpoints and results kept."""
    raise KeyboardInterrupt


def _terminated_after_the_work(signum: int, frame: object) -> None:
    """SIGTERM once the result is complete (printing it, or the interpreter shutting down):
    one line and exit 1 at once, instead of the default silent death (exit 143)."""
    try:
        sys.stdout.flush()  # what was printed (a --json result, a table) still reaches its reader
    finally:
        sys.stderr.write("sinkscope: interrupted after the result was complete; it is kept\n")
        sys.stderr.flush()
        os._exit(EXIT_FAILED)


def debugging(args: argparse.Namespace) -> bool:
    """Whether errors show their full chained traceback: ``--debug`` or ``SINKSCOPE_DEBUG=1``."""
    from_environment = os.environ.get(DEBUG_VARIABLE, "").strip().lower() in {"1", "true", "yes", "on"}
    return bool(getattr(args, "debug", False)) or from_environment


def _fail(error: BaseException, line: str, code: int, args: argparse.Namespace) -> int:
    """``line`` on stderr (``sinkscope: ...``), or under ``--debug`` the traceback of
    ``error`` with every chained cause; ``code`` either way."""
    if debugging(args):
        traceback.print_exception(error, file=sys.stderr)
    else:
        print(f"sinkscope: {line}", file=sys.stderr)
    return code


def _units_failed(error: UnitsFailed, parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    # a unit's full disk arrives as its message (its OSError stayed in the worker): not a bug
    disk_full = [failure for failure in error.failures if disk_full_cause(Exception(failure.message)) is not None]
    if disk_full and len(disk_full) == len(error.failures):
        return _disk_full(error, args)
    for failure in error.failures:  # a bug in a unit shows its traceback, as it would here
        if failure.kind == "bug" and failure not in disk_full:
            print(f"sinkscope: unit {failure.name} raised:\n{failure.traceback.rstrip()}", file=sys.stderr)
    if error.field is not None:  # every unit failed on the same bad setting: bad input
        return _fail(error, f"error: {_with_flag(error, parser, args)}", EXIT_USAGE, args)
    return _fail(error, f"run failed: {error}", EXIT_FAILED, args)


def _quiet_stdout() -> None:
    """Send what is left to print to devnull (Python's documented recipe for a closed pipe),
    so the interpreter's exit does not fail a second time flushing it."""
    try:
        descriptor = sys.stdout.fileno()
    except (OSError, ValueError):  # an in-process caller's captured stdout has no descriptor
        return
    os.dup2(os.open(os.devnull, os.O_WRONLY), descriptor)


def disk_full_cause(error: BaseException) -> OSError | None:
    """The full-disk (or quota, or read-only filesystem) ``OSError`` behind ``error``: itself,
    a cause in its chain, or one a library reports only in words (safetensors' ``IoError``)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in ENVIRONMENT_ERRORS:
            return seen
        for code in ENVIRONMENT_ERRORS:
            if os.strerror(code) in str(seen):
                return OSError(code, os.strerror(code))
        seen = seen.__cause__ or seen.__context__
    return None


def _disk_line(error: OSError, where: object) -> str:
    """The one line for a full disk (or quota) or a read-only location, naming where and the fix."""
    if error.errno == errno.EROFS:
        return f"{where} is on a read-only filesystem ({error.strerror}); choose a writable output location"
    return (
        f"no space left writing {where} ({error.strerror}); free space on its device or choose another output location"
    )


def _disk_full(error: Exception, args: argparse.Namespace) -> int:
    """One line for a full disk or a read-only filesystem behind ``error``; any other
    exception is a bug in sinkscope or below it and is raised again (its traceback shows)."""
    cause = disk_full_cause(error)
    if cause is None:
        raise error
    where = cause.filename or getattr(args, "out_dir", None) or getattr(args, "run_dir", None) or "the output"
    return _fail(error, f"error: {_disk_line(cause, where)}", EXIT_USAGE, args)


def _print_result(result: object, args: argparse.Namespace) -> int:
    """Print a ``--json`` result and flush what the command printed: a closed pipe ends
    quietly (exit 1, as Python's recipe), a full file is one line."""
    try:
        if args.json:
            print(json.dumps(result, indent=2))
        sys.stdout.flush()  # a full disk or a closed pipe shows here, not at the interpreter's exit
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_FAILED
    except OSError as error:
        if error.errno not in ENVIRONMENT_ERRORS:
            raise
        _quiet_stdout()
        return _fail(error, f"error: {_disk_line(error, 'standard output')}", EXIT_USAGE, args)
    return EXIT_OK


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The command's run function, its result printed; an error sinkscope means is one line."""
    try:
        _refuse_unusable_text(args)
        _refuse_unusable_environment()
        result = handler(args)(args)
    except BrokenPipeError:  # a human-readable line printed while the command ran
        _quiet_stdout()
        return EXIT_FAILED
    except UnitsFailed as error:
        return _units_failed(error, parser, args)
    except InputError as error:
        return _fail(error, f"error: {_with_flag(error, parser, args)}", EXIT_USAGE, args)
    except RunFailed as error:
        return _fail(error, f"run failed: {_with_flag(error, parser, args)}", EXIT_FAILED, args)
    except KeyboardInterrupt:
        print(f"sinkscope: interrupted; {INTERRUPTED[args.command]}", file=sys.stderr)
        return EXIT_FAILED
    except (RuntimeError, MemoryError) as error:
        if not is_out_of_memory(error):
            return _disk_full(error, args)  # or any other exception, a bug: its traceback shows
        # a count too large for this machine: the input, not the code
        from sinkscope.pretrained_analysis.resolve import first_line

        return _fail(error, f"error: out of memory ({first_line(error)}); {OUT_OF_MEMORY_FIX}", EXIT_USAGE, args)
    except Exception as error:
        return _disk_full(error, args)  # or any other exception, a bug: its traceback shows
    return _print_result(result, args)


def _refuse_unusable_text(args: argparse.Namespace) -> None:
    """An empty argument (``--run ""`` would silently be the current directory) or one that
    is not valid UTF-8 (a path no result file or report could name) is one line."""
    for name, value in vars(args).items():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if not isinstance(item, str):
                continue
            if not item.strip():
                raise InputError(f"{name} is empty; pass a value", field=name)
            if any("\udc80" <= char <= "\udcff" for char in item):
                raise InputError(f"{item!a} is not valid UTF-8; rename it to a UTF-8 name", field=name)


def _refuse_unusable_environment() -> None:
    """A ``TORCHINDUCTOR_CACHE_DIR`` that cannot be made is one line naming it: torch
    creates it when its compiler loads, which Adam's first step does even without
    compiling, and fails there with a long traceback."""
    value = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not value:
        return
    existing = Path(value).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(
            f"TORCHINDUCTOR_CACHE_DIR={value} cannot be created ({existing} is not a writable directory); "
            "unset it or point it at a writable directory"
        )


def _closed_streams_to_devnull() -> None:
    """A stream the caller closed (``>&-``) is None in Python; what would be written to it
    goes to the null device instead of failing as an AttributeError."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115 (lives as long as the process)


def _streams_that_cannot_fail_on_a_character() -> None:
    """Output to a terminal or file whose encoding lacks a character (``PYTHONIOENCODING=ascii``,
    a C locale) shows it escaped (``\\u03b5`` for ε) instead of raising after the results are written."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            stream.reconfigure(errors="backslashreplace")


def run_command_line(argv: list[str]) -> int:
    """One command in this process, its errors handled as ``main`` handles them, without
    ``main``'s signal handling: how ``sinkscope demo`` runs each of its steps."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as error:  # a usage error, already one line on stderr
        return error.code if isinstance(error.code, int) else EXIT_USAGE
    return _run(parser, args)


def main(argv: list[str] | None = None) -> int:
    """The console script (``argv=None``: the process's arguments) or an in-process call
    (tests); an in-process caller gets its own SIGTERM handler back at the end."""
    _closed_streams_to_devnull()
    _streams_that_cannot_fail_on_a_character()
    parser = build_parser()
    args = parser.parse_args(argv)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if in_main_thread else None
    try:
        return _run(parser, args)
    finally:
        if in_main_thread:
            # the console script keeps a SIGTERM handler through the interpreter's shutdown;
            # an in-process caller (tests) gets its own back
            signal.signal(signal.SIGTERM, _terminated_after_the_work if argv is None else previous)
