"""Checkpoint I/O: safetensors for tensors, JSON for everything else; no pickle, so
loading a checkpoint never executes code from a file."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from sinkscope.infra.atomic_io import atomic_path
from sinkscope.infra.errors import InputError


def save_tensors(path: str | os.PathLike, tensors: dict[str, torch.Tensor]) -> None:
    """Write ``tensors`` to a safetensors file atomically (contiguous CPU copies)."""
    payload = {name: tensor.detach().to("cpu").contiguous() for name, tensor in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(payload, str(tmp))


def load_tensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"checkpoint file {path} does not exist")
    try:
        return load_file(str(path))
    except SafetensorError as error:  # cut short or overwritten: the file, not the code, is wrong
        raise InputError(f"{path} is not a readable safetensors file ({error}); restore it or regenerate it") from error


def optimizer_to_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """Split an optimizer's state into flat tensors (``state.{param}.{key}``) and JSON-able
    param groups."""
    state_dict = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    for param_id, param_state in state_dict["state"].items():
        for key, value in param_state.items():
            tensors[f"state.{param_id}.{key}"] = value if torch.is_tensor(value) else torch.tensor(value)
    groups = []
    for group in state_dict["param_groups"]:
        groups.append({k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items()})
    return tensors, groups


def optimizer_from_tensors(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], groups: list[dict]
) -> None:
    """Inverse of ``optimizer_to_tensors``: load into an optimizer built on the same params."""
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        if not name.startswith("state."):
            continue
        _, param_id, key = name.split(".", 2)
        state.setdefault(int(param_id), {})[key] = value
    restored_groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in groups]
    optimizer.load_state_dict({"state": state, "param_groups": restored_groups})
