"""The right anchor for each family: a tokenizer that adds BOS itself (Llama, Gemma), one
that has a BOS but does not add it (GPT-2, SmolLM2), and one without a BOS token (Qwen).
The audit's tokens are checked against the tokenizer's own call (``tokenizer(text)``,
loaded from the checkpoint by transformers, not TransformerLens' changed copy), with
exactly one anchor in every prompt, named with how it got there in audit.json, the
report and the findings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from sinkscope.cli import main
from sinkscope.infra.codec import encode
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.pretrained_analysis.audit import AuditConfig, audit, read_audit
from sinkscope.pretrained_analysis.loading import LoadSpec, load_model
from sinkscope.pretrained_analysis.prompts import PromptSet, PromptSpec, prompt_set, tokenize_prompts
from sinkscope.probes.runner import probe_model
from sinkscope.reporting import report
from sinkscope.reports.html import escape as html_escape
from sinkscope.reports.markdown import md_escape
from tiny_models import TOKENIZER_CORPUS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Attention sinks park mass.", "A trigger."]


def _trained(specials: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TOKENIZER_CORPUS, trainer=trainer)
    return tokenizer


def adds_bos_itself():
    """Llama-style: its own call puts <s> first (a template post-processor)."""
    tokenizer = _trained(["<s>", "</s>"])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 0)]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", add_bos_token=True
    )


def has_bos_but_does_not_add_it():
    """GPT-2-style: <|endoftext|> is BOS, but its own call adds nothing."""
    tokenizer = _trained(["<|endoftext|>"])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )


def has_no_bos():
    """Qwen-style: no BOS token at all; <|endoftext|> is EOS and padding."""
    tokenizer = _trained(["<|endoftext|>", "<|im_start|>"])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=None, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )


KINDS = {"tokenizer": adds_bos_itself, "prepended": has_bos_but_does_not_add_it, "absent": has_no_bos}


@pytest.fixture(scope="module", params=list(KINDS))
def checkpoint(request, tmp_path_factory):
    """A tiny Llama with the tokenizer of one kind; (how, directory, the tokenizer's own load)."""
    directory = tmp_path_factory.mktemp(request.param)
    tokenizer = KINDS[request.param]()
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=64,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return request.param, directory, transformers.AutoTokenizer.from_pretrained(str(directory))


def own_rows(how: str, own) -> list[list[int]]:
    """What the tokenizer's own call gives, with the one BOS sinkscope prepends where the
    tokenizer has one but does not add it."""
    rows = [own(text)["input_ids"] for text in TEXTS]
    return [[own.bos_token_id, *row] for row in rows] if how == "prepended" else rows


def test_tokens_are_the_tokenizers_own_with_exactly_one_anchor(checkpoint):
    how, directory, own = checkpoint
    loaded = load_model(LoadSpec(str(directory), device="cpu"), progress=False)
    tokenized = tokenize_prompts(prompt_set(TEXTS), loaded)
    rows = [row[mask].tolist() for row, mask in zip(tokenized.tokens, tokenized.attention_mask, strict=True)]
    assert rows == own_rows(how, own)
    assert tokenized.summary.anchor_how == how
    if how == "absent":
        # TransformerLens' copy calls <|endoftext|> its BOS; it must not appear as an anchor
        assert loaded.bridge.tokenizer.bos_token == "<|endoftext|>" and own.bos_token is None
        assert all(own.eos_token_id not in row for row in rows)
        assert tokenized.summary.anchor_token == own.convert_ids_to_tokens(rows[0][0])
    else:
        assert all(row[0] == own.bos_token_id and row.count(own.bos_token_id) == 1 for row in rows)
        assert tokenized.summary.anchor_token == own.bos_token
    # random prompts: the same anchor rule, T tokens in all
    spec = PromptSpec(source="random", n_prompts=2, max_len=8)
    random_rows = tokenize_prompts(PromptSet(spec=spec, texts=(), n_available=2, location="random"), loaded)
    first = random_rows.tokens[:, 0].tolist()
    assert random_rows.tokens.shape == (2, 8)
    if how == "absent":
        assert own.eos_token_id not in first  # random bodies hold no special token: no stand-in BOS
    else:
        assert first == [own.bos_token_id] * 2
    assert random_rows.summary.anchor_how == how


WORDS = {
    "tokenizer": "the BOS token <s>, added by the tokenizer itself",
    "prepended": "the prepended BOS token <|endoftext|>",
    "absent": "each prompt's first token (the tokenizer has no BOS token; the first prompt's is {first})",
}


def test_audit_json_and_the_report_name_the_anchor_and_how(checkpoint, tmp_path):
    how, directory, own = checkpoint
    first = own.convert_ids_to_tokens(own_rows(how, own)[0][0])  # the anchor of the first prompt
    words = WORDS[how].format(first=first)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "audit"
    argv = ["audit", str(directory), "--prompts", str(prompts), "--out", str(out), "--examples", "0", "--no-progress"]
    assert main(argv) == 0
    stored = json.loads((out / "audit.json").read_text())["prompts"]
    assert (stored["anchor_how"], stored["anchor_token"]) == (how, first)
    result = read_audit(out)
    assert result.anchor == words
    written = report(out)
    html, markdown = written.html.read_text(), written.markdown.read_text()
    assert md_escape(words) in markdown and html_escape(words) in html
    assert any(words in finding for finding in written.findings)
    # a model already in memory, with its own tokenizer, gets the same anchor
    model = transformers.AutoModelForCausalLM.from_pretrained(str(directory))
    in_memory = audit(model, TEXTS, AuditConfig(n_examples=0), progress=False, tokenizer=own)
    assert (in_memory.prompts.anchor_how, in_memory.anchor) == (how, words)
    assert encode(in_memory.probe.heads) == encode(result.probe.heads)


def test_audits_written_before_the_how_was_recorded_still_name_their_anchor():
    """Older audit.json files have no anchor_how: their anchor is read from the BOS convention."""
    expected = {
        "b883e06/audit-gpt2": "the prepended BOS token <|endoftext|>",
        "b883e06/minilm-audit": "[CLS], the first token",
        "v1-3107c0e/audit": "the prepended BOS token <|endoftext|>",
    }
    for name, words in expected.items():
        result = read_audit(FIXTURES / name)
        assert result.prompts.anchor_how == "" and result.anchor == words, name


def test_a_tokenizer_built_in_memory_gets_the_same_anchor(checkpoint):
    """No files to reload it from: a tokenizer with a BOS is given files of its own (which
    TransformerLens 4.3 needs to make it add BOS), and one without tells an absent BOS by
    its declaration (not the EOS TransformerLens stands in with)."""
    how, directory, own = checkpoint
    model = transformers.AutoModelForCausalLM.from_pretrained(str(directory))
    built = KINDS[how]()
    assert not built.name_or_path
    result = audit(model, TEXTS, AuditConfig(n_examples=0), progress=False, tokenizer=built)
    assert (result.prompts.anchor_how, result.prompts.anchor_token) == (
        how,
        own.convert_ids_to_tokens(own_rows(how, own)[0][0]),
    )


def test_strings_given_to_a_probe_get_the_tokenizers_own_anchor(checkpoint):
    """``probe_model(bridge, strings)`` tokenizes through TransformerLens, whose copy of a
    tokenizer without a BOS (Qwen) stands its EOS in as one: the strings must still get
    the tokenizer's own tokens, with one anchor, as the audit gives them."""
    how, directory, own = checkpoint
    loaded = load_model(LoadSpec(str(directory), device="cpu"), progress=False)
    batch = HookedModel(loaded.bridge).prepare(TEXTS, padding_side="right")
    rows = [row[mask].tolist() for row, mask in zip(batch.model_input, batch.attention_mask, strict=True)]
    assert rows == own_rows(how, own)
    by_audit = tokenize_prompts(prompt_set(TEXTS), loaded)
    probed = probe_model(loaded.bridge, TEXTS)
    expected = probe_model(loaded.bridge, by_audit.tokens, attention_mask=by_audit.attention_mask)
    for mine, theirs in zip(probed.heads, expected.heads, strict=True):  # the same tokens: equal up to rounding
        for name in ("anchor_mass", "alpha", "value_weighted_anchor_share", "row_entropy", "head_out_norm"):
            assert getattr(mine, name) == pytest.approx(getattr(theirs, name), rel=1e-6, abs=1e-9), name


def test_a_text_that_spells_its_own_bos_gets_one_anchor_with_special_tokens_parsed(checkpoint):
    how, directory, own = checkpoint
    if how != "prepended":
        return  # the case: a BOS the tokenizer has but does not add, spelled at the text's start
    loaded = load_model(LoadSpec(str(directory), device="cpu"), progress=False)
    text = own.bos_token + " " + TEXTS[1]
    tokenized = tokenize_prompts(prompt_set([text], parse_special_tokens=True), loaded)
    row = tokenized.tokens[0][tokenized.attention_mask[0]].tolist()
    assert row.count(own.bos_token_id) == 1 and row[0] == own.bos_token_id


def test_a_tokenizer_given_as_a_path_is_one_input_error(checkpoint):
    from sinkscope.infra.errors import InputError

    _, directory, _ = checkpoint
    model = transformers.AutoModelForCausalLM.from_pretrained(str(directory))
    with pytest.raises(InputError, match="AutoTokenizer.from_pretrained"):
        audit(model, TEXTS, AuditConfig(n_examples=0), progress=False, tokenizer=str(directory))


def test_the_learned_sink_setting_without_the_ablations_is_refused():
    from sinkscope.infra.errors import InputError

    with pytest.raises(InputError, match="--ablate"):
        AuditConfig(ablate_sink="learned")
    assert AuditConfig(ablate=True, ablate_sink="learned").ablate_sink == "learned"
