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

import copy
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError
from sinkscope.interp.hook_names import pattern_hook
from sinkscope.probes.sink_metrics import anchor_mass
from sinkscope.toy.checkpoint import (
    load_tensors,
    optimizer_from_tensors,
    optimizer_to_tensors,
    save_tensors,
)
from sinkscope.toy.interrupt import StepBoundaryInterrupt, interrupts_at_step_boundaries
from sinkscope.toy.model import ToyTransformer
from sinkscope.toy.progress import LOG_INTERVAL_S, TERMINAL_INTERVAL_S
from sinkscope.toy.run_dir import (
    FINAL_WEIGHTS,
    METRICS_FILE,
    RESULT_FILE,
    RunConfig,
    TrainResult,
    append_metrics,
    checkpoint_dirs,
    read_config,
    read_metrics,
    read_train_result,
    write_checkpoint,
    write_config,
    write_train_result,
)
from sinkscope.toy.task import TaskBatch, sample_batch
from sinkscope.toy.tracking import RunTrackers, TrackingConfig
from torch.func import functional_call, stack_module_state, vmap
from tqdm.auto import tqdm

from sinkscope.infra.atomic_io import atomic_write_text, holds_files, locked_directory, read_json
from sinkscope.infra.codec import encode
from sinkscope.infra.devices import resolve_device
from sinkscope.infra.errors import InputError, RunFailed

DATA_SEED_OFFSET = 1_000_003  # data and init draw from different streams of one seed

# A toy step is a few 16-wide matmuls: a second intra-op thread gains little on an idle
# machine and costs several-fold once another process wants the core (the threads wait
# on each other at every op). More cores go to more training processes instead
# (benchmarks/bench_under_load.py measures both).
TRAIN_THREADS = 1

# on_log(step, record): ``record`` is the line just written to one run's metrics.jsonl
# (step, loss, linf_error, anchor_mass_default, anchor_mass_trigger) with ``run`` added,
# ``str(Path(run_dir))``: the members of a stack log the same steps, and the directory is
# what tells them apart (and what a caller already holds for each run).
OnLog = Callable[[int, dict], None]


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


class TrainingDiverged(RunFailed):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


class RunDirectoryError(InputError):
    """The run directory cannot be used as asked (exists with another config, etc.)."""


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


def head_anchor_masses(model: ToyTransformer, batch: TaskBatch, patterns: dict[str, torch.Tensor]) -> tuple[list, list]:
    """Per-layer lists of per-head BOS mass at default and at trigger queries
    (``patterns``: hook name -> ``[batch, head, query, key]``)."""
    default, trigger = [], []
    default_mask, trigger_mask = batch.default_query_mask(), batch.trigger_query_mask()
    for layer in range(model.cfg.n_layers):
        pattern = patterns[f"blocks.{layer}.attn.hook_pattern"]
        default.append([round(float(x), 6) for x in anchor_mass(pattern, 0, default_mask)])
        trigger.append([round(float(x), 6) for x in anchor_mass(pattern, 0, trigger_mask)])
    return default, trigger


def paper_adam(params: Iterable[torch.Tensor], config: RunConfig) -> torch.optim.Adam:
    """The paper's optimiser: Adam with the run's betas, no weight decay, no schedule.

    ``fused``: one kernel for all parameters, faster than the foreach Adam on these tiny
    models, where per-op overhead dominates; it rounds differently at about 1e-8.
    """
    return torch.optim.Adam(
        params,
        lr=config.train.learning_rate(config.model),
        betas=(config.train.beta1, config.train.beta2),
        weight_decay=0.0,
        fused=True,
    )


def _build(config: RunConfig, device: torch.device) -> tuple[ToyTransformer, torch.optim.Adam, torch.Generator]:
    """A fresh model, its Adam and its data generator. The weights are drawn on the CPU
    (the same initial model on every device); batches are drawn on ``device``."""
    torch.manual_seed(config.train.seed)
    model = ToyTransformer(config.model).to(device)
    optimizer = paper_adam(model.parameters(), config)
    generator = torch.Generator(device=device).manual_seed(config.train.seed + DATA_SEED_OFFSET)
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
            print(
                f"sinkscope: checkpoint {candidate} is unreadable ({type(error).__name__}), kept as {quarantine.name}; "
                "trying an older one",
                file=sys.stderr,
            )
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
            "put the lr back in config.json, or train with the new lr into another run directory",
            field="lr",
        )
    trained_on = state.get("device", "cpu")  # checkpoints from before devices existed are CPU ones
    if trained_on != generator.device.type:  # the data generator's state only fits its own kind of device
        raise RunDirectoryError(
            f"{run_dir} was trained on {trained_on} and its data stream continues only there; "
            f"resume it on device {trained_on}",
            field="device",
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
    old, new = encode(existing), encode(wanted)
    return [
        f"{section}.{key}"
        for section in ("model", "task", "train")
        for key in sorted(set(old[section]) | set(new[section]))
        if (section, key) != ("train", "max_steps") and old[section].get(key) != new[section].get(key)
    ]


def _json_line(record: dict) -> str:
    return json.dumps(record) + "\n"


class _Member:
    """One model of a stack: its config, run directory, own ``ToyTransformer`` (used for
    checkpoints and metrics), Adam, data generator, and where it (re)starts."""

    def __init__(self, config: RunConfig, run_dir: Path, device: torch.device) -> None:
        self.config = config
        self.run_dir = run_dir
        self.model, self.optimizer, self.generator = _build(config, device)
        self.device = device
        self.step = 0
        self.wall_before = 0.0
        self.resumed_from: int | None = None


def _open_run(config: RunConfig, run_dir: Path, resume: bool, device: torch.device) -> TrainResult | _Member:
    """The run directory's one owner: validate it against ``config`` and return either
    the stored result of a finished run or a member ready to train (fresh, or restored
    from its newest intact checkpoint)."""
    existing: RunConfig | None = None
    if (run_dir / "config.json").exists():
        existing = read_config(run_dir)
        differing = _config_differences(existing, config)
        if differing:
            raise RunDirectoryError(
                f"{run_dir} already holds a run with a different config ({', '.join(differing)}; only "
                "train.max_steps may change on resume); choose another run directory or delete it",
                field="run_dir",
            )
        if not resume:
            raise RunDirectoryError(
                f"{run_dir} already holds a run; pass resume=True or choose another directory", field="resume"
            )
    elif holds_files(run_dir):
        raise RunDirectoryError(f"{run_dir} exists and is not a toy run directory; choose an empty or new directory")
    run_dir.mkdir(parents=True, exist_ok=True)
    if (run_dir / RESULT_FILE).exists() and (run_dir / FINAL_WEIGHTS).exists():
        result = read_train_result(run_dir)
        if result.status == "converged" or (result.status == "max_steps" and result.steps >= config.train.max_steps):
            return result
        # max_steps was raised: continue from the final checkpoint. Drop the stale result and
        # final weights first so an interruption cannot leave them describing an older step.
        (run_dir / RESULT_FILE).unlink()
        (run_dir / FINAL_WEIGHTS).unlink()
    member = _Member(config, run_dir, device)
    if checkpoint_dirs(run_dir):
        lr = config.train.learning_rate(config.model)
        member.step, member.wall_before = _restore(run_dir, member.model, member.optimizer, member.generator, lr)
        member.resumed_from = member.step
        if existing is not None and existing != config:
            write_config(run_dir, config)  # record the new max_steps
    else:
        write_config(run_dir, config)
        (run_dir / METRICS_FILE).unlink(missing_ok=True)
    return member


def _check_stackable(configs: Sequence[RunConfig], run_dirs: Sequence[Path]) -> None:
    if not configs:
        raise InputError("train_seeds needs at least one config")
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
) -> TrainResult:
    """Train one toy model into ``run_dir`` and return how it ended (``train_seeds`` with
    K = 1; the arguments are the same)."""
    return train_seeds([config], [run_dir], resume, progress, on_log, threads, device, tracking)[0]


def train_seeds(
    configs: Sequence[RunConfig],
    run_dirs: Sequence[str | os.PathLike],
    resume: bool = True,
    progress: bool = True,
    on_log: OnLog | None = None,
    threads: int = TRAIN_THREADS,
    device: str | torch.device = "cpu",
    tracking: TrackingConfig | None = None,
) -> list[TrainResult]:
    """Train ``configs`` (identical but for ``train.seed``) together, one run directory
    each; one result per config, in order.

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
    ``tracking``: log each run that trains to W&B and/or TensorBoard (``sinkscope.toy.tracking``);
    not part of the run's config, so a run resumes with it on or off.
    Ctrl-C or SIGTERM stops at the next step boundary with a checkpoint of that step.
    """
    if tracking is not None:
        tracking.check()  # a missing package: one line before any directory is touched
    paths = [Path(run_dir) for run_dir in run_dirs]
    _check_stackable(configs, paths)
    target_device = resolve_device(device)
    results: dict[int, TrainResult] = {}
    with ExitStack() as held:
        for path in paths:  # a second trainer on any of these directories is refused, not interleaved
            held.enter_context(locked_directory(path))
        held.enter_context(torch_threads(threads))
        interrupt = held.enter_context(interrupts_at_step_boundaries())
        members: dict[int, _Member] = {}
        for index, (config, path) in enumerate(zip(configs, paths)):
            opened = _open_run(config, path, resume, target_device)
            if isinstance(opened, TrainResult):
                results[index] = opened
            else:
                members[index] = opened
        # runs that train now are tracked (one finished earlier has nothing new to log);
        # opened once every directory is accepted, so a refused call leaves no tracked run
        trackers = held.enter_context(RunTrackers(tracking, [(m.run_dir, m.config) for m in members.values()]))
        log = _both(on_log, trackers.on_log if tracking is not None else None)
        for start in sorted({member.step for member in members.values()}):
            group = [index for index, member in members.items() if member.step == start]
            trained = _train_stack([members[index] for index in group], progress, log, interrupt)
            results.update(zip(group, trained))
    ordered = [results[index] for index in range(len(configs))]
    diverged = [result for result in ordered if result.status == "diverged"]
    if diverged:
        raise TrainingDiverged(_diverged_message(diverged), field="lr")
    return ordered


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


class _Stack:
    """The active members' weights and the Adam that steps them. One member: its own
    model and Adam, unchanged (the single-model numbers exactly). Several: weights
    stacked ``{name: [K, ...]}`` and run with ``vmap``."""

    def __init__(self, members: list[_Member]) -> None:
        self.members = members
        if len(members) == 1:
            only = members[0]
            self.optimizer = only.optimizer
            self._model = only.model
            return
        self.base = copy.deepcopy(members[0].model).to("meta")
        self.names = [name for name, _ in members[0].model.named_parameters()]
        params, self.buffers = stack_module_state([m.model for m in members])
        self.params = {name: params[name] for name in self.names}
        self.optimizer = paper_adam(list(self.params.values()), members[0].config)
        self._load_member_optimizer_states()
        self._batched = vmap(lambda p, b, x: functional_call(self.base, (p, b), (x,)))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [K, batch, pos, d_model]`` -> outputs of the same shape."""
        if len(self.members) == 1:
            return self._model(tokens[0]).unsqueeze(0)
        return self._batched(self.params, self.buffers, tokens)

    def _load_member_optimizer_states(self) -> None:
        """Stack the members' Adam states (all at the same step) into the stack's Adam."""
        states = [m.optimizer.state_dict()["state"] for m in self.members]
        if not states[0]:
            return
        for index, name in enumerate(self.names):
            self.optimizer.state[self.params[name]] = {
                "step": states[0][index]["step"].clone(),
                "exp_avg": torch.stack([s[index]["exp_avg"] for s in states]),
                "exp_avg_sq": torch.stack([s[index]["exp_avg_sq"] for s in states]),
            }

    def sync_member(self, k: int) -> None:
        """Copy slice ``k`` of the stacked weights and Adam state into member k's own model
        and Adam, so checkpoints and metrics use the single-model code paths (a no-op for
        one member: its model is the stack)."""
        if len(self.members) == 1:
            return
        member = self.members[k]
        with torch.no_grad():
            for name, param in member.model.named_parameters():
                param.copy_(self.params[name][k])
                state = self.optimizer.state.get(self.params[name])
                if state:
                    member.optimizer.state[param] = {
                        "step": state["step"].clone(),
                        "exp_avg": state["exp_avg"][k].clone(),
                        "exp_avg_sq": state["exp_avg_sq"][k].clone(),
                    }

    def without(self, drop: set[int]) -> _Stack | None:
        keep = [k for k in range(len(self.members)) if k not in drop]
        if not keep:
            return None
        for k in keep:
            self.sync_member(k)
        return _Stack([self.members[k] for k in keep])


class _StackTraining:
    """One ``_train_stack`` call under way: the stack of members still training, the step
    they are at, the last step checkpointed, the results so far, the progress bar and
    the caller's ``on_log``."""

    def __init__(self, members: list[_Member], progress: bool, on_log: OnLog | None) -> None:
        self.members = members
        self.progress = progress
        self.on_log = on_log
        self.step = members[0].step
        self.train_cfg, self.task_cfg = members[0].config.train, members[0].config.task
        self.target = members[0].config.model.target
        self.stack: _Stack | None = _Stack(members)
        self.results: dict[int, TrainResult] = {}
        self.index_of = {id(m): k for k, m in enumerate(members)}
        self.started = time.perf_counter()
        self.last_checkpoint = self.step if self.step > 0 else -1
        label = members[0].run_dir.name if len(members) == 1 else f"{len(members)} seeds"
        # in a log (stderr not a terminal) a line every LOG_INTERVAL_S seconds, not a redraw per update
        self.bar = tqdm(
            total=self.train_cfg.max_steps,
            initial=self.step,
            disable=not progress,
            desc=label,
            leave=False,
            mininterval=TERMINAL_INTERVAL_S if sys.stderr.isatty() else LOG_INTERVAL_S,
        )

    def elapsed(self, member: _Member) -> float:
        """``member``'s training time: before this call and since it started."""
        return member.wall_before + time.perf_counter() - self.started

    def train_step(self, interrupt: StepBoundaryInterrupt) -> bool:
        """One step of every member of the stack; False when none continues."""
        stack, train_cfg = self.stack, self.train_cfg
        assert stack is not None  # called only while members are training
        data_states = [m.generator.get_state() for m in stack.members]
        if interrupt.requested:  # between steps: each member's state is one step's, consistent
            self._checkpoint_all(data_states)
            raise KeyboardInterrupt
        batches, tokens, targets = self._draw_batches()
        error = stack.forward(tokens) - targets
        losses = error.pow(2).mean(dim=(1, 2, 3))  # [K]
        linfs = error.detach().abs().amax(dim=(1, 2, 3))
        loss_values, linf_values = losses.detach().tolist(), linfs.tolist()
        finished = self._record(batches, data_states, loss_values, linf_values)
        if self.step % train_cfg.checkpoint_every == 0:
            self.last_checkpoint = self.step
        continuing = [k for k in range(len(stack.members)) if k not in finished]
        if not continuing:
            return False
        if self.progress and self.step % train_cfg.log_every == 0:
            self.bar.set_postfix_str(
                f"{len(continuing)} training, best L-inf {min(linf_values[k] for k in continuing):.1e} "
                f"(stops below {train_cfg.stop_linf:g})",
                refresh=False,
            )
        stack.optimizer.zero_grad(set_to_none=True)
        (losses if len(continuing) == len(losses) else losses[continuing]).sum().backward()
        stack.optimizer.step()
        self.step += 1
        self.bar.update(1)
        if finished:
            self.stack = stack.without(finished)
        return True

    def _checkpoint_all(self, data_states: list[torch.Tensor]) -> None:
        """Checkpoint every member at the current step (unless this step already is)."""
        assert self.stack is not None
        if self.step != self.last_checkpoint:
            for k, member in enumerate(self.stack.members):
                self.stack.sync_member(k)
                _checkpoint(member, self.step, data_states[k], self.elapsed(member))

    def _draw_batches(self) -> tuple[list[TaskBatch], torch.Tensor, torch.Tensor]:
        """Each member's next batch from its own generator, and their tokens and targets
        stacked ``[K, batch, pos, d_model]``."""
        assert self.stack is not None
        batches = [
            sample_batch(self.task_cfg, self.train_cfg.batch_size, m.generator, self.target) for m in self.stack.members
        ]
        if len(batches) == 1:  # a view, not a copy: K = 1 costs what a plain training step does
            return batches, batches[0].tokens.unsqueeze(0), batches[0].targets.unsqueeze(0)
        return batches, torch.stack([b.tokens for b in batches]), torch.stack([b.targets for b in batches])

    def _record(
        self,
        batches: list[TaskBatch],
        data_states: list[torch.Tensor],
        loss_values: list[float],
        linf_values: list[float],
    ) -> set[int]:
        """Per member, this step's checkpoint, log line and finish (diverged, converged or
        at ``max_steps``); the stack indices of the members that finished."""
        assert self.stack is not None
        step, train_cfg = self.step, self.train_cfg
        finished: set[int] = set()
        for k, member in enumerate(self.stack.members):
            loss_k, linf_k = loss_values[k], linf_values[k]
            if not (math.isfinite(loss_k) and math.isfinite(linf_k)):
                self._finish(k, "diverged", loss_k, linf_k, data_states[k])
                finished.add(k)
                continue
            # checkpoint only states whose loss is known to be finite, so the "last good
            # checkpoint" named on divergence really is good
            if step % train_cfg.checkpoint_every == 0 and step != self.last_checkpoint:
                self.stack.sync_member(k)
                _checkpoint(member, step, data_states[k], self.elapsed(member))
            converged = linf_k < train_cfg.stop_linf
            if step % train_cfg.log_every == 0 or converged or step >= train_cfg.max_steps:
                self.stack.sync_member(k)
                record = _log(member, step, loss_k, linf_k, batches[k])
                if self.on_log is not None:
                    threads = torch.get_num_threads()
                    self.on_log(step, {**record, "run": str(member.run_dir)})
                    # a callback may change torch's thread count; on some CPUs 2 threads sum in
                    # another order than 1, so the trainer's own count holds for its steps
                    if torch.get_num_threads() != threads:
                        torch.set_num_threads(threads)
            if converged or step >= train_cfg.max_steps:
                self._finish(k, "converged" if converged else "max_steps", loss_k, linf_k, data_states[k])
                finished.add(k)
        return finished

    def _finish(self, k: int, status: str, loss: float, linf: float, data_state: torch.Tensor) -> None:
        """Write member k's final checkpoint and weights (unless it diverged) and its result."""
        assert self.stack is not None  # called for members of the stack being stepped
        member = self.stack.members[k]
        self.stack.sync_member(k)
        if status != "diverged":
            if self.step != self.last_checkpoint:
                _checkpoint(member, self.step, data_state, self.elapsed(member))
            save_tensors(member.run_dir / FINAL_WEIGHTS, member.model.state_dict())
        result = TrainResult(
            str(member.run_dir),
            status,
            status == "converged",
            self.step,
            self.elapsed(member),
            linf,
            loss,
            member.resumed_from,
        )
        write_train_result(member.run_dir, result)
        self.results[self.index_of[id(member)]] = result


def _train_stack(
    members: list[_Member], progress: bool, on_log: OnLog | None, interrupt: StepBoundaryInterrupt
) -> list[TrainResult]:
    """Train members that start at the same step until each converges, reaches
    ``max_steps`` or diverges; one result per member."""
    training = _StackTraining(members, progress, on_log)
    try:
        while training.stack is not None:
            if not training.train_step(interrupt):
                break
    finally:
        training.bar.close()
    return [training.results[k] for k in range(len(members))]


def _checkpoint(member: _Member, step: int, data_state: torch.Tensor, wall: float) -> None:
    """Save the state at the start of ``step``: weights and Adam state before its update,
    and the data generator before its batch is drawn (``data_state``)."""
    tensors, groups = optimizer_to_tensors(member.optimizer)
    tensors["rng.data_generator"] = data_state
    write_checkpoint(
        member.run_dir,
        step,
        member.model,
        tensors,
        {"wall_seconds": wall, "param_groups": groups, "device": member.device.type},
        member.config.train.keep_checkpoints,
    )


def _log(member: _Member, step: int, loss: float, linf: float, batch: TaskBatch) -> dict:
    """Append this step's metrics line to ``member``'s metrics.jsonl; returns the line."""
    names = {pattern_hook(layer) for layer in range(member.config.model.n_layers)}
    with torch.no_grad():
        _, cache = member.model.run_with_cache(batch.tokens, names_filter=lambda name: name in names)
    default, trigger = head_anchor_masses(member.model, batch, dict(cache.items()))
    return append_metrics(
        member.run_dir,
        {
            "step": step,
            "loss": loss,
            "linf_error": linf,
            "anchor_mass_default": default,
            "anchor_mass_trigger": trigger,
        },
    )
