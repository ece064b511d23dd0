"""Run tracking: toy training runs logged to Weights & Biases and/or TensorBoard as they
train (``pip install 'sinkscope[tracking]'``).

``TrackingConfig`` says where to log. It is a few strings, so a reproduction's or a
sweep's units get it as an argument in their spawned processes or Ray tasks and open
their own loggers there. Each toy model is one tracked run: a W&B run (``project``;
``group``: the reproduction's or sweep's directory name; ``name``: the run directory's
name) and a TensorBoard directory ``tensorboard_dir/[group/]name``. A tracked run gets
the run's config (W&B config; TensorBoard hparams and a ``config`` text), every
``metrics.jsonl`` line as scalars (``loss``, ``linf_error``,
``anchor_mass_default/L0H0``, ...), the run's ``result.json`` under ``result/`` when it
closes, and what the caller adds (an experiment's evaluation, under ``eval/``).

W&B is configured the way W&B is: ``WANDB_MODE=offline`` logs without a network (sync
later with ``wandb sync``), ``WANDB_DIR`` says where its files go (default ``./wandb``),
``WANDB_ENTITY`` the team. Tracking is no part of a run's identity: a run resumes with
tracking turned on or off, and each invocation that trains it is a new tracked run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from sinkscope.infra.codec import encode
from sinkscope.infra.errors import InputError
from sinkscope.toy.run_dir import RESULT_FILE, RunConfig, read_train_result

TRACKING_INSTALL = "pip install 'sinkscope[tracking]'"


@dataclass(frozen=True)
class TrackingConfig:
    """Where toy runs are logged: a W&B project, a TensorBoard directory, or both.
    ``group``: the W&B group and TensorBoard subdirectory of the runs (a reproduction or
    sweep sets it to its directory's name when it is None)."""

    wandb_project: str | None = None
    tensorboard_dir: str | None = None
    group: str | None = None

    def __post_init__(self) -> None:
        if self.tensorboard_dir is not None:
            object.__setattr__(self, "tensorboard_dir", os.fspath(self.tensorboard_dir))  # a Path is fine too
        if self.wandb_project is None and self.tensorboard_dir is None:
            raise InputError("tracking needs a wandb_project or a tensorboard_dir; pass tracking=None to log nowhere")
        if self.wandb_project is not None and (not self.wandb_project.strip() or "/" in self.wandb_project):
            raise InputError(
                f"wandb_project must be a W&B project name (no '/'), got {self.wandb_project!r}", field="wandb_project"
            )
        if self.tensorboard_dir is not None and not self.tensorboard_dir.strip():
            raise InputError("tensorboard_dir must name a directory, got ''", field="tensorboard_dir")
        if self.group is not None and (not self.group.strip() or "/" in self.group):
            raise InputError(f"group must be a name (no '/'), got {self.group!r}", field="group")

    def check(self) -> None:
        """One line naming the fix when a logger's package is missing or the TensorBoard
        directory is a file; called before any work, so a long run does not fail at its
        first log line."""
        for setting, package in (("wandb_project", "wandb"), ("tensorboard_dir", "tensorboard")):
            if getattr(self, setting) is None:
                continue
            try:
                __import__(package)
            except ImportError as error:
                raise InputError(f"{setting} needs the {package} package: {TRACKING_INSTALL}", field=setting) from error
        if self.tensorboard_dir is not None and Path(self.tensorboard_dir).exists():
            if not Path(self.tensorboard_dir).is_dir():
                raise InputError(
                    f"tensorboard_dir {self.tensorboard_dir} is a file, not a directory; choose a directory",
                    field="tensorboard_dir",
                )

    def for_units(self, out_dir: Path) -> TrackingConfig:
        """This config for an experiment's units: the group defaults to ``out_dir``'s name,
        and the TensorBoard directory is absolute (a Ray task on another node has another
        working directory)."""
        tensorboard_dir = None if self.tensorboard_dir is None else str(Path(self.tensorboard_dir).resolve())
        return replace(self, tensorboard_dir=tensorboard_dir, group=self.group or out_dir.name)


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """A metrics line as flat scalars: ``loss``, ``linf_error`` and, per layer and head,
    ``anchor_mass_default/L{layer}H{head}`` and ``anchor_mass_trigger/...``, ``n_sink_heads``,
    ``sink_rate/{eps}``. ``step`` and
    ``run`` say where the line belongs, so they are not logged as values; a null
    (non-finite) value is left out."""
    flat: dict[str, float] = {}
    for key, value in record.items():
        if key in ("step", "run") or value is None or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            flat[key] = float(value)
        elif isinstance(value, dict):  # sink_rate by ε
            flat.update({f"{key}/{name}": float(v) for name, v in value.items() if isinstance(v, (int, float))})
        elif isinstance(value, list):  # [layer][head]
            for layer, heads in enumerate(value):
                for head, mass in enumerate(heads):
                    if mass is not None:
                        flat[f"{key}/L{layer}H{head}"] = float(mass)
    return flat


def _flat_config(config: RunConfig) -> dict[str, Any]:
    """``model.n_layers``, ``train.lr``, ...: the run config as one level of scalars."""
    return {
        f"{section}.{key}": value
        for section, values in encode(config).items()
        if section != "versions"  # the torch version that wrote config.json; not a setting
        for key, value in values.items()
    }


class _Logger(Protocol):
    def log(self, step: int, values: Mapping[str, float]) -> None: ...

    def summary(self, step: int, values: Mapping[str, float | str]) -> None: ...

    def close(self, failed: bool) -> None: ...


class _WandbRun:
    def __init__(self, project: str, group: str | None, name: str, config: RunConfig) -> None:
        import wandb

        self.run = wandb.init(
            project=project,
            group=group,
            name=name,
            job_type="train",
            config=encode(config),
            # a stack's seeds train in one process, each its own concurrent run
            reinit="create_new",
            # no console capture: it would wrap stdout, where --json results are printed
            settings=wandb.Settings(console="off"),
        )

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def summary(self, step: int, values: Mapping[str, float | str]) -> None:
        self.run.summary.update(dict(values))

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class _TensorBoardRun:
    def __init__(self, log_dir: Path, config: RunConfig) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        # flushed every 30 s rather than 120: a training run is watched while it runs
        self.writer = SummaryWriter(log_dir=str(log_dir), flush_secs=30)
        flat = _flat_config(config)
        self.writer.add_text("config", "```json\n" + json.dumps(encode(config), indent=2) + "\n```")
        # the HParams dashboard: the settings (None as text: hparams takes no nulls) beside the result
        metrics = {f"result/{name}": 0.0 for name in ("steps", "linf_error", "loss", "wall_seconds")}
        for summary in hparams({k: "None" if v is None else v for k, v in flat.items()}, metrics):
            self.writer.file_writer.add_summary(summary)  # type: ignore[attr-defined]

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def summary(self, step: int, values: Mapping[str, float | str]) -> None:
        for tag, value in values.items():
            if isinstance(value, str):
                self.writer.add_text(tag, value, step)
            else:
                self.writer.add_scalar(tag, value, step)

    def close(self, failed: bool) -> None:
        self.writer.close()


class RunTracker:
    """One toy run's loggers (W&B and/or TensorBoard)."""

    def __init__(self, tracking: TrackingConfig, name: str, config: RunConfig) -> None:
        self.loggers: list[_Logger] = []
        self.last_step = 0
        try:
            if tracking.tensorboard_dir is not None:
                log_dir = Path(tracking.tensorboard_dir, *([tracking.group] if tracking.group else []), name)
                self.loggers.append(_TensorBoardRun(log_dir, config))
            if tracking.wandb_project is not None:
                self.loggers.append(_WandbRun(tracking.wandb_project, tracking.group, name, config))
        except BaseException:
            self.close(failed=True)
            raise

    def log(self, step: int, record: Mapping[str, Any]) -> None:
        """A metrics line (``on_log``'s record) as scalars at ``step``."""
        self.last_step = step
        values = scalars(record)
        for logger in self.loggers:
            logger.log(step, values)

    def summary(self, values: Mapping[str, float | str], step: int | None = None) -> None:
        """Final values (a result, an evaluation): W&B summary; TensorBoard scalars and
        texts at ``step`` (default: the last logged step)."""
        for logger in self.loggers:
            logger.summary(self.last_step if step is None else step, values)

    def close(self, failed: bool = False) -> None:
        """``failed``: the run stopped without a result (W&B marks it failed)."""
        for logger in self.loggers:
            logger.close(failed)
        self.loggers = []


def result_values(run_dir: Path) -> dict[str, float | str] | None:
    """The run's ``result.json`` under ``result/`` (None before it finished): status,
    converged, steps, wall seconds, last batch's L-inf error and loss."""
    if not (run_dir / RESULT_FILE).is_file():
        return None
    result = read_train_result(run_dir)
    return {
        "result/status": result.status,
        "result/converged": float(result.converged),
        "result/steps": float(result.steps),
        "result/wall_seconds": result.wall_seconds,
        "result/linf_error": result.linf_error,
        "result/loss": result.loss,
    }


class RunTrackers:
    """The tracked runs of one training call (a run, or a stack of seeds), as a context:
    ``on_log`` sends each metrics line to its run's tracker (by the record's ``run``);
    ``summary`` adds final values to a run; leaving logs each run's ``result.json`` and
    closes them all. With ``tracking=None`` it tracks nothing. ``files``: where each run's
    files are while it trains, when not in its run directory (a restart is built aside
    until it replaces the old run); the tracker is named and found by the run directory."""

    def __init__(
        self,
        tracking: TrackingConfig | None,
        runs: Sequence[tuple[Path, RunConfig]],
        files: Sequence[Path] | None = None,
    ) -> None:
        self.tracking = tracking
        self.runs = runs
        self.files = [run_dir for run_dir, _ in runs] if files is None else list(files)
        self.trackers: dict[str, tuple[Path, RunTracker]] = {}

    def __enter__(self) -> RunTrackers:
        if self.tracking is None:
            return self
        self.tracking.check()  # in a unit's worker too: a node without the package is one line, not a traceback
        try:
            for (run_dir, config), files in zip(self.runs, self.files):
                self.trackers[str(run_dir)] = (files, RunTracker(self.tracking, run_dir.name, config))
        except BaseException:
            self._close(failed=True)
            raise
        return self

    def on_log(self, step: int, record: Mapping[str, Any]) -> None:
        tracked = self.trackers.get(record["run"])
        if tracked is not None:
            tracked[1].log(step, record)

    def summary(self, run_dir: Path, values: Mapping[str, float | str]) -> None:
        tracked = self.trackers.get(str(run_dir))
        if tracked is not None:
            tracked[1].summary(values)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._close(failed=kind is not None)

    def _close(self, failed: bool) -> None:
        """Log each run's result (one that ended before an error elsewhere still has it)
        and close; a run without one, or diverged, closes as failed."""
        trackers, self.trackers = self.trackers, {}
        for run_dir, tracker in trackers.values():
            result = None
            try:
                result = result_values(run_dir)
                if result is not None:
                    tracker.summary(result, step=int(result["result/steps"]))
            finally:
                tracker.close(failed=result is None or result["result/status"] == "diverged" or failed)
