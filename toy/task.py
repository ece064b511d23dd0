"""The continuous-token trigger-conditional task of Ran-Milo (2026), as docs/toy-task.md restates it.

Each token is a vector in R^n (n = d_model). Coordinates, 0-indexed:
- 0: BOS flag (1 on the BOS token at position 0 only)
- 1: trigger flag (1 on the single trigger token only)
- 2 .. n-2: features, iid Uniform(-1, 1) on content and trigger tokens
- n-1: bias (1 on content tokens, 0 on BOS and trigger)

Targets:
- ``single`` (one layer, no residual): y_i = 0 for i != j, y_j = mean(x_1 .. x_j);
- ``residual`` (multi-layer residual stream): y_i = x_i for i != j,
  y_j = x_j + mean(x_1 .. x_j).
The mean is over the full token vectors of the non-BOS tokens up to and including the
trigger (flags and bias coordinates included), as the paper's target is a vector in R^n.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from sinkscope.infra.bounds import COUNT, POSITIVE, Bound, check_bounds
from sinkscope.infra.errors import InputError
from sinkscope.infra.field_types import check_field_types

BOS_FLAG = 0
TRIGGER_FLAG = 1
FIRST_FEATURE = 2
TargetKind = Literal["single", "residual"]


@dataclass(frozen=True)
class TaskConfig:
    """Layout of the trigger task.

    ``train_trigger_min/max`` bound the 0-indexed trigger position drawn uniformly for
    training (paper: 2 .. L-1); ``eval_trigger_position`` is the fixed 0-indexed
    position used for evaluation (paper: 7, i.e. 1-indexed 8).
    """

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "d_model": POSITIVE,
        "seq_len": POSITIVE,
        "train_trigger_min": COUNT,
        "train_trigger_max": COUNT,
        "eval_trigger_position": COUNT,
    }

    d_model: int = 16
    seq_len: int = 16
    train_trigger_min: int = 2
    train_trigger_max: int | None = None  # None: seq_len - 1
    eval_trigger_position: int = 7

    def __post_init__(self) -> None:
        check_field_types(self)  # a wrong type is named here, not a TypeError further on
        check_bounds(self)  # a width or length a file of this config could not hold
        if self.d_model < 4:
            raise InputError(
                f"d_model={self.d_model} cannot hold the task layout (BOS flag, trigger flag, "
                "at least one feature, bias): use d_model >= 4",
                field="d_model",
            )
        if self.seq_len < 3:
            raise InputError(
                f"seq_len={self.seq_len} is too short: the task needs BOS, at least one content "
                "token and a trigger; use seq_len >= 3",
                field="seq_len",
            )
        last = self.seq_len - 1
        if not 1 <= self.train_trigger_min <= self.trigger_max <= last:
            raise InputError(
                f"training trigger range {self.train_trigger_min}..{self.trigger_max} must lie in "
                f"1..{last} (0-indexed; position 0 is BOS); set train_trigger_min/max accordingly"
            )
        if not 1 <= self.eval_trigger_position <= last:
            raise InputError(
                f"eval_trigger_position={self.eval_trigger_position} must lie in 1..{last} "
                "(0-indexed, after BOS); lower it or raise seq_len",
                field="eval_trigger_position",
            )

    @property
    def trigger_max(self) -> int:
        return self.seq_len - 1 if self.train_trigger_max is None else self.train_trigger_max

    @property
    def bias_coord(self) -> int:
        return self.d_model - 1


@dataclass
class TaskBatch:
    """One batch of the task.

    tokens: ``[batch, pos, d_model]``; targets: ``[batch, pos, d_model]``;
    trigger_position: ``[batch]`` (0-indexed).
    """

    tokens: torch.Tensor
    targets: torch.Tensor
    trigger_position: torch.Tensor

    def trigger_query_mask(self) -> torch.Tensor:
        """``[batch, pos]`` bool, True at each row's trigger position."""
        positions = torch.arange(self.tokens.shape[1], device=self.tokens.device)
        return positions.unsqueeze(0) == self.trigger_position.unsqueeze(1)

    def default_query_mask(self) -> torch.Tensor:
        """``[batch, pos]`` bool, True at non-trigger positions after BOS (the default state)."""
        mask = ~self.trigger_query_mask()
        mask[:, 0] = False
        return mask


def make_tokens(config: TaskConfig, trigger_position: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Token vectors ``[batch, pos, d_model]`` with one trigger per row at ``trigger_position [batch]``."""
    batch, device = trigger_position.shape[0], trigger_position.device
    L, n = config.seq_len, config.d_model
    tokens = torch.zeros(batch, L, n, device=device)
    tokens[:, 1:, FIRST_FEATURE : config.bias_coord] = (
        torch.rand(batch, L - 1, config.bias_coord - FIRST_FEATURE, generator=generator, device=device) * 2 - 1
    )
    tokens[:, 0, BOS_FLAG] = 1.0
    tokens[:, 1:, config.bias_coord] = 1.0
    rows = torch.arange(batch, device=device)
    tokens[rows, trigger_position, TRIGGER_FLAG] = 1.0
    tokens[rows, trigger_position, config.bias_coord] = 0.0
    return tokens


def make_targets(tokens: torch.Tensor, trigger_position: torch.Tensor, target: TargetKind) -> torch.Tensor:
    """Targets ``[batch, pos, d_model]`` for tokens ``[batch, pos, d_model]``."""
    batch, L, _ = tokens.shape
    positions = torch.arange(L, device=tokens.device)
    # mean over non-BOS tokens 1..j (inclusive) of each row
    in_prefix = (positions.unsqueeze(0) >= 1) & (positions.unsqueeze(0) <= trigger_position.unsqueeze(1))
    prefix_mean = (tokens * in_prefix.unsqueeze(-1)).sum(dim=1) / trigger_position.unsqueeze(1).to(tokens.dtype)
    rows = torch.arange(batch, device=tokens.device)
    if target == "single":
        targets = torch.zeros_like(tokens)
        targets[rows, trigger_position] = prefix_mean
    elif target == "residual":
        targets = tokens.clone()
        targets[rows, trigger_position] += prefix_mean
    else:
        raise InputError(f"unknown target {target!r}; choose 'single' or 'residual'")
    return targets


def sample_batch(
    config: TaskConfig,
    batch_size: int,
    generator: torch.Generator,
    target: TargetKind,
    trigger_position: int | None = None,
) -> TaskBatch:
    """Draw a batch on the generator's device. ``trigger_position=None`` draws the training
    distribution (uniform over ``train_trigger_min..trigger_max``); an int fixes it for
    every row."""
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}", field="batch_size")
    if trigger_position is None:
        triggers = torch.randint(
            config.train_trigger_min,
            config.trigger_max + 1,
            (batch_size,),
            generator=generator,
            device=generator.device,
        )
    else:
        if not 1 <= trigger_position < config.seq_len:
            raise InputError(f"trigger_position={trigger_position} must lie in 1..{config.seq_len - 1} (0-indexed)")
        triggers = torch.full((batch_size,), trigger_position, dtype=torch.long, device=generator.device)
    tokens = make_tokens(config, triggers, generator)
    return TaskBatch(tokens=tokens, targets=make_targets(tokens, triggers, target), trigger_position=triggers)


def eval_batch(config: TaskConfig, batch_size: int, seed: int, target: TargetKind) -> TaskBatch:
    """A reproducible evaluation batch with the trigger at ``eval_trigger_position``."""
    generator = torch.Generator().manual_seed(seed)
    return sample_batch(config, batch_size, generator, target, trigger_position=config.eval_trigger_position)


TOY_INPUT_TYPES: tuple[str, ...] = ("task", "random", "repeated")


def toy_input_tokens(config: TaskConfig, kind: str, n: int, seed: int = 0) -> torch.Tensor:
    """Toy inputs ``[n, seq_len, d_model]`` for the input-type experiment, BOS first in each:
    ``task``, the evaluation distribution (trigger at ``eval_trigger_position``); ``random``,
    content tokens with uniform features and no trigger; ``repeated``, one such content
    token (drawn per row) at every position after BOS. The toy counterpart of the audit's
    prompts / uniform random tokens / one token repeated."""
    if kind not in TOY_INPUT_TYPES:
        raise InputError(f"unknown toy input type {kind!r}; choose from {', '.join(TOY_INPUT_TYPES)}", field="kind")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"n must be a whole number >= 1, got {n!r}", field="n")
    generator = torch.Generator().manual_seed(seed)
    if kind == "task":
        return make_tokens(config, torch.full((n,), config.eval_trigger_position, dtype=torch.long), generator)
    tokens = torch.zeros(n, config.seq_len, config.d_model)
    tokens[:, 0, BOS_FLAG] = 1.0
    width = config.bias_coord - FIRST_FEATURE
    features = torch.rand(n, config.seq_len - 1 if kind == "random" else 1, width, generator=generator) * 2 - 1
    tokens[:, 1:, FIRST_FEATURE : config.bias_coord] = features.expand(n, config.seq_len - 1, width)
    tokens[:, 1:, config.bias_coord] = 1.0
    return tokens
