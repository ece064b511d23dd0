"""Train toy models on the trigger task, as the paper does: Adam (0.9, 0.95), no weight
decay, fresh batches of 128 every step, stop when the batch's max absolute error falls
below 5e-3. Resumable, reproducible (same seed, same device, same numbers), and it
refuses to continue past a NaN.

One trainer: ``train_seeds`` trains K >= 1 models that differ only in their seed as one
stack on one device; ``train`` is K = 1. With K = 1 the stack is the model itself; with
K > 1 the weights are stacked (``torch.func.stack_module_state``) and run with ``vmap``,
and one Adam steps them all. Adam is elementwise and each model's loss depends only on
its own slice, so every model follows its own trajectory (up to float rounding in
batched matmuls). A model that converges, reaches ``max_steps`` or diverges is written
out and leaves the stack without changing the others. Every model has its own run
directory (``sinkscope.toy.run_dir`` format), so any of them can be resumed or inspected alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch

from sinkscope.infra.arguments import PATH_TYPES, check_argument, check_items, check_path
from sinkscope.infra.atomic_io import atomic_directory, followed, holds_files, locked_directory
from sinkscope.infra.devices import resolve_device
from sinkscope.infra.errors import InputError, RunFailed
from sinkscope.infra.swap import recover_swaps
from sinkscope.toy.compiled_step import compile_wanted
from sinkscope.toy.interrupt import StepBoundaryInterrupt, interrupts_at_step_boundaries
from sinkscope.toy.memory import check_fits
from sinkscope.toy.resume import RunDirectoryError
from sinkscope.toy.run_dir import (
    CONFIG_FILE,
    METRICS_FILE,
    RESULT_FILE,
    RunConfig,
    TrainResult,
    checkpoint_dirs,
    read_config,
)
from sinkscope.toy.run_member import RunMember, open_run
from sinkscope.toy.seed_stack import OnLog, train_stack
from sinkscope.toy.tracking import RunTrackers, TrackingConfig

# A toy step is a few 16-wide matmuls: a second intra-op thread gains little on an idle
# machine and costs several-fold once another process wants the core (the threads wait
# on each other at every op). More cores go to more training processes instead
# (benchmarks/bench_under_load.py measures both).
TRAIN_THREADS = 1


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``threads`` for the block, then restored."""
    if threads < 1:
        raise InputError(f"threads must be >= 1, got {threads}", field="threads")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def uses_device_rule(device: torch.device, compiled: bool) -> bool:
    """Whether the stop rule is decided on the device (``sinkscope.toy.device_stop``, read
    at the steps that log or checkpoint): compiled, or off the CPU (where a host read per
    step is a synchronisation). Eager on the CPU the host reads each step's L-inf: the same
    numbers, without the copies that freeze a stopped seed. Compiled steps round
    differently from eager ones; eager CPU is the reference."""
    return compiled or device.type != "cpu"


class TrainingDiverged(RunFailed):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


def unit_device(device: str, executor: str) -> str:
    """Where a unit trains. Locally: ``resolve_device`` on this machine. On Ray, ``cuda``
    or ``cuda:N`` is plain ``cuda``, checked on the GPU node the unit lands on (Ray gives
    each GPU unit its own device; the driver may have none); ``auto`` is decided here."""
    if executor != "ray" or device == "auto":
        return str(resolve_device(device))
    kind = str(device).split(":")[0]
    if kind != "cuda":
        return str(resolve_device(device))  # cpu, mps here; anything else: the one-line refusal
    return kind


def _checked_arguments(
    configs: Sequence[RunConfig],
    run_dirs: Sequence[str | os.PathLike],
    tracking: TrackingConfig | None,
    on_log: OnLog | None = None,
) -> tuple[list[RunConfig], list[Path]]:
    """``train_seeds``'s arguments checked (types, one directory per config, configs that
    can train together, the tracking packages installed) before anything is touched."""
    if on_log is not None and not callable(on_log):
        raise InputError(
            f"on_log must be a function (step, record) or None, got {type(on_log).__name__}", field="on_log"
        )
    configs = check_items(configs, object, "configs", "RunConfigs")  # each item's type: _check_stackable
    paths = [Path(p) for p in check_items(run_dirs, PATH_TYPES, "run_dirs", "run directory paths")]
    if tracking is not None:
        check_argument(tracking, TrackingConfig, "tracking", "a TrackingConfig or None")
        tracking.check()  # a missing package: one line before any directory is touched
    _check_stackable(configs, paths)
    return configs, paths


def _check_stackable(configs: Sequence[RunConfig], run_dirs: Sequence[Path]) -> None:
    if not configs:
        raise InputError("train_seeds needs at least one config")
    for config in configs:
        if not isinstance(config, RunConfig):
            raise InputError(
                f"config must be a RunConfig (sinkscope.toy.run_dir), got {type(config).__name__}", field="config"
            )
    if len(configs) != len(run_dirs):
        raise InputError(
            f"got {len(configs)} configs but {len(run_dirs)} run directories; pass one directory per config"
        )
    if len({run_dir.resolve() for run_dir in run_dirs}) != len(run_dirs):
        raise InputError("run directories must be distinct")
    reference = configs[0].without_seed()
    for config in configs[1:]:
        if config.without_seed() != reference:
            raise InputError(
                "models trained together need configs that differ only in train.seed; "
                "train other differences in separate calls"
            )


def train(
    config: RunConfig,
    run_dir: str | os.PathLike,
    resume: bool = True,
    progress: bool = True,
    on_log: OnLog | None = None,
    threads: int = TRAIN_THREADS,
    device: str | torch.device = "cpu",
    tracking: TrackingConfig | None = None,
    compile: str = "auto",
    overwrite: bool = False,
) -> TrainResult:
    """Train one toy model into ``run_dir`` and return how it ended (``train_seeds`` with
    K = 1; the arguments are the same)."""
    check_argument(config, RunConfig, "config", "a RunConfig")
    check_path(run_dir, "run_dir", "a run directory path (str or pathlib.Path)")
    return train_seeds([config], [run_dir], resume, progress, on_log, threads, device, tracking, compile, overwrite)[0]


def train_seeds(
    configs: Sequence[RunConfig],
    run_dirs: Sequence[str | os.PathLike],
    resume: bool = True,
    progress: bool = True,
    on_log: OnLog | None = None,
    threads: int = TRAIN_THREADS,
    device: str | torch.device = "cpu",
    tracking: TrackingConfig | None = None,
    compile: str = "auto",
    overwrite: bool = False,
) -> list[TrainResult]:
    """Train ``configs`` (identical but for ``train.seed``) together, one run dir each.

    With ``resume=True`` an existing run directory with the same config continues from
    its newest intact checkpoint (a finished run returns its stored result). Only
    ``train.max_steps`` may differ on resume: raising it continues a run that stopped at
    ``max_steps``, with the same numbers as an uninterrupted run of the new length. Runs
    that resume from different steps train in separate stacks, one after another. Any
    other difference is refused rather than overwritten. A run whose loss becomes NaN
    stops with its last good checkpoint kept; the others continue, and
    ``TrainingDiverged`` is raised at the end naming it. ``on_log(step, record)`` is called
    for every line written to a run's ``metrics.jsonl`` (every ``log_every`` steps and at
    a run's last step), once per run of the stack: ``record`` is that line (a dict) with
    ``run`` added, ``str(Path(run_dir))`` of the run it belongs to. ``threads``: torch
    intra-op threads while training (restored after; ``TRAIN_THREADS`` by default). ``device``: ``cpu``, ``cuda[:N]`` or ``auto``;
    batches are drawn there, reproducible per seed on a given kind of device.
    ``tracking`` (W&B/TensorBoard: ``sinkscope.toy.tracking``) and ``compile`` (on, off, auto:
    ``sinkscope.toy.compiled_step``) are not part of the run's config: a run resumes with either.
    Ctrl-C or SIGTERM stops at the next step boundary with a checkpoint of that step.
    A run that cannot continue (no checkpoint beside an earlier attempt's files, a
    checkpoint file that is not the one its ``state.json`` hashed) is refused naming
    ``overwrite``. ``overwrite=True`` retrains each existing run from step 0 (``resume`` is
    then ignored), built beside it and swapped in whole once training ends: interrupted
    or killed, the old run stays as it was, and no file of it survives beside the new.
    """
    configs, paths = _checked_arguments(configs, run_dirs, tracking, on_log)
    target_device, compiled = resolve_device(device), compile_wanted(compile, resolve_device(device))
    # refused before any directory is made or any tensor allocated
    check_fits(configs[0].model, configs[0].train.batch_size, len(configs), target_device)
    results: dict[int, TrainResult] = {}
    with ExitStack() as held:
        _lock_runs(held, paths)
        held.enter_context(torch_threads(threads))
        interrupt = held.enter_context(interrupts_at_step_boundaries())
        opened = _open_runs(held, configs, paths, resume, overwrite, target_device)
        results.update({index: run for index, run in opened.items() if isinstance(run, TrainResult)})
        members = {index: run for index, run in opened.items() if isinstance(run, RunMember)}
        # runs that train now are tracked (one finished earlier has nothing new to log);
        # opened once every directory is accepted, so a refused call leaves no tracked run
        runs = [(m.location, m.config) for m in members.values()]
        trackers = held.enter_context(RunTrackers(tracking, runs, [m.run_dir for m in members.values()]))
        log = _both(on_log, trackers.on_log if tracking is not None else None)
        results.update(_train_by_start(members, progress, log, interrupt, compiled))
    ordered = [results[index] for index in range(len(configs))]
    diverged = [result for result in ordered if result.status == "diverged"]
    if diverged:
        raise TrainingDiverged(_diverged_message(diverged), field="lr")
    return ordered


def _lock_runs(held: ExitStack, paths: list[Path]) -> None:
    """Lock every run directory on ``held``: a second trainer on any of them is refused, not
    interleaved. First, a restart that was killed mid-swap gets its old run back (before the
    lock would make an empty directory in its place)."""
    for path in paths:
        recover_swaps(followed(path))
    for path in paths:
        held.enter_context(locked_directory(path))


def _open_runs(
    held: ExitStack, configs: list[RunConfig], paths: list[Path], resume: bool, overwrite: bool, device: torch.device
) -> dict[int, TrainResult | RunMember]:
    """Each run opened where it trains (``_training_place``), by index: its stored result or its member."""
    places = [_training_place(held, path, overwrite) for path in paths]
    return {
        index: open_run(config, place, resume, device, path)
        for index, (config, place, path) in enumerate(zip(configs, places, paths))
    }


def _training_place(held: ExitStack, run_dir: Path, overwrite: bool) -> Path:
    """Where the run ``run_dir`` trains: in place, or, restarted over an existing run
    (``overwrite``), in a build directory beside it (``atomic_directory``, entered on
    ``held``) that replaces it whole when ``held`` closes without an error; an error,
    an interrupt or a kill leaves the old run as it was (a kill's leftovers are removed
    by the next command on it: ``train_seeds`` recovers each run's swaps first). Only a toy
    run is replaced this way."""
    if not (overwrite and holds_files(run_dir)):
        return run_dir
    if not _is_a_run(run_dir):
        raise RunDirectoryError(
            f"{run_dir} holds files that are not a toy run (no readable {CONFIG_FILE}, no checkpoint), which "
            "overwriting would delete; choose an empty or new directory",
            field="run_dir",
        )
    return held.enter_context(atomic_directory(run_dir, replace=True))


def _is_a_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a toy run: a config.json that reads as one, or checkpoints."""
    if checkpoint_dirs(run_dir):
        return True
    try:
        read_config(run_dir)
    except InputError:
        return False
    return True


def _train_by_start(
    members: dict[int, RunMember],
    progress: bool,
    log: OnLog | None,
    interrupt: StepBoundaryInterrupt,
    compiled: bool = False,
) -> dict[int, TrainResult]:
    """Train the members in one stack per starting step, earliest first; results by index."""
    results: dict[int, TrainResult] = {}
    device_rule = bool(members) and uses_device_rule(next(iter(members.values())).device, compiled)
    try:
        for start in sorted({member.step for member in members.values()}):
            group = [index for index, member in members.items() if member.step == start]
            trained = train_stack([members[index] for index in group], progress, log, interrupt, device_rule, compiled)
            results.update(zip(group, trained))
    except BaseException:
        _discard_unstarted(members.values())
        raise
    return results


def _discard_unstarted(members: Iterable[RunMember]) -> None:
    """A run that failed before its first checkpoint never trained anything: leave no
    half-made run directory (its config alone) behind. One with a checkpoint or a result
    is a run that can be resumed or read, and is kept whole."""
    for member in members:
        if member.resumed_from is None and not checkpoint_dirs(member.run_dir):
            if not (member.run_dir / RESULT_FILE).exists():
                (member.run_dir / METRICS_FILE).unlink(missing_ok=True)
                (member.run_dir / CONFIG_FILE).unlink(missing_ok=True)


def _both(first: OnLog | None, second: OnLog | None) -> OnLog | None:
    """One callback calling ``first`` then ``second`` (either may be None)."""
    if first is None or second is None:
        return first or second

    def both(step: int, record: dict) -> None:
        first(step, record)
        second(step, record)

    return both


def _diverged_message(diverged: list[TrainResult]) -> str:
    parts = []
    for result in diverged:
        good = checkpoint_dirs(Path(result.run_dir))
        parts.append(
            f"{result.run_dir}: loss became {result.loss} at step {result.steps}, last good checkpoint "
            f"{good[-1].name if good else 'none'} kept in {Path(result.run_dir) / 'checkpoints'}"
        )
    return "; ".join(parts) + "; training stopped; lower the learning rate (lr) and retrain"
