"""Progress on stderr: a bar for a long step, and a line whenever that step has said
nothing for a while.

Loading a model inside TransformerLens and transformers, or one batch of an ablation on
a busy machine, can take tens of seconds without a word; a reader cannot tell such a
stretch from a hang. ``heartbeat(what)`` runs a daemon thread for the block that writes
``  ... still WHAT (N s)`` once ``HEARTBEAT_S`` seconds pass with no line; the caller
calls the function it yields when it writes a line of its own (a progress bar's update),
so a step that reports often is never interrupted. On a terminal lines go through
``tqdm.write``, which keeps a progress bar intact; in a log each is one line of its own.
``progress_bar`` is every command's bar. In a log (stderr not a terminal) bars and
heartbeats write at most once every ``LOG_INTERVAL_S``: a log is read afterwards, and a
line every few seconds made hundreds of lines a run.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tqdm.auto import tqdm

# the longest a step stays silent on a terminal: a reader waits this long before wondering
HEARTBEAT_S = 4.0
TERMINAL_INTERVAL_S = 1.0  # a bar's redraws on a terminal
LOG_INTERVAL_S = 30.0  # a bar's lines and a heartbeat's in a log


def writes_to_terminal() -> bool:
    """Whether stderr is a terminal (a person watching) rather than a log."""
    return sys.stderr.isatty()


def progress_bar(total: int, desc: str, enabled: bool, unit: str = "it", leave: bool = False, initial: int = 0) -> tqdm:
    """A bar on stderr: redrawn about once a second on a terminal, a line at most every
    ``LOG_INTERVAL_S`` in a log."""
    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit=unit,
        disable=not enabled,
        leave=leave,
        mininterval=TERMINAL_INTERVAL_S if writes_to_terminal() else LOG_INTERVAL_S,
    )


@contextmanager
def heartbeat(what: str, enabled: bool = True, every_s: float | None = None) -> Iterator[Callable[[], None]]:
    """Write ``  ... still WHAT (N s)`` on stderr each time ``every_s`` seconds
    (``HEARTBEAT_S`` on a terminal, ``LOG_INTERVAL_S`` in a log, by default) pass in the
    block without a line; yields ``said()``, to call whenever the block writes one."""
    if every_s is None:
        every_s = HEARTBEAT_S if writes_to_terminal() else LOG_INTERVAL_S
    what = " ".join(what.split())  # one line, whatever a model's name holds
    started = time.monotonic()
    last = [started]
    done = threading.Event()

    def said() -> None:
        last[0] = time.monotonic()

    def beat() -> None:
        while not done.wait(min(0.5, every_s / 4)):
            now = time.monotonic()
            if now - last[0] >= every_s:
                try:
                    _say(f"  ... still {what} ({now - started:.0f} s)")
                except (OSError, ValueError):  # stderr closed (a pipe whose reader left): nobody to tell
                    return
                last[0] = now

    thread = threading.Thread(target=beat, name="sinkscope-heartbeat", daemon=True)
    if enabled:
        thread.start()
    try:
        yield said
    finally:
        done.set()
        if enabled:
            thread.join()


def _say(line: str) -> None:
    """``line`` on stderr: on a terminal through ``tqdm.write``, which lifts a progress bar
    above it and redraws it; in a log as one plain line (``tqdm.write`` there adds the
    bar and blank lines around every message)."""
    if writes_to_terminal():
        tqdm.write(line, file=sys.stderr)
    else:
        sys.stderr.write(f"\n{line}\n")
    sys.stderr.flush()
