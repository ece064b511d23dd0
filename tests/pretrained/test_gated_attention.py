"""Gated attention in a hybrid model, on a tiny Qwen3-Next checkpoint (linear attention in
layers 0 and 2, gated full attention in layers 1 and 3) audited through sinkscope's own
load path, against transformers' eager attention computed here on the same weights: the
linear-attention layers are listed as having no pattern and no probe reads them, and each
gated head's anchor mass, mean gate (``gate_default``) and gated anchor term
(``gated_anchor_norm``) equal transformers' to 1e-5. A family whose non-attention layers
are not linear attention (LFM2) or that has no attention (Mamba) is still refused
(tests/pretrained/test_gguf_moe_families.py, tests/pretrained/test_gqa.py)."""

from __future__ import annotations

import math

import pytest
import torch

from sinkscope.infra.errors import InputError
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.pretrained_analysis.audit import AuditConfig, audit, read_audit, write_audit
from sinkscope.pretrained_analysis.loading import LoadSpec, load_model
from sinkscope.pretrained_analysis.prompts import prompt_set, tokenize_prompts
from sinkscope.probes.interventions import remove_sink, run_with_intervention
from sinkscope.probes.probe import ProbeConfig
from sinkscope.probes.runner import probe_model
from tiny_models import TINY_GPT2_PROMPTS, load_hf_model, train_byte_level_tokenizer

TOL = 1e-5
LAYER_TYPES = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
ATTENTION_LAYERS = (1, 3)
N_HEADS, N_KV_HEADS, D_HEAD = 4, 2, 8
KIND = "linear attention (Qwen3NextGatedDeltaNet)"


def build_tiny_qwen3_next(directory) -> None:
    """A random 4-layer Qwen3-Next (4 query heads, 2 key/value heads, 4 experts) whose
    embeddings share a constant first coordinate, which the gate rows of head 0 (closed)
    and head 1 (open) of both attention layers read with a large weight."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    tokenizer = train_byte_level_tokenizer()
    config = Qwen3NextConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=32,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
        num_hidden_layers=4,
        num_attention_heads=N_HEADS,
        num_key_value_heads=N_KV_HEADS,
        head_dim=D_HEAD,
        num_experts=4,
        num_experts_per_tok=2,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        layer_types=LAYER_TYPES,
        max_position_embeddings=64,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        for layer in ATTENTION_LAYERS:
            q_proj = model.model.layers[layer].self_attn.q_proj.weight  # [head * (query | gate), d_model]
            for head, weight in ((0, -30.0), (1, 30.0)):
                q_proj[head * 2 * D_HEAD + D_HEAD : (head + 1) * 2 * D_HEAD, 0] = weight
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


@pytest.fixture(scope="module")
def qwen3_next_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-qwen3-next")
    build_tiny_qwen3_next(directory)
    return directory


@pytest.fixture(scope="module")
def loaded(qwen3_next_dir):
    return load_model(LoadSpec(str(qwen3_next_dir), device="cpu"), progress=False)


@pytest.fixture(scope="module")
def hooked(loaded):
    return HookedModel(loaded.bridge)


@pytest.fixture(scope="module")
def result(qwen3_next_dir):
    return audit(LoadSpec(str(qwen3_next_dir), device="cpu"), TINY_GPT2_PROMPTS, AuditConfig(), progress=False)


def reference(directory, batch):
    """transformers' eager attention on ``batch``: per attention layer, its pattern
    ``[batch, head, query, key]``, its gate σ(g) ``[batch, pos, head, d_head]`` (the second
    half of each head's slice of q_proj) and its values ``[batch, pos, head, d_head]``."""
    model = load_hf_model(directory)
    captured: dict[tuple[int, str], torch.Tensor] = {}
    handles = []
    for layer in ATTENTION_LAYERS:
        attention = model.model.layers[layer].self_attn
        for name in ("q_proj", "v_proj"):

            def keep(module, inputs, output, key=(layer, name)):
                captured[key] = output.detach()

            handles.append(getattr(attention, name).register_forward_hook(keep))
    with torch.no_grad():
        out = model(batch.model_input, attention_mask=batch.attention_mask.long(), output_attentions=True)
    for handle in handles:
        handle.remove()
    shape = (*batch.model_input.shape, N_HEADS, D_HEAD)
    layers = {}
    for layer, pattern in zip(ATTENTION_LAYERS, out.attentions, strict=True):  # the full-attention layers only
        q_and_gate = captured[(layer, "q_proj")].view(*shape[:2], N_HEADS, 2 * D_HEAD)
        gate = torch.sigmoid(q_and_gate[..., D_HEAD:].double())
        values = captured[(layer, "v_proj")].view(*shape[:2], N_KV_HEADS, D_HEAD).double()
        layers[layer] = (pattern.double(), gate, values.repeat_interleave(N_HEADS // N_KV_HEADS, dim=2))
    return layers


def queries_after_anchor(batch):
    positions = torch.arange(batch.n_pos)
    return batch.attention_mask & (positions.unsqueeze(0) > batch.anchor.unsqueeze(1))


def test_the_linear_attention_layers_are_listed_as_without_pattern_and_never_probed(result):
    spec = result.probe.model
    assert [(row.layer, row.kind) for row in spec.no_pattern_layers] == [(0, KIND), (2, KIND)]
    assert spec.pattern_layers == ATTENTION_LAYERS
    assert sorted({row.layer for row in result.probe.heads}) == list(ATTENTION_LAYERS)
    assert [row.layer for row in result.probe.layers] == list(ATTENTION_LAYERS)
    assert len(result.probe.heads) == len(ATTENTION_LAYERS) * N_HEADS
    assert any("layers 0, 2 of 4 have no attention pattern" in note for note in result.probe.notes)
    assert list(result.probe.inconsistencies()) == []


def test_anchor_mass_gate_and_gated_anchor_term_equal_transformers(qwen3_next_dir, loaded, hooked, result):
    tokenized = tokenize_prompts(prompt_set(TINY_GPT2_PROMPTS), loaded)  # the audit's own tokens, BOS first
    batch = hooked.prepare(tokenized.tokens, tokenized.attention_mask)  # three lengths: right-padded
    layers = reference(qwen3_next_dir, batch)
    selected = queries_after_anchor(batch)
    rows = torch.arange(batch.batch_size)
    assert result.probe.n_queries == int(selected.sum())
    worst = dict.fromkeys(("anchor_mass", "gate_default", "gated_anchor_norm"), 0.0)
    for row in result.probe.heads:
        pattern, gate, values = layers[row.layer]
        weights = pattern[rows, row.head, :, batch.anchor]  # [batch, query]: A[i, a]
        anchor_value = values[rows, batch.anchor, row.head]  # [batch, d_head]
        gated = weights * (gate[:, :, row.head] * anchor_value.unsqueeze(1)).norm(dim=-1)
        expected = {
            "anchor_mass": weights[selected].mean(),
            "gate_default": gate[:, :, row.head].mean(dim=-1)[selected].mean(),
            "gated_anchor_norm": gated[selected].mean(),
        }
        for name, value in expected.items():
            worst[name] = max(worst[name], abs(getattr(row, name) - float(value)))
        assert math.isnan(row.gate_trigger)  # an audit has no trigger queries
    assert max(worst.values()) < TOL, worst
    by_head = {(row.layer, row.head): row for row in result.probe.heads}
    for layer in ATTENTION_LAYERS:  # head 0's gate is closed, head 1's open: the default state is the gate's
        assert by_head[layer, 0].gate_default < 0.1 and by_head[layer, 0].default_source == "gate"
        assert by_head[layer, 1].gate_default > 0.9


def test_the_audit_persists_and_reports_the_layers_without_pattern_and_the_gate(result, tmp_path):
    from sinkscope.reporting import report

    write_audit(result, tmp_path / "audit")
    again = read_audit(tmp_path / "audit")
    assert again.probe.model.no_pattern_layers == result.probe.model.no_pattern_layers
    torch.testing.assert_close(
        again.probe.matrix("gated_anchor_norm"),
        result.probe.matrix("gated_anchor_norm"),
        rtol=0,
        atol=0,
        equal_nan=True,
    )
    assert again.probe.matrix("gated_anchor_norm")[[0, 2]].isnan().all()
    header = (tmp_path / "audit" / "heads.csv").read_text().splitlines()[0].split(",")
    assert "gate_default" in header and "gated_anchor_norm" in header
    markdown = report(tmp_path / "audit").markdown.read_text(encoding="utf-8")
    assert "| 0 | linear attention (Qwen3NextGatedDeltaNet) | no pattern |" in markdown
    assert "| 2 | linear attention (Qwen3NextGatedDeltaNet) | no pattern |" in markdown
    assert "gated_anchor_norm: mean of A\\[i, a\\] \u2016g_i \u2299 v_a\u2016" in markdown


def test_a_probe_or_an_intervention_of_a_linear_attention_layer_is_refused_in_one_line(hooked):
    with pytest.raises(InputError, match=r"^layer 2 has no attention pattern \(linear attention") as error:
        probe_model(hooked, TINY_GPT2_PROMPTS, config=ProbeConfig(layers=(1, 2)))
    assert "choose among the attention layers 1, 3" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(InputError, match=r"layer 0 of head \(0, 1\) has no attention heads"):
        run_with_intervention(hooked, TINY_GPT2_PROMPTS, remove_sink([(0, 1)]))
    only = probe_model(hooked, TINY_GPT2_PROMPTS, config=ProbeConfig(layers=(3,)))
    assert {row.layer for row in only.heads} == {3}
