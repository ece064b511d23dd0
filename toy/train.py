"""Train a toy model on the trigger task, as the paper does: Adam (0.9, 0.95), no weight
decay, fresh batches of 128 every step, stop when the batch's max absolute error falls
below 5e-3. Resumable, reproducible (same seed, same numbers on CPU), and it refuses to
continue past a NaN.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError
from tqdm.auto import tqdm

from interp.atomic_io import atomic_write_text, holds_files, locked_directory, read_json
from interp.checkpoint import (
    load_tensors,
    optimizer_from_tensors,
    optimizer_to_tensors,
    save_tensors,
)
from probes.sink_metrics import anchor_mass
from toy.interrupt import StepBoundaryInterrupt, interrupts_at_step_boundaries
from toy.model import ToyTransformer
from toy.run_dir import (
    FINAL_WEIGHTS,
    METRICS_FILE,
    RESULT_FILE,
    RunConfig,
    TrainResult,
    append_metrics,
    checkpoint_dirs,
    read_config,
    read_metrics,
    write_checkpoint,
    write_config,
    write_result,
)
from toy.task import TaskBatch, sample_batch

DATA_SEED_OFFSET = 1_000_003  # data and init draw from different streams of one seed

# A toy step is a few 16-wide matmuls: a second intra-op thread gains little on an idle
# machine and costs several-fold once another process wants the core (the threads wait
# on each other at every op). More cores go to more training processes instead
# (benchmarks/bench_under_load.py measures both).
TRAIN_THREADS = 1


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``threads`` for the block, then restored."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


class RunDirectoryError(ValueError):
    """The run directory cannot be used as asked (exists with another config, etc.)."""


def head_anchor_masses(model: ToyTransformer, batch: TaskBatch, patterns: dict[str, torch.Tensor]) -> tuple[list, list]:
    """Per-layer lists of per-head BOS mass at default and at trigger queries."""
    default, trigger = [], []
    default_mask, trigger_mask = batch.default_query_mask(), batch.trigger_query_mask()
    for layer in range(model.cfg.n_layers):
        pattern = patterns[f"blocks.{layer}.attn.hook_pattern"]
        default.append([round(float(x), 6) for x in anchor_mass(pattern, 0, default_mask)])
        trigger.append([round(float(x), 6) for x in anchor_mass(pattern, 0, trigger_mask)])
    return default, trigger


def paper_adam(params: Iterable[torch.Tensor], config: RunConfig) -> torch.optim.Adam:
    """The paper's optimiser: Adam with the run's betas, no weight decay, no schedule.

    ``fused``: one kernel for all parameters, 3x faster than the foreach Adam on these
    tiny models (0.09 vs 0.28 ms a step at 4x4); it rounds differently at about 1e-8.
    """
    return torch.optim.Adam(
        params,
        lr=config.train.learning_rate(config.model),
        betas=(config.train.beta1, config.train.beta2),
        weight_decay=0.0,
        fused=True,
    )


def _build(config: RunConfig) -> tuple[ToyTransformer, torch.optim.Adam, torch.Generator]:
    torch.manual_seed(config.train.seed)
    model = ToyTransformer(config.model)
    optimizer = paper_adam(model.parameters(), config)
    generator = torch.Generator().manual_seed(config.train.seed + DATA_SEED_OFFSET)
    return model, optimizer, generator


def _restore(
    run_dir: Path, model: ToyTransformer, optimizer: torch.optim.Adam, generator: torch.Generator, lr: float
) -> tuple[int, float]:
    """Load the newest intact checkpoint; returns (step, wall seconds spent before it).

    A newer checkpoint that cannot be read (a file cut short by a full disk or a crash
    outside the atomic write) is passed over with one line on stderr and renamed
    ``unreadable-step-*``, so that nothing else (pruning, ``load_model``, the divergence
    message) takes it for a good checkpoint; it is kept for inspection."""
    for candidate in reversed(checkpoint_dirs(run_dir)):
        try:
            state = read_json(candidate / "state.json")
            weights = load_tensors(candidate / "model.safetensors")
            tensors = load_tensors(candidate / "optimizer.safetensors")
        except (OSError, ValueError, SafetensorError) as error:
            quarantine = candidate.with_name(f"unreadable-{candidate.name}")
            candidate.rename(quarantine)
            print(f"sinkscope: checkpoint {candidate} is unreadable ({type(error).__name__}), kept as {quarantine.name}; "
                  "trying an older one", file=sys.stderr)
            continue
        break
    else:
        raise RunDirectoryError(
            f"no checkpoint in {run_dir / 'checkpoints'} can be read; move that folder away to restart the run from step 0"
        )
    trained_lr = state["param_groups"][0]["lr"]
    if trained_lr != lr:  # config.json edited by hand since the checkpoint: refuse before touching anything
        raise RunDirectoryError(
            f"{run_dir}'s checkpoints were trained at lr {trained_lr:g} but its config.json says train.lr {lr:g}; "
            "put the lr back in config.json, or train with the new lr into another --out"
        )
    model.load_state_dict(weights)
    generator.set_state(tensors.pop("rng.data_generator"))
    optimizer_from_tensors(optimizer, tensors, state["param_groups"])
    # A checkpoint at step s holds the state *before* step s's batch is drawn, so the
    # metrics of step s (computed on that batch) and later belong to steps that will be
    # redone: keep only the ones before it.
    kept = [r for r in read_metrics(run_dir) if r["step"] < state["step"]]
    atomic_write_text(run_dir / METRICS_FILE, "".join(_json_line(r) for r in kept))
    return state["step"], state["wall_seconds"]


def _config_differences(existing: RunConfig, wanted: RunConfig) -> list[str]:
    """Dotted names of the settings that differ, ignoring ``train.max_steps`` (a run may be
    extended or stopped earlier; everything else changes the numbers)."""
    old, new = existing.to_dict(), wanted.to_dict()
    return [
        f"{section}.{key}"
        for section in old
        for key in sorted(set(old[section]) | set(new[section]))
        if (section, key) != ("train", "max_steps") and old[section].get(key) != new[section].get(key)
    ]


def _json_line(record: dict) -> str:
    return json.dumps(record) + "\n"


def train(
    config: RunConfig,
    run_dir: str | os.PathLike,
    resume: bool = True,
    progress: bool = True,
    on_log: Callable[[int], None] | None = None,
    threads: int = TRAIN_THREADS,
) -> TrainResult:
    """Train one toy model into ``run_dir`` and return how it ended.

    With ``resume=True`` an existing run directory with the same config continues from its
    latest checkpoint (a finished run returns its stored result). Only ``train.max_steps``
    may differ on resume: raising it continues a run that stopped at ``max_steps``, with the
    same numbers as an uninterrupted run of the new length. A directory holding any other
    different setting is refused rather than overwritten. ``on_log(step)`` is called at
    every metrics step. ``threads``: torch intra-op threads while training (the caller's
    setting is restored after); one by default, see ``TRAIN_THREADS``.
    """
    run_dir = Path(run_dir)
    # a second trainer on this directory is refused, not interleaved
    with locked_directory(run_dir), torch_threads(threads), interrupts_at_step_boundaries() as interrupt:
        return _train_locked(config, run_dir, resume, progress, on_log, interrupt)


def _train_locked(
    config: RunConfig,
    run_dir: Path,
    resume: bool,
    progress: bool,
    on_log: Callable[[int], None] | None,
    interrupt: StepBoundaryInterrupt,
) -> TrainResult:
    resumed_from: int | None = None
    existing: RunConfig | None = None
    if (run_dir / "config.json").exists():
        existing = read_config(run_dir)
        differing = _config_differences(existing, config)
        if differing:
            raise RunDirectoryError(
                f"{run_dir} already holds a run with a different config ({', '.join(differing)}; only "
                "train.max_steps may change on resume); choose another --out directory or delete it"
            )
        if not resume:
            raise RunDirectoryError(f"{run_dir} already holds a run; pass resume=True (--resume) or choose another directory")
    elif holds_files(run_dir):
        raise RunDirectoryError(f"{run_dir} exists and is not a toy run directory; choose an empty or new directory")
    run_dir.mkdir(parents=True, exist_ok=True)

    model, optimizer, generator = _build(config)
    step, wall_before = 0, 0.0
    if (run_dir / RESULT_FILE).exists() and (run_dir / FINAL_WEIGHTS).exists():
        result = TrainResult.from_dict(read_json(run_dir / RESULT_FILE))
        finished = result.status == "converged" or (
            result.status == "max_steps" and result.steps >= config.train.max_steps
        )
        if finished:
            return result
        # max_steps was raised: continue from the final checkpoint. Drop the stale result and
        # final weights first so an interruption cannot leave them describing an older step.
        (run_dir / RESULT_FILE).unlink()
        (run_dir / FINAL_WEIGHTS).unlink()
    if checkpoint_dirs(run_dir):
        step, wall_before = _restore(run_dir, model, optimizer, generator, config.train.learning_rate(config.model))
        resumed_from = step
        if existing is not None and existing != config:
            write_config(run_dir, config)  # record the new max_steps
    else:
        write_config(run_dir, config)
        if (run_dir / METRICS_FILE).exists():
            (run_dir / METRICS_FILE).unlink()

    train_cfg, task_cfg = config.train, config.task
    target = config.model.target
    pattern_filter = lambda name: name.endswith("hook_pattern")  # noqa: E731
    started = time.perf_counter()
    bar = tqdm(total=train_cfg.max_steps, initial=step, disable=not progress, desc=run_dir.name, leave=False)
    status = "max_steps"
    loss_value = linf_value = float("nan")

    last_checkpoint = step if resumed_from is not None else -1

    def checkpoint(at_step: int, data_state: torch.Tensor) -> None:
        """Save the state at the start of ``at_step``: weights and Adam state before its
        update, and the data generator before its batch is drawn (``data_state``)."""
        nonlocal last_checkpoint
        tensors, groups = optimizer_to_tensors(optimizer)
        tensors["rng.data_generator"] = data_state
        wall = wall_before + time.perf_counter() - started
        write_checkpoint(run_dir, at_step, model, tensors, {"wall_seconds": wall, "param_groups": groups}, train_cfg.keep_checkpoints)
        last_checkpoint = at_step

    try:
        while True:
            data_state = generator.get_state()
            if interrupt.requested:  # between steps: the state is one step's, consistent
                if step != last_checkpoint:
                    checkpoint(step, data_state)
                raise KeyboardInterrupt
            batch = sample_batch(task_cfg, train_cfg.batch_size, generator, target)
            log_now = step % train_cfg.log_every == 0
            if log_now:
                output, cache = model.run_with_cache(batch.tokens, names_filter=pattern_filter)
            else:
                output = model(batch.tokens)
            error = output - batch.targets
            loss = error.pow(2).mean()
            loss_value, linf_value = float(loss.detach()), float(error.detach().abs().max())
            if not (torch.isfinite(loss) and linf_value == linf_value and linf_value != float("inf")):
                status = "diverged"
                break
            # Checkpoint only states whose loss is known to be finite, so the "last good
            # checkpoint" named on divergence really is good.
            if step % train_cfg.checkpoint_every == 0 and step != last_checkpoint:
                checkpoint(step, data_state)
            converged = linf_value < train_cfg.stop_linf
            if log_now or converged or step >= train_cfg.max_steps:
                if not log_now:
                    _, cache = model.run_with_cache(batch.tokens, names_filter=pattern_filter)
                default, trigger = head_anchor_masses(model, batch, dict(cache.items()))
                append_metrics(run_dir, {
                    "step": step, "loss": loss_value, "linf_error": linf_value,
                    "anchor_mass_default": default, "anchor_mass_trigger": trigger,
                })
                bar.set_postfix(loss=f"{loss_value:.2e}", linf=f"{linf_value:.2e}", refresh=False)
                if on_log is not None:
                    on_log(step)
            if converged:
                status = "converged"
                break
            if step >= train_cfg.max_steps:
                break
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            bar.update(1)
    finally:
        bar.close()

    wall = wall_before + time.perf_counter() - started
    if status == "diverged":
        good = checkpoint_dirs(run_dir)
        good_step = good[-1].name if good else "none"
        result = TrainResult(str(run_dir), status, False, step, wall, linf_value, loss_value, resumed_from)
        write_result(run_dir, result)
        raise TrainingDiverged(
            f"loss became {loss_value} at step {step}; training stopped and the last good checkpoint "
            f"({good_step}) is kept in {run_dir / 'checkpoints'}; lower the learning rate (--lr) and retrain"
        )
    if step != last_checkpoint:
        checkpoint(step, data_state)
    save_tensors(run_dir / FINAL_WEIGHTS, model.state_dict())
    result = TrainResult(str(run_dir), status, status == "converged", step, wall, linf_value, loss_value, resumed_from)
    write_result(run_dir, result)
    return result
