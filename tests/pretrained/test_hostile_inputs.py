"""Hostile inputs to pretrained audits (issue 22): special-token text in prompts,
tokenizers that do not fit their model, model directories and GGUF files that are not
what they claim, prompt files that are not regular files, hold only a header, or are
huge and binary, and a HOME the datasets cache cannot live in. Every refusal is one line
with exit 2 that names the real cause, and leaves every directory as it was."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from test_gguf import GGUF_NAME, needs_smollm2, smollm2_dir

from fault_checks import audit_argv, one_line_exit_2, snapshot
from sinkscope.cli import main
from sinkscope.infra.errors import InputError
from sinkscope.pretrained_analysis.loading import LoadSpec, load_model, resolve_model, wrap_model
from sinkscope.pretrained_analysis.prompts import PromptSpec, load_prompt_set, prompt_set, tokenize_prompts
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2, train_byte_level_tokenizer

SPECIAL = "<|endoftext|>"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_gpt2(tmp_path_factory.mktemp("hostile") / "tiny-gpt2")


@pytest.fixture(scope="module")
def tiny(model_dir):
    return load_model(LoadSpec(str(model_dir)), progress=False)


@pytest.fixture
def prompts(tmp_path) -> Path:
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(TINY_GPT2_PROMPTS) + "\n", encoding="utf-8")
    return path


def refused(capsys, tmp_path: Path, argv: list[str], fix: str) -> None:
    """``argv`` exits 2 with one line naming ``fix``, and changes nothing under ``tmp_path``."""
    before = snapshot(tmp_path)
    one_line_exit_2(capsys, argv, fix)
    assert snapshot(tmp_path) == before


def row_ids(tokenized, index: int = 0) -> list[int]:
    return tokenized.tokens[index][tokenized.attention_mask[index]].tolist()


def test_special_token_text_in_a_prompt_is_text_unless_asked(tiny):
    bos = tiny.bridge.tokenizer.bos_token_id
    text = f"{SPECIAL}{SPECIAL} The quick {SPECIAL} fox"
    as_text = tokenize_prompts(prompt_set([text]), tiny)
    assert row_ids(as_text)[0] == bos and bos not in row_ids(as_text)[1:]  # only the prepended anchor
    assert any("tokenized as text" in note for note in as_text.notes)
    parsed = tokenize_prompts(prompt_set([text], parse_special_tokens=True), tiny)
    # the text spells its own BOS first: no second one is prepended (three in all, as the text holds)
    assert row_ids(parsed).count(bos) == 3 and any("parsed as special tokens" in note for note in parsed.notes)


@pytest.mark.parametrize("prepend_bos", [True, False])
def test_prompts_without_special_text_tokenize_as_transformer_lens_does(tiny, prepend_bos):
    """A regression guard (it passed before the fix too): ordinary prompts keep their tokens."""
    tokenized = tokenize_prompts(prompt_set(TINY_GPT2_PROMPTS, prepend_bos=prepend_bos), tiny)
    for index, text in enumerate(TINY_GPT2_PROMPTS):
        expected = tiny.bridge.to_tokens(text, prepend_bos=prepend_bos, truncate=False, move_to_device=False)
        assert row_ids(tokenized, index) == expected[0].tolist()
    assert tokenized.notes == ()


def test_cli_special_token_text_and_parse_special_tokens(model_dir, tmp_path):
    path = tmp_path / "special.txt"
    path.write_text(f"{SPECIAL * 3}\nThe quick {SPECIAL} fox\n", encoding="utf-8")
    assert main(audit_argv(model_dir, path, tmp_path / "text")) == 0
    assert main(audit_argv(model_dir, path, tmp_path / "parsed", "--parse-special-tokens")) == 0
    as_text = json.loads((tmp_path / "text" / "audit.json").read_text())
    parsed = json.loads((tmp_path / "parsed" / "audit.json").read_text())
    assert as_text["prompts"]["n_tokens"] > parsed["prompts"]["n_tokens"]
    assert (as_text["prompts"]["spec"]["parse_special_tokens"], parsed["prompts"]["spec"]["parse_special_tokens"]) == (
        False,
        True,
    )
    assert any("2 of 2 prompts hold special-token text" in note for note in as_text["notes"])
    assert any("parsed as special tokens" in note for note in parsed["notes"])


def _hf_model(model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()


def _saved(tokenizer, directory: Path):
    """``tokenizer`` saved to and loaded from ``directory`` (the bridge reloads a tokenizer from its path)."""
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(directory)
    return AutoTokenizer.from_pretrained(directory)


def _larger_tokenizer(model_dir: Path, directory: Path):
    """The model's tokenizer with 50 tokens more (ids 300..349; the model has 300 rows)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.add_tokens([f"extra{index}" for index in range(50)])
    return _saved(tokenizer, directory)


def test_a_tokenizer_larger_than_the_model_is_refused_before_running(model_dir, tmp_path):
    loaded = wrap_model(_hf_model(model_dir), _larger_tokenizer(model_dir, tmp_path / "larger"))
    with pytest.raises(InputError, match=r"tokenizer has 350 tokens but the model's vocabulary has 300") as info:
        tokenize_prompts(prompt_set(["extra1 extra49 fox"]), loaded)
    assert info.value.field == "tokenizer" and "\n" not in str(info.value)


def test_a_tokenizer_much_smaller_than_the_model_is_refused(model_dir, tmp_path):
    smaller = _saved(train_byte_level_tokenizer(vocab_size=260), tmp_path / "smaller")
    loaded = wrap_model(_hf_model(model_dir), smaller)
    with pytest.raises(InputError, match=r"tokenizer has 26\d tokens but the model's vocabulary has 300"):
        tokenize_prompts(prompt_set(TINY_GPT2_PROMPTS), loaded)


def test_cli_model_directory_with_another_tokenizer(model_dir, prompts, tmp_path, capsys):
    mixed = shutil.copytree(model_dir, tmp_path / "mixed")
    _larger_tokenizer(model_dir, mixed)
    refused(capsys, tmp_path, audit_argv(mixed, prompts, tmp_path / "out"), "save the model's own tokenizer")


def test_cli_model_directory_without_a_tokenizer(model_dir, prompts, tmp_path, capsys):
    bare = shutil.copytree(model_dir, tmp_path / "bare")
    for name in TOKENIZER_FILES:
        (bare / name).unlink(missing_ok=True)
    refused(capsys, tmp_path, audit_argv(bare, prompts, tmp_path / "out"), "has no tokenizer")


def test_cli_weights_that_do_not_fit_config_name_the_tensor(model_dir, prompts, tmp_path, capsys):
    edited = shutil.copytree(model_dir, tmp_path / "edited")
    config = json.loads((edited / "config.json").read_text())
    config["n_embd"] = 64
    (edited / "config.json").write_text(json.dumps(config))
    argv = audit_argv(edited, prompts, tmp_path / "out")
    fix = "transformer.h.0.attn.c_attn.bias is [96] in model.safetensors but [192] by config.json"
    refused(capsys, tmp_path, argv, fix)


def test_cli_pickled_weights_that_do_not_fit_config_never_point_to_an_unseen_report(
    model_dir, prompts, tmp_path, capsys
):
    """Without safetensors headers to read, the line still says what is wrong, not "see the above report"."""
    edited = shutil.copytree(model_dir, tmp_path / "edited", ignore=shutil.ignore_patterns("*.safetensors"))
    import torch

    torch.save(_hf_model(model_dir).state_dict(), edited / "pytorch_model.bin")
    capsys.readouterr()  # transformers' loading bar, from the line above
    config = json.loads((edited / "config.json").read_text())
    config["n_embd"] = 64
    (edited / "config.json").write_text(json.dumps(config))
    before = snapshot(tmp_path)
    one_line_exit_2(capsys, audit_argv(edited, prompts, tmp_path / "out"), "some tensors have other shapes than")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_cli_prompts_that_are_not_a_regular_file(model_dir, tmp_path, capsys, kind):
    if kind == "fifo":
        path = tmp_path / "pipe.txt"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    fix = "is a named pipe (FIFO), not a regular file" if kind == "fifo" else "is a device, not a regular file"
    refused(capsys, tmp_path, audit_argv(model_dir, path, tmp_path / "out"), fix)


def test_cli_header_only_csv(model_dir, tmp_path, capsys):
    path = tmp_path / "header.csv"
    path.write_text("text\n", encoding="utf-8")
    refused(capsys, tmp_path, audit_argv(model_dir, path, tmp_path / "out"), "has no prompts (only a header)")


def test_a_huge_binary_prompt_file_is_refused_from_its_first_bytes(tmp_path):
    path = tmp_path / "huge.txt"
    with path.open("wb") as file:
        file.truncate(1 << 30)  # 1 GiB of NUL bytes, sparse: no disk used
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match="holds NUL bytes, so it is binary") as info:
            load_prompt_set(PromptSpec(source=str(path)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, peak  # the first bytes were read, not the gigabyte
    assert "\n" not in str(info.value)


def test_cli_gguf_without_its_extension_is_recognised_by_its_magic(model_dir, tmp_path, capsys):
    pytest.importorskip("gguf")
    fake = tmp_path / "model.bin"
    fake.write_bytes(b"GGUF" + bytes(60))
    refused(capsys, tmp_path, audit_argv(fake, "default", tmp_path / "out"), "model.bin is not a readable GGUF file")


@needs_smollm2
def test_a_real_gguf_without_its_extension_resolves(tmp_path):
    link = tmp_path / "smollm2"
    link.symlink_to(smollm2_dir() / GGUF_NAME)
    assert resolve_model(str(link)).gguf_file == "smollm2"


@needs_smollm2
@pytest.mark.parametrize("family", ["qwen2", "bloom"])
def test_cli_gguf_whose_architecture_field_was_changed(tmp_path, capsys, family):
    data = bytearray((smollm2_dir() / GGUF_NAME).read_bytes())
    start = data.index(b"llama", data.index(b"general.architecture"))
    data[start : start + 5] = family.encode()
    edited = tmp_path / "edited.gguf"
    edited.write_bytes(bytes(data))
    argv = audit_argv(edited, "default", tmp_path / "out", "--n-prompts", "2")
    refused(capsys, tmp_path, argv, f"says architecture {family} but its metadata is for llama")


def test_cli_home_that_cannot_hold_the_datasets_cache(model_dir, tmp_path):
    home = tmp_path / "home"
    home.write_text("a file, not a directory")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "XDG_"))}
    env.update(HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    before = snapshot(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "sinkscope", *audit_argv(model_dir, "default", tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "datasets cache" in lines[0] and "set HF_HOME" in lines[0] and "default_prompts" not in lines[0]
    assert snapshot(tmp_path) == before
