"""Train K toy models that differ only in their seed as one batched computation.

The K models' weights are stacked (``torch.func.stack_module_state``) and run with
``vmap``; one Adam steps the stacked weights. Adam is elementwise and each member's loss
depends only on its own slice, so every member follows the same trajectory as
``toy.train.train`` with its seed (up to float rounding in batched matmuls). A member
that converges (or hits ``max_steps``) is written out and dropped from the stack.

Each member's run directory has exactly the format ``train`` writes, checkpoints
included, so any member can later be resumed or inspected on its own.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import torch
from torch.func import functional_call, stack_module_state, vmap
from tqdm.auto import tqdm

from interp.atomic_io import holds_files, locked_directory, read_json
from interp.checkpoint import optimizer_to_tensors, save_tensors
from interp.hook_names import pattern_hook
from toy.interrupt import StepBoundaryInterrupt, interrupts_at_step_boundaries
from toy.run_dir import (
    FINAL_WEIGHTS,
    METRICS_FILE,
    RESULT_FILE,
    RunConfig,
    TrainResult,
    append_metrics,
    checkpoint_dirs,
    read_config,
    write_checkpoint,
    write_config,
    write_result,
)
from toy.task import sample_batch
from toy.train import (
    TRAIN_THREADS,
    RunDirectoryError,
    TrainingDiverged,
    _build,
    _config_differences,
    _restore,
    head_anchor_masses,
    paper_adam,
    torch_threads,
    train,
)


class _Member:
    """One model of the batch: its config, run directory, data stream and a real
    ``ToyTransformer`` used to write checkpoints and to log per-head metrics."""

    def __init__(self, config: RunConfig, run_dir: Path) -> None:
        self.config = config
        self.run_dir = run_dir
        self.model, self.optimizer, self.generator = _build(config)
        self.wall_before = 0.0


def _check_batchable(configs: list[RunConfig], run_dirs: list[Path]) -> None:
    if not configs:
        raise ValueError("train_batched needs at least one config")
    if len(configs) != len(run_dirs):
        raise ValueError(f"got {len(configs)} configs but {len(run_dirs)} run directories; pass one directory per config")
    if len(set(run_dirs)) != len(run_dirs):
        raise ValueError("run directories must be distinct")
    reference = configs[0].to_dict()
    reference["train"].pop("seed")
    for config in configs[1:]:
        other = config.to_dict()
        other["train"].pop("seed")
        if other != reference:
            raise ValueError(
                "batched training needs configs that differ only in train.seed; "
                "train other differences separately (toy.train.train)"
            )


def _pending(member: _Member) -> bool:
    """True when the member still has steps to run (fresh or interrupted)."""
    if not (member.run_dir / RESULT_FILE).exists() or not (member.run_dir / FINAL_WEIGHTS).exists():
        return True
    result = TrainResult.from_dict(read_json(member.run_dir / RESULT_FILE))
    return result.status == "max_steps" and result.steps < member.config.train.max_steps


def train_batched(
    configs: list[RunConfig],
    run_dirs: list[str | os.PathLike],
    progress: bool = True,
    on_log: Callable[[int], None] | None = None,
) -> list[TrainResult]:
    """Train ``configs`` (identical but for ``train.seed``) together; one result per config.

    Finished runs are returned as stored; interrupted runs resume together when their
    latest checkpoints share a step, otherwise each resumes on its own through ``train``.
    A member whose loss becomes NaN is stopped with its last good checkpoint kept; the
    others continue, and ``TrainingDiverged`` is raised at the end naming it.
    ``on_log(step)`` is called every ``log_every`` steps, as in ``train``.
    """
    paths = [Path(d) for d in run_dirs]
    _check_batchable(configs, paths)
    members = [_Member(c, p) for c, p in zip(configs, paths)]
    results: dict[Path, TrainResult] = {}
    to_train: list[_Member] = []
    for member in members:
        if member.run_dir.exists() and not _pending(member):
            results[member.run_dir] = train(member.config, member.run_dir, progress=False, on_log=on_log)
        else:
            to_train.append(member)
    if to_train:
        latest = {checkpoint_dirs(m.run_dir)[-1].name if checkpoint_dirs(m.run_dir) else None for m in to_train}
        if len(latest) > 1:
            # members interrupted at different steps cannot share a stack: resume one by one
            for member in to_train:
                results[member.run_dir] = train(member.config, member.run_dir, progress=progress, on_log=on_log)
        else:
            for member, result in zip(to_train, _train_together(to_train, progress, on_log)):
                results[member.run_dir] = result
    ordered = [results[p] for p in paths]
    diverged = [r for r in ordered if r.status == "diverged"]
    if diverged:
        raise TrainingDiverged(
            f"{len(diverged)} of {len(ordered)} runs diverged ({', '.join(r.run_dir for r in diverged)}); "
            "their last good checkpoints are kept; lower the learning rate (--lr) and retrain them"
        )
    return ordered


def _prepare(member: _Member) -> int:
    """Create or restore the member's run directory; returns the step it starts from."""
    run_dir = member.run_dir
    if (run_dir / "config.json").exists():
        differing = _config_differences(read_config(run_dir), member.config)
        if differing:
            raise RunDirectoryError(
                f"{run_dir} already holds a run with a different config ({', '.join(differing)}); "
                "choose another directory or delete it"
            )
    elif holds_files(run_dir):
        raise RunDirectoryError(f"{run_dir} exists and is not a toy run directory; choose an empty or new directory")
    run_dir.mkdir(parents=True, exist_ok=True)
    if checkpoint_dirs(run_dir):
        for stale in (RESULT_FILE, FINAL_WEIGHTS):
            (run_dir / stale).unlink(missing_ok=True)
        lr = member.config.train.learning_rate(member.config.model)
        step, member.wall_before = _restore(run_dir, member.model, member.optimizer, member.generator, lr)
        write_config(run_dir, member.config)
        return step
    write_config(run_dir, member.config)
    (run_dir / METRICS_FILE).unlink(missing_ok=True)
    return 0


class _Stack:
    """The active members' weights ``{name: [K, ...]}`` and the Adam that steps them."""

    def __init__(self, members: list[_Member]) -> None:
        self.members = members
        self.base = copy.deepcopy(members[0].model).to("meta")
        self.names = [name for name, _ in members[0].model.named_parameters()]
        params, self.buffers = stack_module_state([m.model for m in members])
        self.params = {name: params[name] for name in self.names}
        first = members[0]
        self.optimizer = paper_adam(list(self.params.values()), first.config)
        self._load_member_optimizer_states()
        self.forward = vmap(lambda p, b, x: functional_call(self.base, (p, b), (x,)))

    def _load_member_optimizer_states(self) -> None:
        """Stack the members' Adam states (all at the same step) into the batched Adam."""
        states = [m.optimizer.state_dict()["state"] for m in self.members]
        if not states[0]:
            return
        for index, name in enumerate(self.names):
            param = self.params[name]
            self.optimizer.state[param] = {
                "step": states[0][index]["step"].clone(),
                "exp_avg": torch.stack([s[index]["exp_avg"] for s in states]),
                "exp_avg_sq": torch.stack([s[index]["exp_avg_sq"] for s in states]),
            }

    def sync_member(self, k: int) -> None:
        """Copy slice ``k`` of the stacked weights and Adam state into member k's own model
        and optimizer, so checkpoints and metrics use the single-model code paths."""
        member = self.members[k]
        with torch.no_grad():
            for index, (name, param) in enumerate(member.model.named_parameters()):
                param.copy_(self.params[name][k])
                state = self.optimizer.state.get(self.params[name])
                if state:
                    member.optimizer.state[param] = {
                        "step": state["step"].clone(),
                        "exp_avg": state["exp_avg"][k].clone(),
                        "exp_avg_sq": state["exp_avg_sq"][k].clone(),
                    }

    def without(self, drop: set[int]) -> "_Stack | None":
        keep = [k for k in range(len(self.members)) if k not in drop]
        if not keep:
            return None
        for k in keep:
            self.sync_member(k)
        return _Stack([self.members[k] for k in keep])


def _train_together(members: list[_Member], progress: bool, on_log: Callable[[int], None] | None) -> list[TrainResult]:
    with ExitStack() as held:
        for member in members:  # as in ``train``: one trainer per run directory, one thread
            held.enter_context(locked_directory(member.run_dir))
        held.enter_context(torch_threads(TRAIN_THREADS))
        interrupt = held.enter_context(interrupts_at_step_boundaries())
        return _train_locked(members, progress, on_log, interrupt)


def _train_locked(
    members: list[_Member], progress: bool, on_log: Callable[[int], None] | None, interrupt: StepBoundaryInterrupt
) -> list[TrainResult]:
    starts = [_prepare(m) for m in members]
    step = starts[0]
    resumed_from = step if step > 0 else None
    train_cfg, task_cfg = members[0].config.train, members[0].config.task
    target = members[0].config.model.target
    stack: _Stack | None = _Stack(members)
    results: dict[int, TrainResult] = {}
    index_of = {id(m): k for k, m in enumerate(members)}
    started = time.perf_counter()
    last_checkpoint = step if resumed_from is not None else -1
    bar = tqdm(total=train_cfg.max_steps, initial=step, disable=not progress,
               desc=f"{len(members)} seeds", leave=False)

    def finish(k: int, status: str, loss: float, linf: float, data_state: torch.Tensor) -> None:
        member = stack.members[k]
        stack.sync_member(k)
        wall = member.wall_before + time.perf_counter() - started
        if status != "diverged":
            if step != last_checkpoint:
                _checkpoint(member, step, data_state, wall)
            save_tensors(member.run_dir / FINAL_WEIGHTS, member.model.state_dict())
        result = TrainResult(str(member.run_dir), status, status == "converged", step, wall, linf, loss, resumed_from)
        write_result(member.run_dir, result)
        results[index_of[id(member)]] = result

    try:
        while stack is not None:
            data_states = [m.generator.get_state() for m in stack.members]
            if interrupt.requested:  # between steps, as in ``train``: checkpoint every active member
                if step != last_checkpoint:
                    for k, member in enumerate(stack.members):
                        stack.sync_member(k)
                        _checkpoint(member, step, data_states[k], member.wall_before + time.perf_counter() - started)
                raise KeyboardInterrupt
            batches = [sample_batch(task_cfg, train_cfg.batch_size, m.generator, target) for m in stack.members]
            tokens = torch.stack([b.tokens for b in batches])  # [K, batch, pos, d_model]
            targets = torch.stack([b.targets for b in batches])
            error = stack.forward(stack.params, stack.buffers, tokens) - targets
            losses = error.pow(2).mean(dim=(1, 2, 3))  # [K]
            linfs = error.detach().abs().amax(dim=(1, 2, 3))
            loss_values, linf_values = losses.detach().tolist(), linfs.tolist()
            finished: set[int] = set()
            for k, member in enumerate(stack.members):
                loss_k, linf_k = loss_values[k], linf_values[k]
                if not (torch.isfinite(losses[k]) and linf_k == linf_k and linf_k != float("inf")):
                    finish(k, "diverged", loss_k, linf_k, data_states[k])
                    finished.add(k)
                    continue
                if step % train_cfg.checkpoint_every == 0 and step != last_checkpoint:
                    stack.sync_member(k)
                    _checkpoint(member, step, data_states[k], member.wall_before + time.perf_counter() - started)
                converged = linf_k < train_cfg.stop_linf
                if step % train_cfg.log_every == 0 or converged or step >= train_cfg.max_steps:
                    stack.sync_member(k)
                    _log(member, step, loss_k, linf_k, batches[k])
                if converged or step >= train_cfg.max_steps:
                    finish(k, "converged" if converged else "max_steps", loss_k, linf_k, data_states[k])
                    finished.add(k)
            if step % train_cfg.checkpoint_every == 0:
                last_checkpoint = step
            if on_log is not None and step % train_cfg.log_every == 0:
                on_log(step)
            continuing = [k for k in range(len(stack.members)) if k not in finished]
            if not continuing:
                break
            bar.set_postfix(active=len(continuing), linf=f"{min(linf_values[k] for k in continuing):.2e}", refresh=False)
            stack.optimizer.zero_grad(set_to_none=True)
            losses[continuing].sum().backward()
            stack.optimizer.step()
            step += 1
            bar.update(1)
            if finished:
                stack = stack.without(finished)
    finally:
        bar.close()
    return [results[k] for k in range(len(members))]


def _checkpoint(member: _Member, step: int, data_state: torch.Tensor, wall: float) -> None:
    tensors, groups = optimizer_to_tensors(member.optimizer)
    tensors["rng.data_generator"] = data_state
    write_checkpoint(member.run_dir, step, member.model, tensors,
                     {"wall_seconds": wall, "param_groups": groups}, member.config.train.keep_checkpoints)


def _log(member: _Member, step: int, loss: float, linf: float, batch) -> None:
    names = {pattern_hook(layer) for layer in range(member.config.model.n_layers)}
    with torch.no_grad():
        _, cache = member.model.run_with_cache(batch.tokens, names_filter=lambda name: name in names)
    default, trigger = head_anchor_masses(member.model, batch, dict(cache.items()))
    append_metrics(member.run_dir, {
        "step": step, "loss": loss, "linf_error": linf,
        "anchor_mass_default": default, "anchor_mass_trigger": trigger,
    })

