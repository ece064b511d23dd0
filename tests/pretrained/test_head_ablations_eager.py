"""The audit's head ablations on a real GPT-2 checkpoint (a planted BOS sink head) equal the
same ablations made inside transformers' eager model: the head's slice of ``c_proj``'s input
set to 0, or to its per-position mean over the prompts' real tokens; the per-prompt loss
changes and their paired difference with sink removal match, and the report and findings
carry them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sinkscope.cli import main
from sinkscope.pretrained_analysis.audit import AuditConfig, audit, write_audit
from sinkscope.pretrained_analysis.loading import LoadSpec, load_model
from sinkscope.pretrained_analysis.prompts import prompt_set, tokenize_prompts
from sinkscope.probes.head_ablations import head_ablation_reading
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2, load_hf_model

torch.set_num_threads(1)

PROMPTS = [
    *TINY_GPT2_PROMPTS,
    "Heads with nothing to do look at the start.",
    "Ten short words make a small prompt.",
    "A sink head parks its attention on the first token.",
]
HEAD = (0, 1)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    directory = build_tiny_gpt2(tmp_path_factory.mktemp("gpt2"), bos_sink_head=HEAD)
    config = AuditConfig(ablate=True, n_bootstrap=200, n_examples=0)
    return directory, audit(LoadSpec(str(directory)), PROMPTS, config, progress=False)


def _eager_losses(hf, tokens, mask, replace=None):
    """Per-prompt mean next-token loss from transformers, with head ``HEAD``'s slice of its
    layer's ``c_proj`` input replaced by ``replace(slice_values)`` (None: nothing replaced)."""
    layer, head = HEAD
    d_head = hf.config.n_embd // hf.config.n_head
    cols = slice(head * d_head, (head + 1) * d_head)

    def pre_hook(module, args):
        (merged,) = args
        merged = merged.clone()
        merged[..., cols] = replace(merged[..., cols])
        return (merged,)

    handle = hf.transformer.h[layer].attn.c_proj.register_forward_pre_hook(pre_hook) if replace else None
    try:
        with torch.no_grad():
            logits = hf(tokens, attention_mask=mask.long()).logits
    finally:
        if handle is not None:
            handle.remove()
    valid = (mask[:, 1:] & mask[:, :-1]).double()
    losses = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
    return (losses.view(valid.shape).double() * valid).sum(dim=1) / valid.sum(dim=1)


def _head_outputs(hf, tokens, mask):
    """The head's z at every position ``[batch, pos, d_head]``, read at ``c_proj``'s input."""
    layer, head = HEAD
    d_head = hf.config.n_embd // hf.config.n_head
    captured = {}
    hook = hf.transformer.h[layer].attn.c_proj.register_forward_pre_hook(
        lambda module, args: captured.update(z=args[0][..., head * d_head : (head + 1) * d_head].detach())
    )
    try:
        with torch.no_grad():
            hf(tokens, attention_mask=mask.long())
    finally:
        hook.remove()
    return captured["z"]


def test_zero_and_mean_ablation_equal_transformers_eager(planted):
    directory, result = planted
    test = result.ablation.default_state
    assert test.sink_heads == (HEAD,)  # the planted head is the one sink head
    (row,) = test.rows
    hf = load_hf_model(directory)
    tokenized = tokenize_prompts(prompt_set(PROMPTS), load_model(LoadSpec(str(directory)), progress=False))
    tokens, mask = tokenized.tokens, tokenized.attention_mask.bool()
    base = _eager_losses(hf, tokens, mask)
    zeroed = _eager_losses(hf, tokens, mask, torch.zeros_like) - base
    z = _head_outputs(hf, tokens, mask)
    real = mask.double()[:, :, None]
    mean = ((z.double() * real).sum(dim=0) / real.sum(dim=0).clamp_min(1.0)).float()  # [pos, d_head]
    averaged = _eager_losses(hf, tokens, mask, lambda values: mean.expand_as(values)) - base
    assert row.zero_increase.mean == pytest.approx(float(zeroed.mean()), abs=1e-5)
    assert row.mean_increase.mean == pytest.approx(float(averaged.mean()), abs=1e-5)
    assert abs(float(zeroed.mean())) > 1e-3  # the comparison is not of two zeros
    assert row.remove_minus_mean.mean == pytest.approx(row.remove_increase.mean - float(averaged.mean()), abs=1e-5)
    assert row.zero_increase.ci_low <= row.zero_increase.mean <= row.zero_increase.ci_high
    assert head_ablation_reading(row) is not None


def test_the_audit_report_and_findings_carry_the_head_ablations(planted, tmp_path):
    _, result = planted
    write_audit(result, tmp_path / "audit")
    assert main(["report", str(tmp_path / "audit"), "--overwrite"]) == 0
    markdown = (tmp_path / "audit" / "report.md").read_text()
    reading = head_ablation_reading(result.ablation.default_state.rows[0])
    assert "Head ablations beside sink removal" in markdown and reading in markdown
    assert (
        "Head ablations (each head's output zero- or mean-ablated beside its sink removal; next-token loss " in markdown
    )
    assert "mean over 6 prompts): the one sink head tested alone (L0H1) reads" in markdown
