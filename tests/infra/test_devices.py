"""The one device resolver: its vocabulary, ``auto``, and one-line refusals (device
availability is monkeypatched, so these run the same with or without a GPU)."""

from __future__ import annotations

import pytest
import torch

import sinkscope.infra.devices as devices
from sinkscope.infra.devices import auto_device, check_device_name, resolve_device
from sinkscope.infra.errors import InputError


def _machine(monkeypatch, cuda: int = 0, mps: bool = False) -> None:
    """Pretend this machine has ``cuda`` CUDA devices and an MPS device or not."""
    monkeypatch.setattr(devices, "_cuda_available", lambda: cuda > 0)
    monkeypatch.setattr(devices, "_cuda_device_count", lambda: cuda)
    monkeypatch.setattr(devices, "_mps_available", lambda: mps)


@pytest.mark.parametrize(
    ("cuda", "mps", "expected"), [(0, False, "cpu"), (0, True, "mps"), (1, False, "cuda"), (2, True, "cuda")]
)
def test_auto_prefers_cuda_then_mps_then_cpu(monkeypatch, cuda, mps, expected):
    _machine(monkeypatch, cuda=cuda, mps=mps)
    assert auto_device() == expected
    assert resolve_device("auto") == torch.device(expected)


def test_every_name_of_the_vocabulary_resolves_where_the_machine_has_it(monkeypatch):
    _machine(monkeypatch, cuda=2, mps=True)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("cuda") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("mps") == torch.device("mps")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


def test_cpu_needs_no_accelerator(monkeypatch):
    _machine(monkeypatch)
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name", ["banana", "meta", "tpu", "CUDA", "cuda:", "cuda:x", "cpu:0", ""])
def test_an_unknown_name_is_one_line_naming_the_choices(monkeypatch, name):
    _machine(monkeypatch, cuda=1, mps=True)
    with pytest.raises(InputError, match="pass cpu, cuda, cuda:N, mps or auto") as caught:
        resolve_device(name)
    assert caught.value.field == "device" and "\n" not in str(caught.value)
    with pytest.raises(InputError, match="unknown device"):
        check_device_name(name)


@pytest.mark.parametrize("name", ["cpu", "cuda", "cuda:0", "cuda:12", "mps", "auto"])
def test_the_spelling_check_accepts_the_vocabulary(name):
    assert check_device_name(name) == name


@pytest.mark.parametrize(
    ("name", "what"), [("cuda", "no CUDA device"), ("cuda:0", "no CUDA device"), ("mps", "no MPS")]
)
def test_an_unavailable_device_is_one_line_naming_the_fix(monkeypatch, name, what):
    _machine(monkeypatch)
    with pytest.raises(InputError, match=what) as caught:
        resolve_device(name)
    assert str(caught.value).endswith("use device cpu or auto") and caught.value.field == "device"


def test_a_cuda_index_beyond_the_machine_names_the_ones_it_has(monkeypatch):
    _machine(monkeypatch, cuda=2)
    with pytest.raises(InputError, match=r"has 2 CUDA device\(s\); pass cuda:0 to cuda:1, cuda or auto"):
        resolve_device("cuda:2")
