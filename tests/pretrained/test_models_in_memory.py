"""Bring your own model: ``audit`` on a TransformerBridge built here and on a plain Hugging
Face model object, with a list of strings, gives the numbers the command line gives on the
same checkpoint and the same prompts."""

from __future__ import annotations

from dataclasses import replace

import pytest
from transformer_lens.model_bridge import TransformerBridge
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

from sinkscope.cli import main
from sinkscope.infra.codec import encode
from sinkscope.infra.errors import InputError
from sinkscope.pretrained_analysis.audit import AuditConfig, audit, read_audit
from sinkscope.pretrained_analysis.compare import compare_audits
from sinkscope.pretrained_analysis.prompts import prompt_set
from tiny_models import build_tiny_gpt2

PROMPTS = [
    "The first token collects attention that has nowhere else to go.",
    "Sinks appear in softmax attention because every row must sum to one.",
    "A short prompt.",
    "ReLU attention can attend to nothing at all when nothing matters.",
    "Language models park their attention on the beginning of the sequence.",
]
CONFIG = AuditConfig(n_examples=0, batch_size=2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_tiny_gpt2(tmp_path_factory.mktemp("models") / "tiny-gpt2", bos_sink_head=(0, 0))


@pytest.fixture(scope="module")
def from_the_cli(checkpoint, tmp_path_factory):
    """The same audit from the command line, the prompts read from a file."""
    root = tmp_path_factory.mktemp("cli")
    (root / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    argv = ["audit", str(checkpoint), "--prompts", str(root / "prompts.txt"), "--out", str(root / "out")]
    assert main([*argv, "--examples", "0", "--batch-size", "2", "--no-progress"]) == 0
    return read_audit(root / "out")


def same_numbers(ours, theirs) -> None:
    assert encode(ours.probe.heads) == encode(theirs.probe.heads)
    assert encode(ours.probe.layers) == encode(theirs.probe.layers)
    assert encode(ours.sink_rates) == encode(theirs.sink_rates) and ours.sink_heads() == theirs.sink_heads() == [(0, 0)]


def test_a_bridge_built_in_the_session_with_a_list_of_strings(checkpoint, from_the_cli):
    bridge = TransformerBridge.boot_transformers(str(checkpoint))
    result = audit(bridge, PROMPTS, CONFIG, progress=False)
    same_numbers(result, from_the_cli)
    assert result.model.label == checkpoint.name and result.model.n_layers == from_the_cli.model.n_layers
    assert result.prompts.spec.kind == "texts" and result.prompts.n_prompts == len(PROMPTS)


def test_a_hugging_face_model_object_with_its_tokenizer(checkpoint, from_the_cli):
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint))  # sdpa attention as loaded
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    result = audit(model, PROMPTS, CONFIG, progress=False, tokenizer=tokenizer)
    same_numbers(result, from_the_cli)
    assert result.model.architecture == "GPT2LMHeadModel"


def test_what_cannot_be_audited_is_one_input_error(checkpoint):
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint))
    with pytest.raises(InputError, match="needs its tokenizer; pass tokenizer="):
        audit(model, PROMPTS, CONFIG, progress=False)
    headless = AutoModel.from_pretrained(str(checkpoint))  # GPT2Model: no LM head, which the bridge expects
    with pytest.raises(InputError, match="cannot wrap a GPT2Model .*AutoModelForCausalLM"):
        audit(headless, PROMPTS, CONFIG, progress=False, tokenizer=AutoTokenizer.from_pretrained(str(checkpoint)))
    with pytest.raises(InputError, match="cannot audit a str"):
        audit("gpt2", PROMPTS, CONFIG, progress=False)
    with pytest.raises(InputError, match="not one string"):
        prompt_set("one prompt")
    with pytest.raises(InputError, match="no non-empty prompt"):
        prompt_set(["", "  "])


def test_audits_of_other_texts_do_not_compare(checkpoint, from_the_cli, tmp_path, capsys):
    """Two lists of strings of one length share a PromptSpec; the texts' digest tells them
    apart, and the same texts compare wherever they were read from."""
    bridge = TransformerBridge.boot_transformers(str(checkpoint), device="cpu")
    same = audit(bridge, PROMPTS, CONFIG, progress=False)
    other = audit(bridge, [text.upper() for text in PROMPTS], CONFIG, progress=False)
    assert same.prompts.spec == other.prompts.spec and same.prompts.texts_sha256 != other.prompts.texts_sha256
    with pytest.raises(InputError, match="other prompts"):
        compare_audits([same, other])
    # the CLI's audit read the same texts from a file: they compare, in any order
    assert same.prompts.spec.source != from_the_cli.prompts.spec.source
    assert len(compare_audits([same, from_the_cli]).rows) == len(compare_audits([from_the_cli, same]).rows) == 2
    # an audit without a digest (written before it was recorded) never lets two texts pass
    legacy = replace(same, prompts=replace(same.prompts, texts_sha256=""))
    for order in ([legacy, same, other], [same, legacy, other]):
        with pytest.raises(InputError, match="other prompts"):
            compare_audits(order)
    # on disk: one prompt file whose contents changed between two audits
    prompt_file = tmp_path / "prompts.txt"
    argv = ["--prompts", str(prompt_file), "--examples", "0", "--batch-size", "2", "--no-progress"]
    for name, texts in (("before", PROMPTS), ("after", [text.upper() for text in PROMPTS])):
        prompt_file.write_text("\n".join(texts) + "\n")
        assert main(["audit", str(checkpoint), "--out", str(tmp_path / name), *argv]) == 0
    assert read_audit(tmp_path / "before").prompts.spec == read_audit(tmp_path / "after").prompts.spec
    assert main(["compare", str(tmp_path / "before"), str(tmp_path / "after"), "--out", str(tmp_path / "cmp")]) == 2
    assert "other prompts" in capsys.readouterr().err and not (tmp_path / "cmp").exists()
