"""Prompt sets: every source reads through ``datasets``, selection is seeded, tokens follow
the BOS rule and T, and every bad input is one line naming the fix."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from sinkscope.pretrained_analysis.loading import LoadSpec, load_model
from sinkscope.pretrained_analysis.prompts import PromptError, PromptSpec, load_prompt_set, tokenize_prompts
from tiny_models import build_tiny_gpt2

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Attention sinks park mass.", "A trigger."]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    directory = build_tiny_gpt2(tmp_path_factory.mktemp("tiny") / "tiny-gpt2")
    return load_model(LoadSpec(str(directory)), progress=False)


@pytest.fixture
def files(tmp_path):
    (tmp_path / "p.txt").write_text("\n".join([TEXTS[0], "", "   ", *TEXTS[1:]]) + "\n")
    (tmp_path / "p.jsonl").write_text(
        "".join(json.dumps({"body": text, "id": k}) + "\n" for k, text in enumerate(TEXTS))
    )
    pd.DataFrame({"body": TEXTS, "id": range(3)}).to_csv(tmp_path / "p.csv", index=False)
    pd.DataFrame({"body": TEXTS, "id": range(3)}).to_parquet(tmp_path / "p.parquet")
    return tmp_path


@pytest.mark.parametrize(
    "name, column", [("p.txt", "text"), ("p.jsonl", "body"), ("p.csv", "body"), ("p.parquet", "body")]
)
def test_local_files_read_every_prompt_in_order(files, name, column):
    prompt_set = load_prompt_set(PromptSpec(source=str(files / name), text_column=column))
    assert prompt_set.texts == tuple(TEXTS) and prompt_set.n_available == 3


def test_builtin_set_is_packaged_varied_and_subset_by_seed():
    full = load_prompt_set(PromptSpec(n_prompts=1000))
    assert full.n_available >= 64 and len(set(full.texts)) == len(full.texts)
    first, again, other = (load_prompt_set(PromptSpec(n_prompts=10, seed=seed)) for seed in (0, 0, 1))
    assert first.texts == again.texts != other.texts
    assert list(first.texts) == [text for text in full.texts if text in first.texts]  # source order kept


def test_tokens_follow_bos_rule_truncation_and_padding(files, tiny):
    tokenizer = tiny.bridge.tokenizer
    prompt_set = load_prompt_set(PromptSpec(source=str(files / "p.txt"), max_len=24))
    with_bos = tokenize_prompts(prompt_set, tiny)
    plain = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS]
    for row, ids in enumerate(plain):
        expected = ([tokenizer.bos_token_id] + ids)[:24]
        length = int(with_bos.attention_mask[row].sum())
        assert with_bos.tokens[row, :length].tolist() == expected
        assert not with_bos.attention_mask[row, length:].any()  # right padding, masked
    summary = with_bos.summary
    assert summary.n_truncated == sum(len(ids) + 1 > 24 for ids in plain) > 0
    assert summary.max_tokens == 24 and summary.anchor_token == "<|endoftext|>"
    assert summary.spec.prepend_bos is True and summary.spec.kind == "file"
    without = tokenize_prompts(
        load_prompt_set(PromptSpec(source=str(files / "p.txt"), max_len=24, prepend_bos=False)), tiny
    )
    assert without.tokens[2, : len(plain[2])].tolist() == plain[2]


def test_random_token_prompts_are_seeded_and_skip_special_tokens(tiny):
    spec = PromptSpec(source="random", n_prompts=5, max_len=16, seed=3)
    first = tokenize_prompts(load_prompt_set(spec), tiny)
    again = tokenize_prompts(load_prompt_set(spec), tiny)
    assert torch.equal(first.tokens, again.tokens) and first.tokens.shape == (5, 16)
    bos = tiny.bridge.tokenizer.bos_token_id
    assert (first.tokens[:, 0] == bos).all() and not (first.tokens[:, 1:] == bos).any()
    assert bool(first.attention_mask.all())


@pytest.mark.parametrize(
    "spec_kwargs, content, fragment",
    [
        ({}, "", "is empty"),
        ({}, "\n  \n\n", "is empty"),
        ({}, '{"text": ""}\n{"text": "  "}\n', "holds no prompts"),
        ({"text_column": "missing"}, None, "available columns: body, id; set text_column"),
        ({"text_column": "id"}, None, "holds int values, not text"),
    ],
)
def test_bad_prompt_files(tmp_path, files, spec_kwargs, content, fragment):
    if content is None:
        path = files / "p.csv"
    else:
        path = tmp_path / ("bad.jsonl" if content.startswith("{") else "bad.txt")
        path.write_text(content)
    with pytest.raises(PromptError, match=fragment) as info:
        load_prompt_set(PromptSpec(source=str(path), **spec_kwargs))
    assert "\n" not in str(info.value)


def test_missing_file_bad_sizes_and_long_t(tmp_path, tiny):
    with pytest.raises(PromptError, match="does not exist"):
        load_prompt_set(PromptSpec(source=str(tmp_path / "nope.txt")))
    with pytest.raises(PromptError, match="max_len must be an integer in \\[2, 1048576\\], got 1"):
        PromptSpec(max_len=1)
    with pytest.raises(PromptError, match="max_len 65 exceeds the context of tiny-gpt2 \\(64 tokens\\)"):
        tokenize_prompts(load_prompt_set(PromptSpec(max_len=65)), tiny)


def test_hub_dataset_offline_names_the_fix():
    with pytest.raises(PromptError, match="not in the local datasets cache and the hub is offline"):
        load_prompt_set(PromptSpec(source="Salesforce/wikitext:wikitext-2-raw-v1"))
