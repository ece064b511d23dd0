"""Progress a person can read while an experiment's toy models train.

One line per running model: step / max steps, the batch L-inf error against the stop
threshold, steps per second, and how long it still needs by the error's trend (a straight
line through log L-inf over the later half of its logged steps, extrapolated to the stop
threshold: ``estimate_steps_left``). While the error is not falling steadily enough to
extrapolate there is no estimate, only the speed; the time to ``max_steps`` is never shown as a bound, since the stop rule
ends most runs far earlier (a four-minute reproduction read "at most 1h06m"). The lines are read from the run directories
(``metrics.jsonl``, ``result.json``), so they are the same whether models train in this
process or in worker processes. On a terminal the block is redrawn in place about once
a second; in a log (stderr not a terminal) a block is printed every ``LOG_INTERVAL_S``
seconds instead of redraws, and a line for each model as it finishes.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from sinkscope.infra.errors import InputError
from sinkscope.infra.heartbeat import HEARTBEAT_S, LOG_INTERVAL_S, TERMINAL_INTERVAL_S
from sinkscope.toy.run_dir import METRICS_FILE, RESULT_FILE, RunConfig, read_metrics, read_train_result

# in a log (stderr not a terminal): a whole block every LOG_INTERVAL_S, and a model's
# finishing line as soon as it is seen
TREND_MIN_POINTS = 4  # fewer logged errors than this in the later half: no trend yet
# an estimate further ahead than this many times the steps the trend was fitted on is a
# guess (early plateaus read as hour-long runs that then converge in minutes): none is shown
EXTRAPOLATION_LIMIT = 3.0


def duration_text(seconds: float) -> str:
    """``42s``, ``7m05s``, ``2h03m``."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def estimate_steps_left(history: list[tuple[int, float]], stop_linf: float) -> float | None:
    """Steps until the L-inf error of ``history`` (``(step, error)`` in step order) falls
    below ``stop_linf``, by a least-squares line through log error over the later half of
    the steps logged; None while there is no falling trend (too few points, or the error
    flat or rising) or the threshold lies further ahead than ``EXTRAPOLATION_LIMIT`` times
    the fitted steps. 0 once the trend is below the threshold."""
    if not history or stop_linf <= 0:
        return None
    last_step = history[-1][0]
    recent = [(step, math.log(error)) for step, error in history if step >= last_step / 2 and error > 0]
    if len(recent) < TREND_MIN_POINTS:
        return None
    mean_step = sum(step for step, _ in recent) / len(recent)
    mean_log = sum(log for _, log in recent) / len(recent)
    spread = sum((step - mean_step) ** 2 for step, _ in recent)
    if spread == 0:
        return None
    slope = sum((step - mean_step) * (log - mean_log) for step, log in recent) / spread
    if slope >= 0:
        return None
    fitted_now = mean_log + slope * (last_step - mean_step)
    left = max(0.0, (math.log(stop_linf) - fitted_now) / slope)
    return left if left <= EXTRAPOLATION_LIMIT * (last_step - recent[0][0]) else None


@dataclass(frozen=True)
class RunLine:
    """What one running model's progress line shows. ``steps_left``: the error trend's
    estimate (``estimate_steps_left``), None while there is none."""

    name: str
    step: int
    max_steps: int
    linf_error: float | None
    stop_linf: float
    steps_per_s: float | None
    steps_left: float | None = None

    def text(self) -> str:
        linf = "L-inf -" if self.linf_error is None else f"L-inf {self.linf_error:.1e}"
        line = f"{self.name}: step {self.step:,}/{self.max_steps:,}, {linf} (stops below {self.stop_linf:g})"
        if self.steps_per_s:
            line += f", {self.steps_per_s:,.0f} steps/s, {self._estimate(self.steps_per_s)}"
        return line

    def _estimate(self, steps_per_s: float) -> str:
        if self.steps_left is None:
            return "no estimate yet (the error is not yet falling steadily)"
        if self.step + self.steps_left > self.max_steps:  # the trend meets the cap first: the cap ends it
            left = (self.max_steps - self.step) / steps_per_s
            return f"the error's trend reaches the {self.max_steps:,}-step cap first, in about {duration_text(left)}"
        return f"about {duration_text(self.steps_left / steps_per_s)} more by the error's trend"


class ExperimentProgress:
    """Watches ``out_dir/name`` for every job while ``with``-entered and writes progress to
    ``stream`` (stderr) from a background thread; ``enabled=False`` writes nothing."""

    def __init__(
        self, out_dir: Path, jobs: list[tuple[str, RunConfig]], enabled: bool = True, stream: TextIO | None = None
    ) -> None:
        self.out_dir = Path(out_dir)
        self.jobs = dict(jobs)
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())
        # a log polls as often as a heartbeat, to say a model finished soon after it did
        self.interval = TERMINAL_INTERVAL_S if self.interactive else HEARTBEAT_S
        self._finished_names: set[str] = set()  # models whose finishing a log has said
        self._last_block = -math.inf  # when a log's last whole block was written (monotonic)
        self._seen: dict[str, tuple[int, float]] = {}  # name -> (step, time) when first read
        self._speed: dict[str, float] = {}
        self._drawn = 0
        self._logged: list[str] = []  # the last block written to a log, not repeated word for word
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()
        self._started_at = time.time()  # wall clock, to compare with file times

    def __enter__(self) -> ExperimentProgress:
        if self.enabled:
            self._draw()  # at once: a log's first block would otherwise wait LOG_INTERVAL_S
            self._thread = threading.Thread(target=self._run, name="sinkscope-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._draw(final=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._draw()

    def snapshot(self) -> tuple[int, list[RunLine]]:
        """(models finished, lines of the models running now), from the run directories."""
        finished, lines = 0, []
        now = time.monotonic()
        for name, config in self.jobs.items():
            run_dir = self.out_dir / name
            if (run_dir / RESULT_FILE).exists():
                finished += 1
                continue
            metrics = run_dir / METRICS_FILE
            try:
                # untouched since before this experiment began (1 s for coarse file clocks): an
                # interrupted earlier run waiting to be resumed, not a running one
                if metrics.stat().st_mtime < self._started_at - 1.0:
                    continue
            except FileNotFoundError:
                continue
            records = read_metrics(run_dir)
            if not records:
                continue
            step, linf = records[-1]["step"], records[-1]["linf_error"]
            history = [(r["step"], r["linf_error"]) for r in records if r.get("linf_error") is not None]
            first = self._seen.setdefault(name, (step, now))  # speed: the average since first seen
            if step > first[0] and now > first[1]:
                self._speed[name] = (step - first[0]) / (now - first[1])
            stop = config.train.stop_linf
            left = estimate_steps_left(history, stop)
            lines.append(RunLine(name, step, config.train.max_steps, linf, stop, self._speed.get(name), left))
        return finished, lines

    def _finishing_lines(self) -> list[str]:
        """A log's line for each model finished since the last call: how it ended."""
        said = []
        for name in self.jobs:
            if name in self._finished_names or not (self.out_dir / name / RESULT_FILE).exists():
                continue
            self._finished_names.add(name)
            try:
                result = read_train_result(self.out_dir / name)
            except (InputError, OSError):  # being replaced, or damaged: the run itself reports that
                continue
            said.append(f"{name}: {result.status.replace('_', ' ')} after {result.steps:,} steps")
        return said

    def _draw(self, final: bool = False) -> None:
        finished, lines = self.snapshot()
        header = (
            f"models: {finished}/{len(self.jobs)} finished, {duration_text(time.monotonic() - self._started)} so far"
        )
        block = [header] if final else [header, *(f"  {line.text()}" for line in lines)]
        if not self.interactive:
            now = time.monotonic()
            fresh = (final or now - self._last_block >= LOG_INTERVAL_S) and block != self._logged
            if fresh:
                self._logged, self._last_block = block, now
            block = self._finishing_lines() + (block if fresh else [])
            if not block:
                return
        else:
            self._logged = block
        if self.interactive and self._drawn:
            self.stream.write(f"\x1b[{self._drawn}F\x1b[J")  # back to the block's first line, clear below
        self.stream.write("\n".join(block) + "\n")
        self.stream.flush()
        self._drawn = len(block) if self.interactive else 0
