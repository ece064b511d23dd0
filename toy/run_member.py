"""One toy model's run directory while it trains: open or resume it (its one owner),
build the model, Adam and data generator of the paper's recipe, restore the newest intact
checkpoint, and write each step's checkpoint and metrics line.

``sinkscope.toy.train`` trains stacks of these members; ``sinkscope.toy.run_dir`` defines the
directory's files.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import SafetensorError

from sinkscope.infra.atomic_io import atomic_write_text, holds_files, read_json
from sinkscope.infra.codec import encode
from sinkscope.infra.errors import InputError
from sinkscope.interp.hook_names import pattern_hook
from sinkscope.probes.sink_metrics import anchor_mass
from sinkscope.toy.checkpoint import (
    load_tensors,
    optimizer_from_tensors,
    optimizer_to_tensors,
)
from sinkscope.toy.model import ToyTransformer
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
)
from sinkscope.toy.task import TaskBatch

DATA_SEED_OFFSET = 1_000_003  # data and init draw from different streams of one seed


class RunDirectoryError(InputError):
    """The run directory cannot be used as asked (exists with another config, etc.)."""


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


def restore_checkpoint(
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
    atomic_write_text(run_dir / METRICS_FILE, "".join(json_line(r) for r in kept))
    return state["step"], state["wall_seconds"]


def config_differences(existing: RunConfig, wanted: RunConfig) -> list[str]:
    """Dotted names of the settings that differ, ignoring ``train.max_steps`` (a run may be
    extended or stopped earlier; everything else changes the numbers)."""
    old, new = encode(existing), encode(wanted)
    return [
        f"{section}.{key}"
        for section in ("model", "task", "train")
        for key in sorted(set(old[section]) | set(new[section]))
        if (section, key) != ("train", "max_steps") and old[section].get(key) != new[section].get(key)
    ]


def json_line(record: dict) -> str:
    return json.dumps(record) + "\n"


class RunMember:
    """One model of a stack: its config, run directory, own ``ToyTransformer`` (used for
    checkpoints and metrics), Adam, data generator, and where it (re)starts."""

    def __init__(self, config: RunConfig, run_dir: Path, device: torch.device) -> None:
        self.config = config
        self.run_dir = run_dir
        self.model, self.optimizer, self.generator = build_member_state(config, device)
        self.device = device
        self.step = 0
        self.wall_before = 0.0
        self.resumed_from: int | None = None


def open_run(config: RunConfig, run_dir: Path, resume: bool, device: torch.device) -> TrainResult | RunMember:
    """The run directory's one owner: validate it against ``config`` and return either
    the stored result of a finished run or a member ready to train (fresh, or restored
    from its newest intact checkpoint)."""
    existing: RunConfig | None = None
    if (run_dir / "config.json").exists():
        existing = read_config(run_dir)
        differing = config_differences(existing, config)
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
    member = RunMember(config, run_dir, device)
    if checkpoint_dirs(run_dir):
        lr = config.train.learning_rate(config.model)
        member.step, member.wall_before = restore_checkpoint(
            run_dir, member.model, member.optimizer, member.generator, lr
        )
        member.resumed_from = member.step
        if existing is not None and existing != config:
            write_config(run_dir, config)  # record the new max_steps
    else:
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
        {"wall_seconds": wall, "param_groups": groups, "device": member.device.type},
        member.config.train.keep_checkpoints,
    )


def log_step(member: RunMember, step: int, loss: float, linf: float, batch: TaskBatch) -> dict:
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
