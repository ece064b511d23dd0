"""Errors that tell the truth: out of memory while a model boots is reported as out of
memory (never as an unsupported architecture), and ``--debug`` / ``SINKSCOPE_DEBUG=1``
show an error's full chained traceback where the command line otherwise prints one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sinkscope.cli import main
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_gpt2(tmp_path_factory.mktemp("errors") / "tiny-gpt2")


@pytest.fixture
def broken_run(tmp_path) -> Path:
    """A toy run directory whose config.json is not JSON: an InputError chained to the
    JSONDecodeError that explains it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{", encoding="utf-8")
    return run


def _boot_out_of_memory(monkeypatch) -> None:
    from transformer_lens.model_bridge import TransformerBridge

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(TransformerBridge, "boot_transformers", out_of_memory)


def test_out_of_memory_while_booting_is_not_an_unsupported_architecture(model_dir, tmp_path, capsys, monkeypatch):
    _boot_out_of_memory(monkeypatch)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(TINY_GPT2_PROMPTS) + "\n", encoding="utf-8")
    argv = ["audit", str(model_dir), "--prompts", str(prompts), "--max-len", "16", "--examples", "0"]
    assert main([*argv, "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "out of memory" in err and "--device cpu" in err and "--max-len" in err, err
    assert "architecture" not in err, err
    assert not (tmp_path / "out").exists()


def test_without_debug_an_input_error_is_one_line(broken_run, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SINKSCOPE_DEBUG", raising=False)
    assert main(["toy", "probe", str(broken_run), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("sinkscope: error: ") and "is not valid JSON" in err, err


@pytest.mark.parametrize(
    ("argv_before", "argv_after", "environment"),
    [(["--debug"], [], None), ([], ["--debug"], None), ([], [], "1")],
    ids=["global-flag", "flag-after-the-command", "environment"],
)
def test_debug_shows_the_chained_cause(broken_run, tmp_path, capsys, monkeypatch, argv_before, argv_after, environment):
    if environment is None:
        monkeypatch.delenv("SINKSCOPE_DEBUG", raising=False)
    else:
        monkeypatch.setenv("SINKSCOPE_DEBUG", environment)
    argv = [*argv_before, "toy", "probe", str(broken_run), "--out", str(tmp_path / "p"), *argv_after]
    assert main(argv) == 2  # the same exit code as without it
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "json.decoder.JSONDecodeError" in err
    assert "The above exception was the direct cause of the following exception" in err
    assert err.rstrip().splitlines()[-1].startswith("sinkscope.infra.errors.InputError: ")


@pytest.mark.parametrize(
    "raised",
    [
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        RuntimeError("[enforce fail at alloc_cpu.cpp:117] not enough memory: you tried to allocate 4294967296 bytes"),
    ],
    ids=["cublas", "cpu-allocator"],
)
def test_every_allocators_wording_of_out_of_memory_is_out_of_memory(model_dir, tmp_path, capsys, monkeypatch, raised):
    from transformer_lens.model_bridge import TransformerBridge

    def fail(*args, **kwargs):
        raise raised

    monkeypatch.setattr(TransformerBridge, "boot_transformers", fail)
    argv = ["audit", str(model_dir), "--max-len", "16", "--examples", "0", "--out", str(tmp_path / "out")]
    assert main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "out of memory" in err and "architecture" not in err, err


def test_a_bug_while_booting_is_a_traceback_not_an_unsupported_architecture(model_dir, tmp_path, monkeypatch):
    from transformer_lens.model_bridge import TransformerBridge

    def bug(*args, **kwargs):
        raise KeyError("blocks.0.attn")  # a lookup gone wrong inside the loader: not the user's input

    monkeypatch.setattr(TransformerBridge, "boot_transformers", bug)
    argv = ["audit", str(model_dir), "--max-len", "16", "--examples", "0", "--out", str(tmp_path / "out")]
    with pytest.raises(KeyError, match="blocks.0.attn"):
        main([*argv, "--no-progress"])
