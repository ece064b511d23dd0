"""Ctrl-C and SIGTERM during training stop at the next step boundary, so the trainer can
checkpoint a consistent state (weights, Adam moments and the data generator of one
step) before it raises ``KeyboardInterrupt``: an interrupted run loses no finished step.
A pool worker whose driver died stops there too (``sinkscope.execution.worker_lifetime``).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sinkscope.execution.worker_lifetime import PARENT_DEATH_SIGNAL, in_pool_worker, parent_gone


class StepBoundaryInterrupt:
    """Set by SIGINT or SIGTERM inside ``interrupts_at_step_boundaries``; the training
    loop reads ``requested`` once per step. A second signal raises at once (the user
    insists), as does any signal outside the block."""

    def __init__(self) -> None:
        self.signalled = False
        self.parent_died = False

    @property
    def requested(self) -> bool:
        """A signal arrived, or this pool worker's driver died (the portable check; Linux
        also sends the worker ``PARENT_DEATH_SIGNAL`` then)."""
        return self.signalled or self.parent_died or parent_gone()

    def _handle(self, signum: int, frame: object) -> None:
        if self.signalled:
            raise KeyboardInterrupt
        self.signalled = True

    def _handle_parent_death(self, signum: int, frame: object) -> None:
        # the kernel may send it once per thread of the dying driver: never "insists"
        self.parent_died = True


@contextmanager
def interrupts_at_step_boundaries() -> Iterator[StepBoundaryInterrupt]:
    """Defer SIGINT and SIGTERM to the training loop's step boundaries for the block; a
    signal that arrived after the last boundary raises ``KeyboardInterrupt`` as the block
    ends, so a caller with more work (the next model of an experiment) stops too.

    Signal handlers can only be set from the main thread; elsewhere the block runs with
    the process's handlers unchanged (only a dead driver sets ``requested``)."""
    latch = StepBoundaryInterrupt()
    if threading.current_thread() is not threading.main_thread():
        yield latch
        return
    handlers = {signal.SIGINT: latch._handle, signal.SIGTERM: latch._handle}
    if in_pool_worker():
        handlers[PARENT_DEATH_SIGNAL] = latch._handle_parent_death
    previous = {
        signum: signal.signal(signum, handler)
        for signum, handler in handlers.items()
        # a caller that ignores a signal keeps ignoring it; one installed from C (None) is left alone
        if signal.getsignal(signum) not in (signal.SIG_IGN, None)
    }
    try:
        yield latch
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if latch.requested:
        raise KeyboardInterrupt
