"""A pool worker dies with the process that started it.

When the driver of a ``--workers N`` run is killed outright (SIGKILL, the OOM killer), its
pool cannot tell the workers to stop: left alone they would train and write for the rest
of their unit. ``die_with_parent`` (the pool's initializer) makes the worker's own end
come to it:

- on Linux the kernel sends the worker ``PARENT_DEATH_SIGNAL`` (SIGUSR1) when its parent
  dies (``prctl(PR_SET_PDEATHSIG)``); training treats it as a stop at the next step
  boundary, with a checkpoint of that step, and outside training it ends the process;
- everywhere, ``parent_gone()`` tells the training loop at each step boundary that the
  parent it started with is no longer its parent (an orphan is adopted by another
  process), and the loop stops there as on SIGTERM.

The kernel's signal is sent when the *thread* that started the worker exits, not the
whole process. A killed driver's threads exit one by one and the worker is handed to
each in turn, getting the signal again each time: it is not SIGTERM, whose second
arrival means "stop now, without a checkpoint", but a signal of its own that only ever
asks for the step-boundary stop. ``process_pool`` starts every worker (a replacement too) from the thread
that calls ``run_units``, which stops them all before it returns, so that thread
outlives them.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# SIGUSR1's default action ends the process, as a dead driver's worker outside training should
PARENT_DEATH_SIGNAL = signal.SIGUSR1

_parent_pid: int | None = None  # set in a pool worker: the pid of the process that started it


def die_with_parent(parent_pid: int) -> None:
    """A pool worker's initializer: stop this process when ``parent_pid`` (the driver,
    passed in by it) dies."""
    global _parent_pid
    _parent_pid = parent_pid
    _signal_on_parent_death(PARENT_DEATH_SIGNAL)
    if parent_gone():  # it died before the kernel was asked to tell us: nothing will, and no unit started
        os._exit(1)


def in_pool_worker() -> bool:
    """Whether this process is a pool worker started by ``die_with_parent``'s caller."""
    return _parent_pid is not None


def parent_gone() -> bool:
    """Whether this is a pool worker whose driver has died (always False elsewhere).
    One ``getppid`` call: cheap enough for every training step."""
    return _parent_pid is not None and os.getppid() != _parent_pid


def _signal_on_parent_death(signum: int) -> None:
    """Linux only; elsewhere ``parent_gone`` at the step boundaries is the only check."""
    if not sys.platform.startswith("linux"):
        return
    # the running program's own symbols include libc's prctl; it fails only for an invalid
    # signal number, and then the step-boundary check still stops training
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
