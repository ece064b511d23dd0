"""The errors sinkscope means to raise, so that every other exception reads as a bug.

``InputError``: the input cannot work (a bad setting, a missing or malformed file, an
output location that cannot be written); the message names the fix. ``RunFailed``: the
input was fine but the run's result cannot be trusted (a diverged training run,
non-finite attention). The CLI turns the first into one line and exit 2, the second
into one line and exit 1, and lets anything else show its traceback.

``InputError`` is also a ``ValueError`` and ``RunFailed`` a ``RuntimeError``, so a
Python caller's ``except ValueError`` keeps working. ``field`` names the setting at
fault (a config field such as ``"batch_size"``), so the CLI can name its flag; library
messages say ``batch_size``, never a command-line flag.
"""

from __future__ import annotations

# where a refusal of a model family points: the supported families and how to list them
SUPPORTED_FAMILIES_DOC = "docs/auditing.md#supported-families"


class SinkscopeError(Exception):
    """Base of the errors sinkscope raises on purpose."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InputError(SinkscopeError, ValueError):
    """Bad input or usage: one line naming the fix (CLI exit 2)."""


class RunFailed(SinkscopeError, RuntimeError):
    """The run finished or stopped, but its result cannot be trusted (CLI exit 1)."""
