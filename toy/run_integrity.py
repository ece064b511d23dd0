"""Checks that a run directory's files agree with each other before its weights are
analysed: ``result.json`` with the config, the final weights with the hash the finish
recorded, ``config.json`` with the settings its checkpoints were trained with, and that
each file is a regular file at all. Each check reads little and refuses in one line
naming the file, the setting and the fix; every reader goes through them via
``sinkscope.toy.run_dir`` (``require_finished`` and ``load_model``)."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from sinkscope.infra.atomic_io import read_json
from sinkscope.infra.errors import InputError
from sinkscope.toy.checkpoint import load_tensors

if TYPE_CHECKING:
    from sinkscope.toy.run_dir import RunConfig, TrainConfig, TrainResult

_KINDS = (
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def is_regular_file(path: Path) -> bool:
    """True for a regular file, False when nothing is there; anything else (a named pipe, a
    directory) is refused naming what it is. Only stat is used: opening a named pipe to
    read it would wait forever for a writer."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return False
    if stat.S_ISREG(mode):
        return True
    kind = next((name for test, name in _KINDS if test(mode)), "something else")
    raise InputError(f"{path} is {kind}, not a regular file; restore it or retrain", field="run_dir")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_result_fits_config(path: Path, result: TrainResult, train: TrainConfig) -> None:
    """A result that contradicts the run's own stopping rule was not written by its
    training: converged exactly when linf_error is below stop_linf, never past max_steps."""
    fix = "restore it, or delete it and resume the run"
    if result.status != "diverged" and result.converged != (result.linf_error < train.stop_linf):
        relation = "not below" if result.converged else "below"
        raise InputError(
            f"{path} says converged {result.converged} but its linf_error {result.linf_error:g} is {relation} the "
            f"run's stop_linf {train.stop_linf:g}; {fix}",
            field="linf_error",
        )
    if result.steps > train.max_steps:
        raise InputError(
            f"{path} says steps {result.steps}, more than the run's max_steps {train.max_steps}; {fix}", field="steps"
        )


def check_final_weights(weights: Path, expected_sha256: str | None) -> None:
    """The final weights are the ones the finish hashed into ``result.json`` (results
    written before the hash existed are not checked)."""
    if expected_sha256 is not None and file_sha256(weights) != expected_sha256:
        load_tensors(weights)  # a damaged file is named as unreadable, which is the more precise fix
        raise InputError(
            f"{weights} is not the weights this run finished with; restore them or retrain", field="run_dir"
        )


# the files of a checkpoint and the keys of its state.json that hold their hashes
CHECKPOINT_HASHES = (("model.safetensors", "weights_sha256"), ("optimizer.safetensors", "optimizer_sha256"))


def checkpoint_hashes(directory: Path) -> dict[str, str]:
    """What a checkpoint's ``state.json`` records of its tensor files: their hashes."""
    return {key: file_sha256(directory / name) for name, key in CHECKPOINT_HASHES}


def mismatched_checkpoint_file(directory: Path, state: dict) -> Path | None:
    """The first tensor file of the checkpoint ``directory`` that is not the one its
    ``state.json`` (``state``) hashed, as the final weights are tied to ``result.json``;
    None when all match (checkpoints written before the hashes existed are not checked)."""
    for name, key in CHECKPOINT_HASHES:
        expected = state.get(key)
        # a missing file is left to its reader, which names it
        if expected is not None and (directory / name).is_file() and file_sha256(directory / name) != expected:
            return directory / name
    return None


def check_config_against_record(config_path: Path, config: RunConfig, state_path: Path | None) -> None:
    """``config.json`` still says what the run was trained with, as recorded in its newest
    checkpoint's ``state.json`` (checkpoints written before the record existed, or none,
    leave nothing to compare)."""
    # resume.py reads run_dir.py, which calls this: imported here to keep that order
    from sinkscope.toy.resume import RUN_RECORD, record_differences, run_record

    if state_path is None or not state_path.is_file():
        return
    try:
        state = read_json(state_path)
    except (OSError, ValueError):
        return  # an unreadable checkpoint is the resume's to report; the record is only a cross-check
    recorded = state.get(RUN_RECORD) if isinstance(state, dict) else None
    if not isinstance(recorded, dict):
        return
    asked = run_record(config)
    differing = record_differences(recorded, asked)
    if differing:
        section, key = differing[0].split(".", 1)
        raise InputError(
            f"{config_path} says {differing[0]} {asked[section].get(key)!r} but the run was trained with "
            f"{_setting(recorded, section, key)!r} ({state_path}); put it back in config.json or retrain "
            "with the new setting",
            field=key,
        )


def _setting(record: dict, section: str, key: str) -> object:
    part = record.get(section)
    return part.get(key) if isinstance(part, dict) else None
