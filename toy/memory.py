"""Will a toy model fit? Estimated from its config before anything is allocated, so a
model too large for the machine is one line naming the settings to lower instead of
minutes of allocation (``--layers 100000 --heads 100000`` asks for terabytes).

The estimate is deliberately generous (float32 weights, gradients and Adam's two moments,
plus the activations of one batch kept for the backward pass, twice over) and only
refuses what cannot fit: every toy model of the paper needs well under a megabyte.
"""

from __future__ import annotations

import os

import torch

from sinkscope.infra.errors import InputError
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.run_dir import TrainConfig

FLOAT_BYTES = 4
COPIES_PER_PARAMETER = 4  # weight, gradient, Adam's first and second moment
ACTIVATION_MARGIN = 2  # the forward pass's activations and their gradients
_DEFAULT, _DEFAULT_TRAIN = ToyModelConfig(), TrainConfig()  # "large" is measured against the defaults


def parameter_count(model: ToyModelConfig) -> int:
    """Trainable parameters of a ``ToyTransformer`` of this config."""
    attention = 4 * model.n_heads * model.d_model * model.head_width  # W_Q, W_K, W_V, W_O
    mlp = 2 * model.d_model * model.mlp_width if model.mlp else 0
    norms = 2 * model.d_model if model.layer_norm else 0
    positions = model.seq_len * model.d_model if model.positional_embedding else 0
    return model.n_layers * (attention + mlp + norms) + positions


def activation_count(model: ToyModelConfig, batch_size: int) -> int:
    """Floats one training batch keeps for the backward pass (scores, patterns, q/k/v/z,
    the residual stream and the MLP's hidden layer, per layer)."""
    seq = model.seq_len
    per_layer = (
        2 * model.n_heads * seq * seq
        + 4 * model.n_heads * seq * model.head_width
        + 4 * seq * model.d_model
        + (2 * seq * model.mlp_width if model.mlp else 0)
    )
    return batch_size * model.n_layers * per_layer


def training_bytes(model: ToyModelConfig, batch_size: int, models: int = 1) -> int:
    """Estimated peak memory of training ``models`` such models together."""
    floats = COPIES_PER_PARAMETER * parameter_count(model) + ACTIVATION_MARGIN * activation_count(model, batch_size)
    return models * floats * FLOAT_BYTES


def available_bytes(device: torch.device) -> int:
    """Memory free for a new allocation on ``device`` (for the CPU and MPS: the machine's
    available RAM)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # psutil is optional: the kernel's count of free pages
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_fits(model: ToyModelConfig, batch_size: int, models: int, device: torch.device) -> None:
    """Refuse, before allocating, a training that cannot fit in ``device``'s free memory."""
    needed = training_bytes(model, batch_size, models)
    free = available_bytes(device)
    if needed > free:
        culprit, others = settings_to_lower(model, batch_size)
        raise InputError(
            f"training {models} model(s) of {model.n_layers} layer(s) x {model.n_heads} head(s), d_model "
            f"{model.d_model}, seq_len {model.seq_len} ({parameter_count(model):,} parameters each) needs about "
            f"{_size(needed)} but {device.type} has {_size(free)} free; lower {culprit}"
            + (f" (and {', '.join(others)})" if others else ""),
            field=culprit,
        )


def settings_to_lower(model: ToyModelConfig, batch_size: int) -> tuple[str, list[str]]:
    """The setting most to blame for the estimate, and the others above their defaults.

    The larger term decides which settings count: the activations of one batch grow with
    ``seq_len`` squared, ``batch_size``, layers and heads; the parameters (weights and
    Adam's moments) with layers, heads and ``d_model`` (and ``seq_len`` with positional
    embeddings). Among those, the one furthest above its default is named first."""
    if ACTIVATION_MARGIN * activation_count(model, batch_size) >= COPIES_PER_PARAMETER * parameter_count(model):
        growth = {
            "seq_len": (model.seq_len / _DEFAULT.seq_len) ** 2,
            "batch_size": batch_size / _DEFAULT_TRAIN.batch_size,
            "n_layers": model.n_layers / _DEFAULT.n_layers,
            "n_heads": model.n_heads / _DEFAULT.n_heads,
        }
    else:
        growth = {
            "n_layers": model.n_layers / _DEFAULT.n_layers,
            "n_heads": model.n_heads / _DEFAULT.n_heads,
            "d_model": (model.d_model / _DEFAULT.d_model) ** 2,
        }
        if model.positional_embedding:
            growth["seq_len"] = model.seq_len / _DEFAULT.seq_len
    ranked = sorted(growth, key=lambda name: -growth[name])
    return ranked[0], [name for name in ranked[1:] if growth[name] > 1]


def _size(count: int) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count / 1e3:.1f} kB"
