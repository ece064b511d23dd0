"""One toy model's run directory while it trains: open or resume it (its one owner),
build the model, Adam and data generator of the paper's recipe, restore the newest intact
checkpoint, and write each step's checkpoint and metrics line.

``sinkscope.toy.train`` trains stacks of these members; ``sinkscope.toy.run_dir`` defines the
directory's files.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

import torch

from sinkscope.infra.atomic_io import atomic_write_text, holds_files
from sinkscope.infra.errors import InputError
from sinkscope.interp.hook_names import pattern_hook
from sinkscope.probes.sink_metrics import SINK_EPS, SINK_RATE_EPSILONS, alpha_k, anchor_mass
from sinkscope.toy.checkpoint import optimizer_from_tensors, optimizer_to_tensors
from sinkscope.toy.metrics_log import metrics_before
from sinkscope.toy.model import ToyTransformer
from sinkscope.toy.resume import (
    RUN_RECORD,
    CheckpointRead,
    ResumePoint,
    RunDirectoryError,
    UnusableCheckpoint,
    check_trained_as_asked,
    check_writable,
    fresh_quarantine_name,
    newest_usable_checkpoint,
    read_checkpoint,
    record_differences,
    recorded_config,
    run_record,
)
from sinkscope.toy.run_dir import (
    CHECKPOINTS,
    CONFIG_FILE,
    FINAL_WEIGHTS,
    METRICS_FILE,
    RESULT_FILE,
    RunConfig,
    TrainResult,
    append_metrics,
    checkpoint_dirs,
    read_config,
    read_train_result,
    write_checkpoint,
    write_config,
)
from sinkscope.toy.task import TaskBatch

DATA_SEED_OFFSET = 1_000_003  # data and init draw from different streams of one seed


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


def build_member_state(
    config: RunConfig, device: torch.device
) -> tuple[ToyTransformer, torch.optim.Adam, torch.Generator]:
    """A fresh model, its Adam and its data generator. The weights are drawn on the CPU
    (the same initial model on every device); batches are drawn on ``device``."""
    torch.manual_seed(config.train.seed)
    model = ToyTransformer(config.model).to(device)
    optimizer = paper_adam(model.parameters(), config)
    generator = torch.Generator(device=device).manual_seed(config.train.seed + DATA_SEED_OFFSET)
    return model, optimizer, generator


def restore_checkpoint(member: RunMember, point: ResumePoint) -> None:
    """Start ``member`` from ``point``'s checkpoint (already read and checked): quarantine
    the newer checkpoints that could not be used, keep the metrics before its step.

    A newer checkpoint that cannot be used (a file cut short by a full disk or a crash
    outside the atomic write) is renamed ``unreadable-step-*`` (a fresh name when that is
    taken) with one line on stderr, so that nothing else (pruning, ``load_model``, the
    divergence message) takes it for a good checkpoint; it is kept for inspection."""
    state = point.checkpoint.state
    kept = metrics_before(member.run_dir, state["step"])  # may refuse: before anything is renamed
    for candidate, why in point.passed_over:
        quarantine = fresh_quarantine_name(candidate)
        candidate.rename(quarantine)
        print(
            f"sinkscope: checkpoint {candidate} is unreadable ({why}), kept as {quarantine.name}; "
            "resuming from an older one",
            file=sys.stderr,
        )
    # A checkpoint at step s holds the state *before* step s's batch is drawn, so the
    # metrics of step s (computed on that batch) and later belong to steps that will be
    # redone: keep only the ones before it.
    atomic_write_text(member.run_dir / METRICS_FILE, kept)
    member.step, member.wall_before = state["step"], float(state["wall_seconds"])
    member.resumed_from = member.step


def load_checkpoint_into(member: RunMember, checkpoint: CheckpointRead) -> None:
    """Check that ``checkpoint`` was trained as ``member`` asks (a refusal otherwise), then
    load it into the member's model, Adam and data generator (in memory only);
    UnusableCheckpoint when its tensors do not fit them."""
    check_trained_as_asked(member.run_dir, checkpoint.state, member.config, member.device.type)
    tensors = dict(checkpoint.tensors)
    try:
        member.model.load_state_dict(checkpoint.weights)
        member.generator.set_state(tensors.pop("rng.data_generator"))
        optimizer_from_tensors(member.optimizer, tensors, checkpoint.state["param_groups"])
    except (RuntimeError, ValueError, KeyError, TypeError) as error:  # shapes or names of another model
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UnusableCheckpoint(f"its tensors do not fit the run's model ({first_line})") from error


def config_differences(existing: RunConfig, wanted: RunConfig) -> list[str]:
    """Dotted names of the settings that differ and change the numbers (a run may be
    extended or stopped earlier, and checkpointed at another rhythm)."""
    return record_differences(run_record(existing), run_record(wanted))


class RunMember:
    """One model of a stack: its config, run directory, own ``ToyTransformer`` (used for
    checkpoints and metrics), Adam, data generator, and where it (re)starts. ``run_dir``
    is where its files are written; ``location`` is the run's own path, which its result
    and log records name (the same, except for a restart built aside until it replaces
    the old run: ``sinkscope.toy.train``)."""

    def __init__(self, config: RunConfig, run_dir: Path, device: torch.device, location: Path | None = None) -> None:
        self.config = config
        self.run_dir = run_dir
        self.location = run_dir if location is None else location
        self.model, self.optimizer, self.generator = build_member_state(config, device)
        self.device = device
        self.step = 0
        self.wall_before = 0.0
        self.resumed_from: int | None = None


def _own_config(run_dir: Path) -> RunConfig | None:
    """The config of the run in ``run_dir``: its ``config.json``, else (an interrupted run
    whose config.json was lost) the record its checkpoints keep; None for a new or empty
    directory. A directory that holds neither is refused."""
    if (run_dir / CONFIG_FILE).exists():
        return read_config(run_dir)
    if not holds_files(run_dir):
        return None
    if not checkpoint_dirs(run_dir):
        raise RunDirectoryError(
            f"{run_dir} exists and is not a toy run directory; choose an empty or new directory", field="run_dir"
        )
    recorded = recorded_config(run_dir)
    if recorded is None:
        raise RunDirectoryError(
            f"{run_dir} has no {CONFIG_FILE} and none of its checkpoints records the settings that trained it "
            "(they were written before sinkscope recorded them); restore its config.json, or overwrite the run "
            "to retrain it from step 0",
            field="overwrite",
        )
    return recorded


def _check_existing(config: RunConfig, run_dir: Path, resume: bool) -> RunConfig | None:
    """The run's own config when ``run_dir`` holds a run ``config`` may continue (None for
    a new or empty directory); refusals otherwise."""
    existing = _own_config(run_dir)
    if existing is None:
        return None
    differing = config_differences(existing, config)
    if differing:
        raise RunDirectoryError(
            f"{run_dir} already holds a run with a different config ({', '.join(differing)}; only "
            "train.max_steps may change on resume, besides the checkpoint settings); resume it with its own "
            "settings, train the new ones into another run directory, or overwrite the run with them",
            field="run_dir",
        )
    if not resume:
        raise RunDirectoryError(
            f"{run_dir} already holds a run; pass resume=True to continue it, overwrite=True to retrain it from "
            "step 0, or choose another directory",
            field="resume",
        )
    return existing


def _refuse_a_restart_over_an_attempt(run_dir: Path) -> None:
    """A run with nothing to continue from (no checkpoint) restarts from step 0 only when
    nothing was trained there yet: a result, final weights or logged steps of an earlier
    attempt would otherwise sit beside the new attempt's files, read as one run. A run that
    diverged at step 0 trained nothing (no checkpoint, no weights): it is retrained as before."""
    traces = [name for name in (RESULT_FILE, FINAL_WEIGHTS) if (run_dir / name).exists()]
    if traces == [RESULT_FILE] and _diverged_at_step_0(run_dir):
        traces = []
    if (run_dir / METRICS_FILE).is_file() and (run_dir / METRICS_FILE).stat().st_size:
        traces.append(f"the steps logged in {METRICS_FILE}")
    if traces:
        raise RunDirectoryError(
            f"{run_dir} has no checkpoint to continue from ({CHECKPOINTS}/ is missing or empty) but holds "
            f"{', '.join(traces)} of an earlier attempt; nothing was changed; restore its checkpoints, or "
            "overwrite the run to retrain it from step 0",
            field="overwrite",
        )


def _diverged_at_step_0(run_dir: Path) -> bool:
    try:
        result = read_train_result(run_dir)
    except InputError:  # a tampered result says nothing: it is kept, and the resume refused
        return False
    return result.status == "diverged" and result.steps == 0


def _stored_result(run_dir: Path, config: RunConfig) -> TrainResult | None:
    """The stored result of a run that is finished for ``config`` (None when it must train)."""
    if not ((run_dir / RESULT_FILE).exists() and (run_dir / FINAL_WEIGHTS).exists()):
        return None
    result = read_train_result(run_dir)
    if result.status == "converged" or (result.status == "max_steps" and result.steps >= config.train.max_steps):
        return result
    return None


def _check_finished_record(run_dir: Path, config: RunConfig) -> None:
    """A finished run answers only for the settings its newest readable checkpoint recorded."""
    for candidate in reversed(checkpoint_dirs(run_dir)):
        try:
            state = read_checkpoint(candidate).state
        except UnusableCheckpoint:
            continue
        check_trained_as_asked(run_dir, state, config, None)
        return


def open_run(
    config: RunConfig, run_dir: Path, resume: bool, device: torch.device, location: Path | None = None
) -> TrainResult | RunMember:
    """The run directory's one owner: validate it against ``config`` and return either
    the stored result of a finished run or a member ready to train (fresh, or restored
    from its newest usable checkpoint). ``location``: the run's own path when ``run_dir``
    is a restart's build directory (``RunMember``).

    Everything is decided before anything is changed: a refusal leaves the directory as
    it was. A finished run whose ``max_steps`` was raised keeps its result and final
    weights until the continued run writes its own (``sinkscope.toy.seed_stack``). A
    ``config.json`` that was lost is written back from the checkpoints' record."""
    existing = _check_existing(config, run_dir, resume)
    config_lost = existing is not None and not (run_dir / CONFIG_FILE).exists()
    stored = _stored_result(run_dir, config)
    if stored is not None:
        _check_finished_record(run_dir, config)
        if config_lost and existing is not None:
            check_writable(run_dir)
            write_config(run_dir, existing)  # the settings that finished it, as its checkpoints recorded them
        return stored  # nothing to write: a read-only finished run still answers
    if existing is not None:
        check_writable(run_dir)
    member = RunMember(config, run_dir, device, location)
    if existing is not None and checkpoint_dirs(run_dir):
        point = newest_usable_checkpoint(run_dir, lambda checkpoint: load_checkpoint_into(member, checkpoint))
        restore_checkpoint(member, point)  # every check passed: only now is anything changed
        if existing != config or config_lost:
            write_config(run_dir, config)  # record the new max_steps or checkpoint settings
        return member
    if existing is not None:
        _refuse_a_restart_over_an_attempt(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_config(run_dir, config)
    (run_dir / METRICS_FILE).unlink(missing_ok=True)
    return member


def write_step_checkpoint(member: RunMember, step: int, data_state: torch.Tensor, wall: float) -> None:
    """Save the state at the start of ``step``: weights and Adam state before its update,
    and the data generator before its batch is drawn (``data_state``)."""
    tensors, groups = optimizer_to_tensors(member.optimizer)
    tensors["rng.data_generator"] = data_state
    write_checkpoint(
        member.run_dir,
        step,
        member.model,
        tensors,
        {
            "wall_seconds": wall,
            "param_groups": groups,
            "device": member.device.type,
            RUN_RECORD: run_record(member.config),
        },
        member.config.train.keep_checkpoints,
    )


def log_step(member: RunMember, step: int, loss: float, linf: float, batch: TaskBatch) -> dict:
    """Append this step's metrics line to ``member``'s metrics.jsonl; returns the line."""
    names = {pattern_hook(layer) for layer in range(member.config.model.n_layers)}
    with torch.no_grad():
        _, cache = member.model.run_with_cache(batch.tokens, names_filter=lambda name: name in names)
    patterns = dict(cache.items())
    default, trigger = head_anchor_masses(member.model, batch, patterns)
    return append_metrics(
        member.run_dir,
        {
            "step": step,
            "loss": loss,
            "linf_error": linf,
            "anchor_mass_default": default,
            "anchor_mass_trigger": trigger,
            # when the sink forms: heads with a sink, and Gu et al.'s sink rate, on this batch
            "n_sink_heads": sum(mass >= 1.0 - SINK_EPS for layer in default for mass in layer),
            "sink_rate": sink_rates(member.model, patterns),
        },
    )


def sink_rates(model: ToyTransformer, patterns: dict[str, torch.Tensor]) -> dict[str, float]:
    """Gu et al.'s Sink_1(ε) in percent of (sequence, layer, head) entries, keyed by ε
    (``"0.3"``): alpha_0 is the mean attention of every query on BOS."""
    alphas = torch.stack(
        [alpha_k(patterns[pattern_hook(layer)], 0) for layer in range(model.cfg.n_layers)]
    )  # [layer, batch, head]
    return {str(eps): round(float((alphas > eps).double().mean()) * 100.0, 4) for eps in SINK_RATE_EPSILONS}
