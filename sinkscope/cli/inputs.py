"""What a command reads, and the one rule that keeps its output away from it.

Every command in the registry (``sinkscope.cli.commands``) names the paths it reads with a
``paths(args) -> CommandPaths`` function: model files and folders, text and prompt files,
the caches it loads from (the Hugging Face hub's and datasets', the compiler's), result
directories, and anything it writes beside its output. Before the command runs, the entry
point applies ``refuse_output_over_inputs`` to them, so an ``--out`` that holds one of them,
or lies inside one, is refused in one line before anything is written, moved or deleted,
with or without ``--overwrite``. Paths are compared after symbolic links are resolved.
"""

from __future__ import annotations

import getpass
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sinkscope.infra.atomic_io import check_output_directory, inside, refuse_overlap

INPUTS_NAME = "this command's own input"


@dataclass(frozen=True)
class CommandPaths:
    """Where a command writes and what it reads.

    out: the directory the command's result replaces whole; None where it was not given and
    the command's default lies under the current directory (the command checks it there).
    reads: every path the command reads, or writes beside ``out``, that replacing ``out``
    must not delete. own: places inside an input that belong to the command (``toy probe``'s
    ``RUN_DIR/probe``). replaces_out: False for a command that only adds its own files to
    ``out`` (``report``), where an input inside ``out`` is safe. reads_name: what the
    inputs are, in the refusal (``the run``)."""

    out: Path | None
    reads: tuple[Path, ...] = ()
    own: tuple[Path, ...] = ()
    replaces_out: bool = True
    reads_name: str = INPUTS_NAME


def refuse_output_over_inputs(paths: CommandPaths) -> None:
    """The rule: refuse an output directory that holds any path the command reads (replacing
    it would delete the input) or lies inside one (writing there would change it)."""
    if paths.out is None:
        return
    if paths.replaces_out:  # the current directory, a file, a mount point: named as such, first
        check_output_directory(paths.out)
    reads = paths.reads if paths.replaces_out else tuple(item for item in paths.reads if not inside(item, paths.out))
    refuse_overlap(paths.out, reads, paths.reads_name, paths.own)


def existing_files(*files: str | os.PathLike | None) -> list[Path]:
    """Each of ``files`` that is a file (a missing one, or a folder given as a file, is the
    command's own error to report)."""
    return [Path(file) for file in files if file is not None and Path(file).is_file()]


def model_paths(models: Iterable[str]) -> list[Path]:
    """What loading ``models`` reads: a local model (file or folder) itself, and for a model
    named by hub id, the Hugging Face cache it is read from."""
    paths = [Path(model) for model in models if os.path.lexists(model)]
    if any(not os.path.lexists(model) for model in models):
        paths.append(hub_cache())
    return paths


def hub_cache() -> Path:
    """The Hugging Face hub's model cache, as ``huggingface_hub`` places it (environment included)."""
    from huggingface_hub.constants import HF_HUB_CACHE

    return Path(HF_HUB_CACHE)


def datasets_cache() -> Path:
    """The cache a hub dataset's prompts are read from, as ``datasets`` places it."""
    from huggingface_hub.constants import HF_HOME

    return Path(os.environ.get("HF_DATASETS_CACHE") or Path(HF_HOME) / "datasets")


def compiler_cache() -> Path:
    """Where ``torch.compile`` keeps its compiled kernels: ``TORCHINDUCTOR_CACHE_DIR``, else
    torch's default beside the temporary directory."""
    configured = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if configured:
        return Path(configured)
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name in this container: torch falls back the same way
        user = "unknown"
    return Path(tempfile.gettempdir()) / f"torchinductor_{user}"


def training_paths(out: str | None, tensorboard_dir: str | None) -> CommandPaths:
    """A training command's: it writes ``out``, may compile (the compiler's cache), and logs
    TensorBoard events beside it, which a replacement of ``out`` must not delete."""
    reads = [compiler_cache(), *([Path(tensorboard_dir)] if tensorboard_dir else [])]
    return CommandPaths(Path(out) if out else None, tuple(reads))


def run_analysis_paths(run_dir: str, out_dir: str | None, own_folder: str) -> CommandPaths:
    """A command that analyses one toy run: it reads the run, and its default output,
    ``RUN_DIR/<own_folder>``, is its own place inside it."""
    own = Path(run_dir) / own_folder
    return CommandPaths(Path(out_dir) if out_dir else own, (Path(run_dir),), (own,), reads_name="the run")
