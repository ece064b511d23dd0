"""Deciding a resume before touching anything: which checkpoint a run continues from,
whether that checkpoint was trained with the settings asked for now, and whether the
run directory can be written at all.

Everything here only reads. ``sinkscope.toy.run_member`` acts on the decision (quarantines
the unreadable checkpoints, trims the metrics, records the new config) only once every
check has passed, so a refused resume leaves the run directory exactly as it was.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError

from sinkscope.infra.atomic_io import read_json
from sinkscope.infra.codec import decode, encode
from sinkscope.infra.errors import InputError
from sinkscope.toy.checkpoint import load_tensors
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.run_dir import CHECKPOINTS, RunConfig, TrainConfig, checkpoint_dirs
from sinkscope.toy.run_integrity import CHECKPOINT_HASHES, mismatched_checkpoint_file

# settings that decide when checkpoints are written or how many are kept, never the numbers
NUMBER_NEUTRAL = {("train", "max_steps"), ("train", "checkpoint_every"), ("train", "keep_checkpoints")}
RUN_RECORD = "run"  # state.json's key holding the settings that trained the checkpoint


class RunDirectoryError(InputError):
    """The run directory cannot be used as asked (exists with another config, etc.)."""


class UnusableCheckpoint(Exception):
    """One checkpoint cannot be read back (the reason is the message); an older one may."""


@dataclass
class CheckpointRead:
    """A checkpoint read back whole: its directory, ``state.json`` and tensors."""

    directory: Path
    state: dict
    weights: dict[str, torch.Tensor]
    tensors: dict[str, torch.Tensor]


@dataclass
class ResumePoint:
    """The newest usable checkpoint, and the newer ones passed over (with why)."""

    checkpoint: CheckpointRead
    passed_over: list[tuple[Path, str]] = field(default_factory=list)


def run_record(config: RunConfig) -> dict:
    """What a checkpoint records of the settings that trained it (``state.json``'s ``run``)."""
    encoded = encode(config)
    return {section: encoded[section] for section in ("model", "task", "train")}


def record_differences(old: dict, new: dict) -> list[str]:
    """Dotted names of the settings that change the numbers and differ between two
    ``run_record`` dicts (the checkpoint settings and ``max_steps`` may differ). The lr is
    compared as the rate it resolves to: no lr and the default lr train the same numbers."""
    old, new = _with_resolved_lr(old), _with_resolved_lr(new)
    return [
        f"{section}.{key}"
        for section in ("model", "task", "train")
        for key in sorted(set(_section(old, section)) | set(_section(new, section)))
        if (section, key) not in NUMBER_NEUTRAL and _section(old, section).get(key) != _section(new, section).get(key)
    ]


def _with_resolved_lr(record: dict) -> dict:
    """``record`` with ``train.lr`` None replaced by the rate the architecture defaults to."""
    train, n_layers = _section(record, "train"), _section(record, "model").get("n_layers")
    if train.get("lr") is not None or not isinstance(n_layers, int) or isinstance(n_layers, bool) or n_layers < 1:
        return record
    default = TrainConfig().learning_rate(ToyModelConfig(n_layers=n_layers))
    return {**record, "train": {**train, "lr": default}}


def _section(record: dict, name: str) -> dict:
    """One section of a run record; a section edited into something else reads as empty
    (so every setting in it differs and is named)."""
    section = record.get(name)
    return section if isinstance(section, dict) else {}


def _checked_state(state: object, step_name: str) -> dict:
    """``state.json`` of the layout ``write_step_checkpoint`` writes, else UnusableCheckpoint."""
    if not isinstance(state, dict):
        raise UnusableCheckpoint("state.json is not an object")
    step = state.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0 or f"step-{step:08d}" != step_name:
        raise UnusableCheckpoint(f"state.json's step is {step!r}, not the integer its folder name says")
    wall = state.get("wall_seconds")
    if not isinstance(wall, (int, float)) or isinstance(wall, bool) or not wall >= 0:
        raise UnusableCheckpoint(f"state.json's wall_seconds is {wall!r}, not a number >= 0")
    groups = state.get("param_groups")
    if not (isinstance(groups, list) and groups and all(isinstance(g, dict) for g in groups)):
        raise UnusableCheckpoint("state.json's param_groups is not a list of optimizer groups")
    lr = groups[0].get("lr")
    if not isinstance(lr, (int, float)) or isinstance(lr, bool):
        raise UnusableCheckpoint(f"state.json's learning rate is {lr!r}, not a number")
    if not isinstance(state.get("device", "cpu"), str) or not isinstance(state.get(RUN_RECORD, {}), dict):
        raise UnusableCheckpoint("state.json's device or run record has the wrong type")
    if not all(isinstance(state.get(key, ""), str) for _, key in CHECKPOINT_HASHES):
        raise UnusableCheckpoint("state.json's hashes of its tensor files are not strings")
    return state


def read_checkpoint(directory: Path) -> CheckpointRead:
    """One checkpoint read back whole, or UnusableCheckpoint saying why not."""
    name = "state.json"
    try:
        state = _checked_state(read_json(directory / name), directory.name)
        name = "model.safetensors"
        weights = load_tensors(directory / name)
        name = "optimizer.safetensors"
        tensors = load_tensors(directory / name)
    except (OSError, ValueError, SafetensorError) as error:
        cause = error.__cause__ or error  # the reader's own words, without the remedy meant for one file
        raise UnusableCheckpoint(f"{name} unreadable: {str(cause).strip() or type(cause).__name__}") from error
    if "rng.data_generator" not in tensors:
        raise UnusableCheckpoint("optimizer.safetensors holds no data generator state")
    return CheckpointRead(directory, state, weights, tensors)


def newest_usable_checkpoint(run_dir: Path, fits: Callable[[CheckpointRead], None]) -> ResumePoint:
    """The newest checkpoint that reads back whole and that ``fits`` accepts (it raises
    UnusableCheckpoint for one that does not fit the model); nothing is renamed here."""
    passed_over: list[tuple[Path, str]] = []
    for candidate in reversed(checkpoint_dirs(run_dir)):
        try:
            checkpoint = read_checkpoint(candidate)
            fits(checkpoint)  # tensors of another model are named as such, before their hash
            _refuse_swapped_files(checkpoint)
        except UnusableCheckpoint as error:
            passed_over.append((candidate, str(error)))
            continue
        return ResumePoint(checkpoint, passed_over)
    reasons = "; ".join(f"{path.name}: {why}" for path, why in passed_over)
    raise RunDirectoryError(
        f"no checkpoint in {run_dir / CHECKPOINTS} can be used ({reasons}); nothing was changed; restore the "
        "checkpoints, or overwrite the run to retrain it from step 0",
        field="overwrite",
    )


def _refuse_swapped_files(checkpoint: CheckpointRead) -> None:
    """A tensor file that reads back but is not the one its ``state.json`` hashed was put
    there after the checkpoint was written (a crash cannot do that: every file is written
    whole), so its numbers are not this run's: refused, never passed over in silence."""
    wrong = mismatched_checkpoint_file(checkpoint.directory, checkpoint.state)
    if wrong is not None:
        raise RunDirectoryError(
            f"{wrong} is not the file its state.json was written with (its hash differs), so the run cannot "
            "continue from it; nothing was changed; restore it, move that checkpoint folder away to resume from "
            "an older one, or overwrite the run to retrain it from step 0",
            field="overwrite",
        )


def recorded_config(run_dir: Path) -> RunConfig | None:
    """The run's settings as its newest checkpoint that recorded them says (what a resume
    needs when ``config.json`` is missing); None when no checkpoint's ``state.json`` holds
    a readable record (checkpoints written before the record existed)."""
    for candidate in reversed(checkpoint_dirs(run_dir)):
        try:
            state = read_json(candidate / "state.json")
            record = state.get(RUN_RECORD) if isinstance(state, dict) else None
            if isinstance(record, dict):
                return decode(RunConfig, record, f"{candidate / 'state.json'} run")
        except (OSError, ValueError):  # unreadable, or a record edited into nonsense: an older one may hold it
            continue
    return None


def check_trained_as_asked(run_dir: Path, state: dict, config: RunConfig, device_kind: str | None) -> None:
    """Refuse, naming the setting, a checkpoint trained otherwise than ``config`` asks now:
    its own record (seed, architecture, task, lr) and device, not only ``config.json``
    (which can be edited). Checkpoints written before the record existed are checked on
    lr and device only; ``device_kind=None`` skips the device (a finished run's stored
    result does not depend on where it would continue)."""
    lr = config.train.learning_rate(config.model)
    trained_lr = state["param_groups"][0]["lr"]
    if trained_lr != lr:
        raise RunDirectoryError(
            f"{run_dir}'s checkpoints were trained at lr {trained_lr:g} but its config.json says train.lr {lr:g}; "
            "put the lr back in config.json and resume with it, or train with the new lr into another run directory",
            field="lr",
        )
    differing = record_differences(state.get(RUN_RECORD) or run_record(config), run_record(config))
    if differing:
        recorded = state[RUN_RECORD]
        parts = [
            f"{name} {_value(recorded, name)!r} (asked: {_value(run_record(config), name)!r})" for name in differing
        ]
        raise RunDirectoryError(
            f"{run_dir}'s checkpoints were trained with {', '.join(parts)}; their weights belong to those settings: "
            "resume with them (and put them back in config.json), or train the new settings into another run directory",
            field=differing[0].split(".")[-1],
        )
    trained_on = state.get("device", "cpu")  # checkpoints from before devices existed are CPU ones
    if (
        device_kind is not None and trained_on != device_kind
    ):  # the data generator's state only fits its own kind of device
        raise RunDirectoryError(
            f"{run_dir} was trained on {trained_on} and its data stream continues only there; "
            f"resume it on device {trained_on}",
            field="device",
        )


def _value(record: dict, dotted: str) -> object:
    section, key = dotted.split(".", 1)
    return _section(record, section).get(key)


def _refuse_foreign_entries(run_dir: Path) -> None:
    """The checkpoints folder, and each ``step-*`` entry in it, must be a folder: a file or
    pipe in their place would only fail later, as an output location to choose anew."""
    root = run_dir / CHECKPOINTS
    entries = [root] + (sorted(root.glob("step-*")) if root.is_dir() else [])
    for entry in entries:
        if os.path.lexists(entry) and not entry.is_dir():
            raise RunDirectoryError(
                f"{entry} is not a checkpoint folder (it is a file, link or pipe); remove it, then resume",
                field="run_dir",
            )


def check_writable(run_dir: Path) -> None:
    """A resume writes checkpoints, metrics and the config into ``run_dir``: refuse a
    read-only one before anything is written."""
    _refuse_foreign_entries(run_dir)
    for folder in (run_dir, run_dir / CHECKPOINTS):
        if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
            raise RunDirectoryError(
                f"{folder} is read-only, so the run cannot continue there; make it writable (chmod u+w) "
                "or copy the run to a writable place and resume the copy",
                field="run_dir",
            )


def fresh_quarantine_name(directory: Path) -> Path:
    """``unreadable-<name>`` beside ``directory``, or ``unreadable-<name>.2``, ``.3``, ...
    when that name is taken (an earlier quarantine is never replaced)."""
    base = directory.with_name(f"unreadable-{directory.name}")
    candidate, number = base, 1
    while os.path.lexists(candidate):
        number += 1
        candidate = base.with_name(f"{base.name}.{number}")
    return candidate
