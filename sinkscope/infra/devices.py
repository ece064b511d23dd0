"""The one place a device name becomes a device: ``cpu | cuda | cuda:N | mps | auto``.

``auto`` is cuda when this machine has it, else mps when it has it, else cpu. Every
command and every library entry point that takes a device (toy training, pretrained
loading) resolves it here, so they share one vocabulary and one set of messages.

``check_device_name`` checks the spelling only and does not import torch, so the
command line can refuse a misspelled device while it parses its arguments;
``resolve_device`` also checks that this machine has the device.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from sinkscope.infra.errors import InputError

if TYPE_CHECKING:  # torch loads only when a device is resolved
    import torch

DEVICE_NAMES = "cpu, cuda, cuda:N, mps or auto"
DEVICE_PATTERN = r"cpu|auto|mps|cuda(:\d+)?"


def check_device_name(name: str) -> str:
    """``name`` when it is in the vocabulary, else one ``InputError`` naming the choices
    (checked without importing torch)."""
    if not re.fullmatch(DEVICE_PATTERN, name):
        raise InputError(f"unknown device {name!r}; pass {DEVICE_NAMES}", field="device")
    return name


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count()


def _mps_available() -> bool:
    import torch

    return torch.backends.mps.is_available()


def auto_device() -> str:
    """What ``auto`` means on this machine: cuda, else mps, else cpu."""
    if _cuda_available():
        return "cuda"
    return "mps" if _mps_available() else "cpu"


def resolve_device(device: str | torch.device) -> torch.device:
    """``device`` as a device this machine has; an unknown name or a device this machine
    lacks is one ``InputError`` (field ``device``) naming the fix."""
    import torch

    name = str(device)
    if name == "auto":
        return torch.device(auto_device())
    check_device_name(name)
    resolved = torch.device(name)
    if resolved.type == "cuda":
        if not _cuda_available():
            raise InputError(f"this machine has no CUDA device for {name!r}; use device cpu or auto", field="device")
        if resolved.index is not None and resolved.index >= _cuda_device_count():
            raise InputError(
                f"{name!r}: this machine has {_cuda_device_count()} CUDA device(s); pass cuda:0 to "
                f"cuda:{_cuda_device_count() - 1}, cuda or auto",
                field="device",
            )
    if resolved.type == "mps" and not _mps_available():
        raise InputError(f"this machine has no MPS device for {name!r}; use device cpu or auto", field="device")
    return resolved


# how allocators word it: PyTorch's CUDA and CPU allocators, cuBLAS, ROCm, Windows' CPU allocator
OUT_OF_MEMORY_SIGNS = (
    "out of memory",
    "can't allocate memory",
    "cublas_status_alloc_failed",
    "not enough memory",
    "failed to allocate",
)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says a device (or the host) ran out of memory: ``MemoryError``,
    ``torch.OutOfMemoryError``, or a ``RuntimeError`` whose message says so (PyTorch's CPU
    allocator and older CUDA builds raise plain ``RuntimeError``)."""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(sign in text for sign in OUT_OF_MEMORY_SIGNS)
