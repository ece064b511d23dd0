"""Learned sinks (gpt-oss's per-head sink logits) on a tiny gpt-oss checkpoint, loaded
through sinkscope's own load path (``load_model``: TransformerBridge over the saved
directory), against transformers' eager attention computed here on the same weights:
each head's learned sink mass (1 - row sum) beside its anchor mass, the per-head table,
the sink map, the findings, ``remove_learned_sink`` against transformers with those
heads' sink logits at -inf, and the default-state test that uses it."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from sinkscope.infra.codec import decode, encode
from sinkscope.infra.errors import InputError
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.interp.learned_sinks import has_learned_sinks, learned_sink_logits
from sinkscope.pretrained_analysis.ablation import next_token_loss
from sinkscope.pretrained_analysis.findings import learned_sink_phrase
from sinkscope.pretrained_analysis.loading import LoadSpec, load_model
from sinkscope.probes.default_state import DefaultStateConfig, default_state_test
from sinkscope.probes.interventions import remove_learned_sink, run_with_intervention
from sinkscope.probes.probe import HeadProbe, ProbeConfig
from sinkscope.probes.runner import probe_model
from sinkscope.probes.tables import HEAD_TABLE, anchor_mass_map
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2, load_bridge, load_hf_model, train_byte_level_tokenizer

TOL = 1e-5
# [layer, head] sink logits: strong (L0H0, L1H1 take most of every row), weak and middling
SINK_LOGITS = torch.tensor([[6.0, -2.0, 0.5, 0.0], [-1.0, 7.0, 1.0, 2.5]])
REMOVED = [(0, 0), (1, 1), (1, 3)]


def build_tiny_gpt_oss(directory) -> None:
    """A random 2-layer gpt-oss (4 query heads, 2 key/value heads, 4 experts, hidden 32),
    full attention in both layers (windows are another item's), with ``SINK_LOGITS``."""
    from transformers import GptOssConfig, GptOssForCausalLM

    tokenizer = train_byte_level_tokenizer()
    config = GptOssConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        sliding_window=64,
        layer_types=["full_attention", "full_attention"],
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for layer, block in enumerate(model.model.layers):
            block.self_attn.sinks.copy_(SINK_LOGITS[layer])
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-gpt-oss")
    build_tiny_gpt_oss(directory)
    return directory


@pytest.fixture(scope="module")
def loaded(gpt_oss_dir):
    return load_model(LoadSpec(str(gpt_oss_dir), device="cpu"), progress=False)


@pytest.fixture(scope="module")
def hooked(loaded):
    return HookedModel(loaded.bridge)


@pytest.fixture(scope="module")
def batch(hooked):
    return hooked.prepare(TINY_GPT2_PROMPTS)  # three prompts of different lengths: padded


@pytest.fixture(scope="module")
def hf(gpt_oss_dir):
    return load_hf_model(gpt_oss_dir)


def hf_forward(model, batch, **kwargs):
    with torch.no_grad():
        return model(batch.model_input, attention_mask=batch.attention_mask.long(), **kwargs)


def without_sinks(model, heads):
    """A copy of the transformers model with the sink logits of ``heads`` at -inf."""
    edited = copy.deepcopy(model)
    with torch.no_grad():
        for layer, head in heads:
            edited.model.layers[layer].self_attn.sinks[head] = -math.inf
    return edited


def queries_after_anchor(batch):
    positions = torch.arange(batch.n_pos)
    return batch.attention_mask & (positions.unsqueeze(0) > batch.anchor.unsqueeze(1))


def test_the_load_path_finds_the_learned_sink_logits(loaded, hooked):
    assert loaded.info.model_type == "gpt_oss"
    assert has_learned_sinks(hooked)
    for layer in range(2):
        assert torch.equal(learned_sink_logits(hooked, layer), SINK_LOGITS[layer])


def test_learned_sink_and_anchor_mass_per_head_equal_transformers(hooked, batch, hf):
    probe = probe_model(hooked, TINY_GPT2_PROMPTS, config=ProbeConfig(batch_size=2))
    attentions = hf_forward(hf, batch, output_attentions=True).attentions
    selected = queries_after_anchor(batch)
    rows = torch.arange(batch.batch_size)
    assert probe.n_queries == int(selected.sum())
    for row in probe.heads:
        pattern = attentions[row.layer][:, row.head].double()  # [batch, query, key]
        learned = (1.0 - pattern.sum(dim=-1))[selected].mean()
        anchor = pattern[rows, :, batch.anchor][selected].mean()
        assert row.null_mass == pytest.approx(float(learned), abs=TOL), (row.layer, row.head)
        assert row.anchor_mass == pytest.approx(float(anchor), abs=TOL), (row.layer, row.head)
    by_head = {(row.layer, row.head): row.null_mass for row in probe.heads}
    assert by_head[(0, 0)] > 0.9 and by_head[(1, 1)] > 0.9  # the strong logits do take most of every row


def test_the_table_the_map_and_the_findings_show_the_learned_sink(hooked):
    probe = probe_model(hooked, TINY_GPT2_PROMPTS)
    table = HEAD_TABLE.table(probe.heads).without_empty_columns()
    names = [column.name for column in table.columns]
    assert names.index("null_mass") == names.index("anchor_mass") + 1
    maps = anchor_mass_map(probe, "tiny gpt-oss")
    assert [name for name, _ in maps.panels] == ["anchor mass", "null mass"]
    assert maps.panels[1][1][0][0] == pytest.approx(probe.matrix("null_mass")[0, 0].item())
    finding = learned_sink_phrase(probe)
    assert finding is not None and finding.startswith("2 of 8 heads put ≥ 0.9 of their attention on their learned sink")
    assert "L1H1" in finding and "L0H0" in finding and "L1H3" not in finding


def test_the_null_mass_is_persisted_and_old_files_read_as_unmeasured(hooked):
    row = probe_model(hooked, TINY_GPT2_PROMPTS).heads[0]
    assert decode(HeadProbe, encode(row)).null_mass == row.null_mass > 0.9
    old = {key: value for key, value in encode(row).items() if key != "null_mass"}
    assert math.isnan(decode(HeadProbe, old).null_mass)


def test_remove_learned_sink_equals_transformers_with_those_sink_logits_at_minus_inf(hooked, batch, hf):
    logits = run_with_intervention(hooked, batch.model_input, remove_learned_sink(REMOVED), batch.attention_mask)
    expected = hf_forward(without_sinks(hf, REMOVED), batch).logits
    plain = hf_forward(hf, batch).logits
    real = batch.attention_mask
    assert torch.allclose(logits[real], expected[real], atol=TOL, rtol=0)
    assert (expected[real] - plain[real]).abs().max() > 100 * TOL  # the edit does change the output


def test_the_default_state_test_removes_learned_sinks_as_transformers_does(hooked, batch, hf):
    config = DefaultStateConfig(n_bootstrap=20)
    result = default_state_test(
        hooked, TINY_GPT2_PROMPTS, REMOVED, next_token_loss, config=config, removal=remove_learned_sink
    )
    expected = next_token_loss(hf_forward(without_sinks(hf, [(0, 0)]), batch).logits, batch).mean()
    assert result.rows[0].error_after_remove == pytest.approx(float(expected), abs=TOL)
    together = next_token_loss(hf_forward(without_sinks(hf, REMOVED), batch).logits, batch).mean()
    assert result.all_sink_heads.error_after_remove == pytest.approx(float(together), abs=TOL)


def test_a_model_without_learned_sinks_reports_none_and_refuses_their_removal(tmp_path):
    bridge = load_bridge(build_tiny_gpt2(tmp_path / "gpt2"))
    hooked = HookedModel(bridge)
    assert not has_learned_sinks(hooked)
    probe = probe_model(hooked, TINY_GPT2_PROMPTS)
    assert all(math.isnan(row.null_mass) for row in probe.heads)
    table = HEAD_TABLE.table(probe.heads).without_empty_columns()
    assert "null_mass" not in [column.name for column in table.columns]
    assert len(anchor_mass_map(probe, "gpt2").panels) == 1 and learned_sink_phrase(probe) is None
    with pytest.raises(InputError, match="remove_learned_sink needs a model with learned sink logits"):
        run_with_intervention(hooked, TINY_GPT2_PROMPTS, remove_learned_sink([(0, 0)]))


def test_an_audit_of_gpt_oss_reports_and_persists_the_learned_sink(gpt_oss_dir, tmp_path):
    from sinkscope.pretrained_analysis.audit import AuditConfig, audit, read_audit, write_audit
    from sinkscope.reporting import report

    result = audit(LoadSpec(str(gpt_oss_dir), device="cpu"), TINY_GPT2_PROMPTS, AuditConfig(), progress=False)
    write_audit(result, tmp_path / "audit")
    again = read_audit(tmp_path / "audit")
    assert again.probe.matrix("null_mass").equal(result.probe.matrix("null_mass"))
    written = report(tmp_path / "audit")
    markdown = written.markdown.read_text(encoding="utf-8")
    assert "| anchor_mass | null_mass |" in markdown
    assert "null_mass: mean of 1 − row sum over the same queries" in markdown
    assert "anchor mass and null mass (the learned sink's) per layer and head" in markdown
    assert any("on their learned sink" in finding for finding in written.findings)
    # the terminal line counts them too, and says --ablate leaves them alone
    from sinkscope.cli.audit import _audit_line

    assert "2 heads with a learned sink >= 0.9 (not ablated)" in _audit_line(result)
    assert any("--ablate --ablate-sink learned (remove_learned_sink in Python)" in f for f in written.findings)


def test_the_audit_ablates_the_learned_sinks_on_request_as_transformers_does(gpt_oss_dir, tmp_path, hf):
    """``--ablate --ablate-sink learned``: the default-state test removes the learned sink
    logits of the heads whose learned sink takes >= 0.9 (L1H1 then L0H0, strongest first),
    and its losses equal transformers with those logits at -inf."""
    from sinkscope.cli import main
    from sinkscope.pretrained_analysis.audit import read_audit
    from sinkscope.reporting import report

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(TINY_GPT2_PROMPTS) + "\n")
    out = tmp_path / "audit"
    argv = ["audit", str(gpt_oss_dir), "--prompts", str(prompts), "--out", str(out), "--no-progress"]
    assert main([*argv, "--examples", "0", "--ablate", "--ablate-sink", "learned"]) == 0
    result = read_audit(out)
    ablation = result.ablation
    assert ablation.sink == "learned" and result.config.ablate_sink == "learned"
    assert ablation.default_state.sink_heads == ((1, 1), (0, 0))
    batch = HookedModel(load_model(LoadSpec(str(gpt_oss_dir), device="cpu"), progress=False).bridge).prepare(
        TINY_GPT2_PROMPTS
    )
    expected = next_token_loss(hf_forward(without_sinks(hf, [(1, 1)]), batch).logits, batch).mean()
    assert ablation.default_state.rows[0].error_after_remove == pytest.approx(float(expected), abs=TOL)
    together = next_token_loss(hf_forward(without_sinks(hf, [(1, 1), (0, 0)]), batch).logits, batch).mean()
    assert ablation.default_state.all_sink_heads.error_after_remove == pytest.approx(float(together), abs=TOL)
    written = report(out)
    assert "Learned-sink removal per head (2 of 2 heads with a learned sink alone" in written.markdown.read_text()
    assert any("Removing the sinks of all 2 heads with a learned sink raises" in f for f in written.findings)
    assert any("2 of the 2 heads with a learned sink (largest learned sink mass first)" in f for f in written.findings)


def test_the_learned_sink_ablation_is_refused_for_a_model_without_learned_sinks(tmp_path, capsys):
    from sinkscope.cli import main

    directory = build_tiny_gpt2(tmp_path / "gpt2")
    out = tmp_path / "audit"
    argv = ["audit", str(directory), "--prompt", "a b c d", "--out", str(out), "--no-progress", "--ablate"]
    assert main([*argv, "--ablate-sink", "learned"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "has no learned sink logits" in error[0] and "ablate" in error[0]
    assert not out.exists()
