"""The on-disk format of one toy training run, read and written in one place.

A run directory holds:
- ``config.json``: ``{"model": ToyModelConfig, "task": TaskConfig, "train": TrainConfig, "versions": ...}``
- ``metrics.jsonl``: one JSON object per logged step (loss, L-inf error, per-head anchor mass)
- ``checkpoints/step-XXXXXXXX/``: ``model.safetensors``, ``optimizer.safetensors`` (Adam
  state and the data generator's RNG state) and ``state.json``: the state at the start of
  step XXXXXXXX (before its batch is drawn and its update applied), written only once that
  step's loss is known to be finite; each written under a temporary name and renamed when
  complete. ``state.json`` holds the SHA-256 of both tensor files (``weights_sha256``,
  ``optimizer_sha256``), as ``result.json`` holds the final weights'; checkpoints written
  before these hashes were recorded are read without the check
- ``model.safetensors``: the final weights, and ``result.json``: the ``TrainResult``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

import torch

from sinkscope.infra.atomic_io import atomic_directory, atomic_write_json, read_json
from sinkscope.infra.bounds import (
    COUNT,
    NONNEGATIVE,
    POSITIVE,
    POSITIVE_NUMBER,
    SEED,
    Bound,
    check_bounds,
)
from sinkscope.infra.codec import encode, read_result, write_result
from sinkscope.infra.errors import InputError
from sinkscope.infra.field_types import check_field_types
from sinkscope.toy.checkpoint import load_tensors, save_tensors
from sinkscope.toy.model import ToyModelConfig, ToyTransformer
from sinkscope.toy.run_integrity import (
    check_config_against_record,
    check_final_weights,
    check_result_fits_config,
    checkpoint_hashes,
    is_regular_file,
    mismatched_checkpoint_file,
)
from sinkscope.toy.task import TaskConfig

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
RESULT_FILE = "result.json"
FINAL_WEIGHTS = "model.safetensors"
CHECKPOINTS = "checkpoints"
ADAM_BETA = Bound(0.0, 1.0, high_open=True)  # Adam divides by 1 - beta^t: a beta of 1 divides by zero


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings; defaults are the paper's. ``lr=None`` picks the paper's
    rate for the architecture (1e-3 for one layer, 1e-4 for several)."""

    # every range, checked on construction and by the codec reading config.json; toy
    # train's flags read the same named ranges (sinkscope.infra.bounds)
    BOUNDS: ClassVar[dict[str, Bound]] = {
        "seed": SEED,
        "lr": POSITIVE_NUMBER,
        "beta1": ADAM_BETA,
        "beta2": ADAM_BETA,
        "batch_size": POSITIVE,
        "max_steps": POSITIVE,
        "stop_linf": POSITIVE_NUMBER,
        "log_every": POSITIVE,
        "checkpoint_every": POSITIVE,
        "keep_checkpoints": POSITIVE,
    }

    seed: int = 0
    lr: float | None = None
    beta1: float = 0.9
    beta2: float = 0.95
    batch_size: int = 128
    max_steps: int = 50_000
    stop_linf: float = 5e-3
    log_every: int = 100
    checkpoint_every: int = 2_000
    keep_checkpoints: int = 2

    def __post_init__(self) -> None:
        check_field_types(self)  # a wrong type is named here, not a TypeError further on
        check_bounds(self)  # a value torch or the file's reader would refuse is named here

    def learning_rate(self, model: ToyModelConfig) -> float:
        if self.lr is not None:
            return self.lr
        return 1e-3 if model.n_layers == 1 else 1e-4


@dataclass(frozen=True)
class RunConfig:
    """A toy run's settings (``config.json``, with the torch version that trained it;
    ``versions`` does not take part in comparisons)."""

    SCHEMA: ClassVar[str] = "run_config"
    SCHEMA_VERSION: ClassVar[int] = 1

    model: ToyModelConfig
    task: TaskConfig
    train: TrainConfig
    versions: dict[str, str] = field(default_factory=dict, compare=False)

    def without_seed(self) -> RunConfig:
        """This config with seed 0: configs equal under it train as one seed group."""
        return replace(self, train=replace(self.train, seed=0))

    def __post_init__(self) -> None:
        check_field_types(self)  # a wrong type is named here, not a TypeError further on
        if self.model.d_model != self.task.d_model:
            raise InputError(
                f"model d_model={self.model.d_model} differs from task d_model={self.task.d_model}; "
                "set both to the same width"
            )
        if self.model.positional_embedding and self.model.seq_len < self.task.seq_len:
            raise InputError(
                f"model seq_len={self.model.seq_len} is shorter than the task's {self.task.seq_len}; "
                "set the model's seq_len to the task's"
            )


@dataclass
class TrainResult:
    """How a run ended. ``status`` is ``converged``, ``max_steps`` or ``diverged``;
    ``linf_error`` is the last training batch's max absolute error. In ``result.json`` a
    non-finite number (a diverged run's loss) is ``null``, so the file is standard JSON.
    ``weights_sha256`` is the hash of the final ``model.safetensors`` (None for a diverged
    run, and in results written before it was recorded)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "steps": COUNT,
        "wall_seconds": NONNEGATIVE,
        "linf_error": NONNEGATIVE,
        "loss": NONNEGATIVE,
        "resumed_from_step": COUNT,
    }

    SCHEMA: ClassVar[str] = "train_result"
    SCHEMA_VERSION: ClassVar[int] = 1

    STATUSES: ClassVar[tuple[str, ...]] = ("converged", "max_steps", "diverged")

    run_dir: str
    status: str
    converged: bool
    steps: int
    wall_seconds: float
    linf_error: float
    loss: float
    resumed_from_step: int | None = None
    weights_sha256: str | None = None

    def __post_init__(self) -> None:
        if self.status not in self.STATUSES:
            raise InputError(f"status is {self.status!r}, not one of {list(self.STATUSES)}", field="status")
        if self.converged != (self.status == "converged"):  # ranges are the codec's BOUNDS
            raise InputError(f"converged {self.converged} does not fit status {self.status!r}", field="status")


def write_config(run_dir: Path, config: RunConfig) -> None:
    write_result(run_dir / CONFIG_FILE, replace(config, versions={"torch": torch.__version__}))


def read_config(run_dir: str | os.PathLike) -> RunConfig:
    run_dir = Path(run_dir)
    if not is_regular_file(run_dir / CONFIG_FILE):
        raise InputError(
            f"{run_dir} is not a toy run directory (no {CONFIG_FILE}); pass a directory written by toy training "
            "(sinkscope toy train)",
            field="run_dir",
        )
    return read_result(run_dir / CONFIG_FILE, RunConfig, "restore it or retrain into a new directory")


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoint directories, oldest first (temporary ones are ignored)."""
    root = run_dir / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-"))


def write_checkpoint(
    run_dir: Path,
    step: int,
    model: torch.nn.Module,
    optimizer_tensors: dict[str, torch.Tensor],
    state: dict,
    keep: int,
) -> Path:
    target = run_dir / CHECKPOINTS / f"step-{step:08d}"
    with atomic_directory(target) as tmp:
        save_tensors(tmp / "model.safetensors", model.state_dict())
        save_tensors(tmp / "optimizer.safetensors", optimizer_tensors)
        # the tensors tied to this state by hash: a file swapped in later is not this checkpoint
        atomic_write_json(tmp / "state.json", {"step": step, **state, **checkpoint_hashes(tmp)})
    for old in checkpoint_dirs(run_dir)[:-keep]:
        for child in old.iterdir():
            child.unlink()
        old.rmdir()
    return target


def write_train_result(run_dir: Path, result: TrainResult) -> None:
    write_result(run_dir / RESULT_FILE, result)


def read_train_result(run_dir: str | os.PathLike) -> TrainResult:
    path = Path(run_dir) / RESULT_FILE
    is_regular_file(path)  # a named pipe is named, never opened (reading it would wait forever)
    return read_result(path, TrainResult, "delete it and resume the run")


def append_metrics(run_dir: Path, record: dict) -> dict:
    """Append ``record`` as one line of metrics.jsonl; returns the line as written (what
    ``read_metrics`` reads back)."""
    line = encode(record)
    with open(run_dir / METRICS_FILE, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line, allow_nan=False) + "\n")  # NaN as null: standard JSON
    return line


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut by an interruption: everything before it is intact
    return records


def unfinished_reason(run_dir: str | os.PathLike) -> str | None:
    """Why the run's weights are not a trained model (None when they are): interrupted or
    still training (no result yet), diverged (the weights are the last good checkpoint), or
    finished without its final weights (only a checkpoint is left). A result that
    contradicts the run's config, or a file that is not a regular one, is refused here."""
    run_dir = Path(run_dir)
    if not is_regular_file(run_dir / RESULT_FILE):
        return f"{run_dir} has not finished training (no {RESULT_FILE}), so only its latest checkpoint exists"
    try:
        result = read_train_result(run_dir)
    except InputError as error:  # tampered or cut short: nothing says how the run ended
        return f"{run_dir}'s {RESULT_FILE} does not say how the run ended ({error})"
    check_result_fits_config(run_dir / RESULT_FILE, result, read_config(run_dir).train)
    if result.status == "diverged":
        return f"{run_dir} diverged at step {result.steps}; its weights are the last good checkpoint"
    if not is_regular_file(run_dir / FINAL_WEIGHTS):  # never a checkpoint silently in the final weights' place
        newest = checkpoint_dirs(run_dir)
        left = f"only its checkpoint at step {int(newest[-1].name[5:])}" if newest else "no checkpoint"
        return (
            f"{run_dir}'s {RESULT_FILE} says it finished at step {result.steps} but its final weights "
            f"({FINAL_WEIGHTS}) are missing, so {left} is left"
        )
    return None


def check_run_files(run_dir: Path) -> None:
    """``config.json`` as the run's checkpoints recorded it, and the final weights as its
    finish hashed them (each checked where the record exists)."""
    config = read_config(run_dir)
    newest = checkpoint_dirs(run_dir)
    check_config_against_record(run_dir / CONFIG_FILE, config, newest[-1] / "state.json" if newest else None)
    if is_regular_file(run_dir / RESULT_FILE) and is_regular_file(run_dir / FINAL_WEIGHTS):
        try:
            expected = read_train_result(run_dir).weights_sha256
        except InputError:  # a tampered result: unfinished_reason names it
            return
        check_final_weights(run_dir / FINAL_WEIGHTS, expected)


def require_finished(run_dir: str | os.PathLike, allow_unfinished: bool, command: str) -> str | None:
    """Refuse to analyse an unfinished or diverged run unless ``allow_unfinished``; returns
    the note to record in the result when it is allowed (None for a finished run). Files
    that disagree with each other are refused either way."""
    check_run_files(Path(run_dir))
    reason = unfinished_reason(run_dir)
    if reason is not None and not allow_unfinished:
        raise InputError(
            f"{reason}; finish it (resume its training) or allow unfinished runs to {command} it anyway",
            field="allow_unfinished",
        )
    return None if reason is None else f"analysed although {reason} (allow_unfinished)"


def weights_file(run_dir: Path) -> Path:
    """The weights a run's model is loaded from: the final ones, else the latest checkpoint's."""
    weights = run_dir / FINAL_WEIGHTS
    if not is_regular_file(weights):
        checkpoints = checkpoint_dirs(run_dir)
        if not checkpoints:
            raise InputError(f"{run_dir} holds no weights yet (no {FINAL_WEIGHTS}, no checkpoint)")
        weights = checkpoints[-1] / "model.safetensors"
        _check_checkpoint_files(checkpoints[-1])
    return weights


def load_model(run_dir: str | os.PathLike) -> ToyTransformer:
    """The trained model of a run: final weights, else the latest checkpoint."""
    run_dir = Path(run_dir)
    check_run_files(run_dir)
    config = read_config(run_dir)
    model = ToyTransformer(config.model)
    weights = weights_file(run_dir)
    try:
        model.load_state_dict(load_tensors(weights))
    except RuntimeError as error:  # tensors of another shape or name: the file, not the code, is wrong
        first_line = str(error).strip().splitlines()[-1].strip()
        raise InputError(
            f"the weights in {weights} do not fit the architecture in {run_dir / CONFIG_FILE} ({first_line}); "
            "restore the weights or config.json of this run, or retrain it",
            field="run_dir",
        ) from error
    model.eval()
    return model


def _check_checkpoint_files(checkpoint: Path) -> None:
    """The checkpoint's tensors are the ones its ``state.json`` hashed (an unreadable
    ``state.json`` leaves nothing to compare; reading the weights names a damaged file)."""
    try:
        state = read_json(checkpoint / "state.json")
    except (OSError, ValueError):
        return
    wrong = mismatched_checkpoint_file(checkpoint, state) if isinstance(state, dict) else None
    if wrong is not None:
        raise InputError(
            f"{wrong} is not the file its checkpoint's state.json was written with (its hash differs); "
            "restore it or retrain",
            field="run_dir",
        )


def refuse_a_run_as_experiment_out(out_dir: Path) -> None:
    """An experiment's output directory (reproduce, sweep, mitigations) must not be a toy run
    directory or lie inside one: building the experiment there, with ``--overwrite``,
    would delete a trained run another result holds."""
    target = out_dir.resolve()
    for place in (target, *target.parents):
        if (place / CONFIG_FILE).is_file() and (place / METRICS_FILE).is_file():
            where = "is" if place == target else "lies inside"
            raise InputError(
                f"{out_dir} {where} the toy run {place}, which writing there would delete; "
                "choose another output directory",
                field="out_dir",
            )
