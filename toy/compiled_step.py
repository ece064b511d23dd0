"""Whether a toy training step runs compiled (``torch.compile``), and the fallback to eager
when it cannot be.

``compile``: ``on``, ``off`` or ``auto``. ``auto`` compiles on CUDA and stays eager on the
CPU (and MPS). Why: on a CPU the compiled step gains well under an order of magnitude
over eager (benchmarks/RESULTS.md), while compiling costs up to a minute or more per model
shape per process on a cold cache, which a typical run does not earn back; and eager CPU
is the bit-identical reference that the paper's step counts are checked against. On CUDA
the compiled step (``sinkscope.toy.functional_step``: one graph, no break) replays as a
CUDA graph (``mode="reduce-overhead"``), where eager spends its time launching kernels.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Callable
from typing import Any

import torch
from tqdm.auto import tqdm

from sinkscope.infra.errors import InputError

COMPILE_CHOICES = ("auto", "on", "off")
# Every stack a process trains (each configuration, and each K as seeds leave) is another
# compiled variant of the one step function, and dynamo stops compiling a function after
# 8 variants (recompile_limit), running the rest uncompiled: a sweep would train most of
# its models eager. A variant is only ever added at a CompiledOrEager's first call, so the
# limit is raised there alone, to more stacks than a process trains.
STEP_VARIANTS = 100_000
# Adam's step opens a profiler range that dynamo cannot trace; it drops it and logs a
# warning that names torch internals: nothing a user can act on, so it is not shown
DYNAMO_CONTEXT_LOGGER = "torch._dynamo.variables.ctx_manager"


def _not_the_profiler_note(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Profiler record function")


def quiet_profiler_notes() -> None:
    """Hide dynamo's "Profiler record function ... will be ignored" warning (once per process)."""
    logger = logging.getLogger(DYNAMO_CONTEXT_LOGGER)
    if _not_the_profiler_note not in logger.filters:
        logger.addFilter(_not_the_profiler_note)


def check_compile_choice(compile: str) -> str:
    if compile not in COMPILE_CHOICES:
        raise InputError(f"compile must be one of {', '.join(COMPILE_CHOICES)}, got {compile!r}", field="compile")
    return compile


def compile_wanted(compile: str, device: torch.device) -> bool:
    """Whether ``compile`` asks for a compiled step on ``device``."""
    check_compile_choice(compile)
    if compile == "auto":
        return device.type == "cuda"
    return compile == "on"


def why_not_compilable(device: torch.device) -> str | None:
    """Why ``torch.compile`` cannot work here (None when it can): inductor needs a C++
    compiler for CPU code, and dynamo does not run on every Python."""
    try:
        import torch._dynamo

        if not torch._dynamo.is_dynamo_supported():
            return f"torch.compile does not support this Python ({sys.version.split()[0]})"
    except Exception as error:  # an unsupported platform fails in its own way
        return f"torch.compile is unavailable ({type(error).__name__}: {error})"
    if device.type == "cpu":
        compiler = os.environ.get("CXX") or "c++"
        if shutil.which(compiler) is None:
            return f"no C++ compiler ({compiler} not found; install one or set CXX)"
    return None


def say_eager(reason: str) -> None:
    """The one note line of a fallback to eager, above a live progress bar (printed plainly it
    ran on after the bar's text, on the bar's line)."""
    tqdm.write(f"sinkscope: training eager: {reason}", file=sys.stderr)


class CompiledOrEager:
    """``step`` compiled for ``device`` (CUDA: ``mode="reduce-overhead"``, CUDA graphs),
    or ``eager`` (default: ``step`` itself) when compiling is impossible, with one note
    line. A compile failure shows on the first call (where inductor compiles): that call
    reruns eager and every later call stays eager. ``snapshot()`` is taken before that
    first call and returns what puts the state back, so the rerun starts from the same
    state even when the failure came after part of the step had run."""

    def __init__(
        self,
        step: Callable[..., None],
        device: torch.device,
        snapshot: Callable[[], Callable[[], None]],
        eager: Callable[..., None] | None = None,
    ) -> None:
        self.step = step if eager is None else eager
        self.snapshot = snapshot
        self.compiled: Callable[..., None] | None = None
        self.first = True
        # each call is a new step: CUDA graphs may then reuse the memory of the last one's temporaries
        self.mark_step = torch.compiler.cudagraph_mark_step_begin if device.type == "cuda" else None
        reason = why_not_compilable(device)
        if reason is not None:
            say_eager(reason)
            return
        mode = "reduce-overhead" if device.type == "cuda" else None
        quiet_profiler_notes()
        self.compiled = torch.compile(step, mode=mode)

    def __call__(self, *args: object) -> None:
        if self.compiled is None:
            self.step(*args)
            return
        if self.mark_step is not None:
            self.mark_step()
        if not self.first:
            self.compiled(*args)
            return
        self.first = False
        restore = self.snapshot()
        # the first call compiles: on a CPU a minute or more, while the step count stays at 0
        tqdm.write("sinkscope: compiling the training step (torch.compile) ...", file=sys.stderr)  # above a live bar
        try:
            with torch._dynamo.config.patch(_many_variants()):
                self.compiled(*args)
        except Exception as error:  # inductor's failures have many types (compiler, codegen, platform)
            self.compiled = None
            restore()
            say_eager(f"torch.compile failed ({_first_cause(error)[:200]})")
            self.step(*args)


def _many_variants() -> dict[str, Any]:
    """dynamo's recompile limits raised to ``STEP_VARIANTS``, under the names this torch has
    (``recompile_limit`` was ``cache_size_limit`` before torch 2.7): an unknown name would
    make ``config.patch`` raise, which the caller would take for a compile failure."""
    import torch._dynamo.config as config

    names = ("recompile_limit", "accumulated_recompile_limit", "cache_size_limit", "accumulated_cache_size_limit")
    return {name: STEP_VARIANTS for name in names if hasattr(config, name)}


def _first_cause(error: BaseException) -> str:
    """``error``'s type and its first non-empty line of substance: inductor wraps the cause
    as "backend='inductor' raised:" with the reason on the next line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    reason = next((line for line in lines if not line.endswith("raised:")), "")
    cause = error.__cause__
    if cause is not None and not reason:
        return f"{type(error).__name__}: {_first_cause(cause)}"
    return f"{type(error).__name__}: {reason}" if reason else type(error).__name__
