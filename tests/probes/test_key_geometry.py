"""Key geometry per head against a direct computation from the weights: queries, keys and
values read off the Hugging Face projections (eager attention, one prompt at a time, no
padding), rotated with the model's own rotary embedding, then the cosines and norm
ratios of the definition written out query by query."""

from __future__ import annotations

import math

import pytest
import torch

from sinkscope.infra.errors import InputError
from sinkscope.probes.geometry_result import draw_key_geometry, key_geometry
from sinkscope.probes.probe import ProbeConfig
from sinkscope.probes.runner import probe_model
from tiny_models import build_tiny_gpt2, build_tiny_gqa, load_bridge, load_hf_model, toy_sink_model

LENGTHS = (9, 6, 12, 7)  # unequal: the probe's batches pad, the reference does not
CONFIG = ProbeConfig(with_key_geometry=True, batch_size=3)


def _prompts(bos: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids starting with BOS, right-padded, and their attention mask."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.full((len(LENGTHS), max(LENGTHS)), bos)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(LENGTHS):
        ids[row, 1:length] = torch.randint(5, 250, (length - 1,), generator=generator)
        mask[row, :length] = 1
    return ids, mask


def _capture_llama(model, ids: torch.Tensor, layer: int) -> dict[str, torch.Tensor]:
    """q, k, v of ``layer`` ``[pos, heads, d_head]`` straight from its projections, and q, k
    after the model's rotary embedding."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    attention = model.model.layers[layer].self_attn
    d_head = attention.head_dim
    seen: dict[str, torch.Tensor] = {}
    handles = [
        getattr(attention, f"{name}_proj").register_forward_hook(
            lambda _m, _i, out, name=name: seen.__setitem__(name, out[0].view(out.shape[1], -1, d_head))
        )
        for name in ("q", "k", "v")
    ]
    with torch.no_grad():
        out = model(ids[None], output_hidden_states=True)
        cos, sin = model.model.rotary_emb(out.hidden_states[layer], torch.arange(len(ids))[None])
        q_rot, k_rot = apply_rotary_pos_emb(seen["q"].transpose(0, 1)[None], seen["k"].transpose(0, 1)[None], cos, sin)
    for handle in handles:
        handle.remove()
    return {**seen, "rot_q": q_rot[0].transpose(0, 1), "rot_k": k_rot[0].transpose(0, 1)}


def _capture_gpt2(model, ids: torch.Tensor, layer: int) -> dict[str, torch.Tensor]:
    """q, k, v of a GPT-2 ``layer`` from its fused c_attn projection."""
    attention = model.transformer.h[layer].attn
    seen: dict[str, torch.Tensor] = {}
    handle = attention.c_attn.register_forward_hook(lambda _m, _i, out: seen.__setitem__("qkv", out[0]))
    with torch.no_grad():
        model(ids[None])
    handle.remove()
    width = model.config.n_embd
    q, k, v = seen["qkv"].split(width, dim=-1)
    shape = (len(ids), model.config.n_head, -1)
    return {"q": q.reshape(shape), "k": k.reshape(shape), "v": v.reshape(shape)}


def reference(captures: list[dict[str, torch.Tensor]], head: int, group: int, rotated: bool) -> dict[str, float]:
    """The definition, query by query: anchor = position 0, queries 1..n-1, other keys 1..i."""
    q_name, k_name = ("rot_q", "rot_k") if rotated else ("q", "k")
    anchor_sum = other_sum = count = 0.0
    key_ratios, value_ratios = [], []
    for seen in captures:
        q, k, v = seen[q_name][:, head], seen[k_name][:, head // group], seen["v"][:, head // group]
        for i in range(1, len(q)):
            cosines = torch.nn.functional.cosine_similarity(q[i][None], k[: i + 1], dim=-1)
            anchor_sum += float(cosines[0])
            other_sum += float(cosines[1:].mean())
            count += 1
        key_ratios.append(float(k[0].norm() / k[1:].norm(dim=-1).median()))
        value_ratios.append(float(v[0].norm() / v[1:].norm(dim=-1).median()))
    return {
        "anchor_cos": anchor_sum / count,
        "other_cos": other_sum / count,
        "key_ratio": sum(key_ratios) / len(key_ratios),
        "value_ratio": sum(value_ratios) / len(value_ratios),
    }


def _checked(row, expected: dict[str, float], rotated: bool) -> None:
    suffix = "_rotated" if rotated else ""
    assert getattr(row, "anchor_key_cos" + suffix) == pytest.approx(expected["anchor_cos"], abs=1e-5)
    assert getattr(row, "other_key_cos" + suffix) == pytest.approx(expected["other_cos"], abs=1e-5)
    assert row.anchor_key_norm_ratio == pytest.approx(expected["key_ratio"], rel=1e-5)
    assert row.anchor_value_norm_ratio == pytest.approx(expected["value_ratio"], rel=1e-5)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny Llama with 4 query heads on 2 kv heads, rotary embeddings, a BOS sink at L1H2."""
    directory = build_tiny_gqa(tmp_path_factory.mktemp("llama") / "m", bos_sink_head=(1, 2))
    hf = load_hf_model(directory)
    ids, mask = _prompts(hf.config.bos_token_id)
    result = probe_model(load_bridge(directory), ids, attention_mask=mask, config=CONFIG)
    captures = {
        layer: [_capture_llama(hf, ids[row, :length], layer) for row, length in enumerate(LENGTHS)]
        for layer in range(2)
    }
    return result, captures


def test_gqa_rope_geometry_matches_the_weights_before_and_after_rotation(llama):
    result, captures = llama
    for row in result.heads:
        for rotated in (False, True):
            _checked(row, reference(captures[row.layer], row.head, group=2, rotated=rotated), rotated)


def test_the_figure_of_a_rotary_model_names_both_stages(llama, tmp_path):
    result, _ = llama
    figure = draw_key_geometry(result.heads, tmp_path / "geometry.png", "tiny Llama")
    titles = [axes.get_title() for axes in figure.axes if axes.get_title()]
    assert titles[:2] == ["query-key cosine, before RoPE", "query-key cosine, after RoPE"]


def test_a_query_head_reads_its_own_kv_head(llama):
    """Mutation check: pairing query head h with kv head h % 2 (not h // 2) gives other numbers."""
    result, captures = llama
    row = next(r for r in result.heads if (r.layer, r.head) == (0, 1))  # kv head 0, not 1
    wrong = reference([{**seen, "k": seen["k"][:, [1, 0]]} for seen in captures[0]], 1, group=2, rotated=False)
    assert abs(row.anchor_key_cos - wrong["anchor_cos"]) > 1e-3


def test_rope_keeps_the_norms_and_turns_the_cosines(llama):
    result, captures = llama
    for seen in captures[0]:  # a rotation keeps every key's norm: one norm ratio serves both
        assert torch.allclose(seen["rot_k"].norm(dim=-1), seen["k"].norm(dim=-1), rtol=1e-5)
    turned = [abs(row.anchor_key_cos - row.anchor_key_cos_rotated) for row in result.heads]
    assert max(turned) > 1e-3


def test_the_planted_sink_head_s_queries_point_at_the_anchor_s_key(llama):
    result, _ = llama
    sink = next(r for r in result.heads if (r.layer, r.head) == (1, 2))
    assert sink.is_sink_head
    assert sink.anchor_key_cos_rotated > 0.9 > sink.other_key_cos_rotated
    summary = {(row.metric, row.group): row.spread for row in key_geometry(result).summary}
    assert summary[("cos(q, k_anchor) after RoPE", "sink heads")].n == 1
    assert summary[("cos(q, k_anchor) after RoPE", "other heads")].n == 7


def test_gpt2_without_rope_has_no_rotated_numbers_and_matches_the_weights(tmp_path):
    directory = build_tiny_gpt2(tmp_path / "g")
    hf = load_hf_model(directory)
    ids, mask = _prompts(hf.config.bos_token_id)
    result = probe_model(load_bridge(directory), ids, attention_mask=mask, config=CONFIG)
    captures = [_capture_gpt2(hf, ids[row, :length], 1) for row, length in enumerate(LENGTHS)]
    for row in result.heads:
        assert math.isnan(row.anchor_key_cos_rotated) and math.isnan(row.other_key_cos_rotated)
        if row.layer == 1:
            _checked(row, reference(captures, row.head, group=1, rotated=False), rotated=False)
    assert "anchor_key_cos_rotated" not in key_geometry(result).to_dataframe().columns
    figure = draw_key_geometry(result.heads, tmp_path / "geometry.png", "tiny GPT-2")
    titles = [axes.get_title() for axes in figure.axes if axes.get_title()]
    assert titles[0] == "query-key cosine" and not any("RoPE" in title for title in titles)  # no rotary stage


def test_toy_sink_head_keys_and_the_api(tmp_path):
    """Toy models go through the same probe; their planted sink head L0H0 points its queries at BOS."""
    torch.manual_seed(0)
    tokens = torch.randn(6, 8, 8)
    tokens[:, :, :2] = 0.0
    tokens[:, 1:, 7] = 1.0  # content tokens' bias coordinate
    tokens[:, 0] = 0.0
    tokens[:, 0, 0] = 1.0  # the BOS flag
    result = probe_model(toy_sink_model(), tokens, config=CONFIG)
    geometry = key_geometry(result)
    frame = geometry.to_dataframe()
    assert {"anchor_key_cos", "other_key_cos", "anchor_key_norm_ratio", "anchor_value_norm_ratio"} <= set(frame)
    sink = frame[(frame.layer == 0) & (frame["head"] == 0)].iloc[0]
    assert sink.anchor_key_cos > 0.5 > sink.other_key_cos
    assert "Key geometry" in geometry._repr_html_() and "sink heads" in geometry._repr_html_()
    plain = probe_model(toy_sink_model(), tokens, config=ProbeConfig())
    assert math.isnan(plain.heads[0].anchor_key_cos)
    with pytest.raises(InputError, match="with_key_geometry"):
        key_geometry(plain)


def test_the_running_sum_of_causal_layers_equals_the_masked_sum():
    """The two ways of summing the other keys agree on a causal mask, with padding and a
    shifted anchor (left padding)."""
    from sinkscope.interp.hooked_model import PreparedBatch
    from sinkscope.interp.visibility import key_visibility
    from sinkscope.probes.key_geometry import cosine_sums

    torch.manual_seed(0)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, :2] = False  # left padding: the anchor is position 2
    mask[2, 5:] = False  # right padding
    anchor = mask.long().argmax(dim=1)
    batch = PreparedBatch(torch.zeros(3, 7, dtype=torch.long), mask, anchor)
    q, k = torch.randn(3, 7, 4, 8), torch.randn(3, 7, 4, 8)
    queries = mask & (torch.arange(7).view(1, -1) > anchor.view(-1, 1))
    visible = key_visibility(mask)
    masked = cosine_sums(q, k, batch, queries, visible, causal_prefix=False)
    running = cosine_sums(q, k, batch, queries, visible, causal_prefix=True)
    for a, b in zip(masked, running):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    windowed = cosine_sums(q, k, batch, queries, key_visibility(mask, window=2), causal_prefix=False)
    assert not torch.allclose(windowed[1], running[1], atol=1e-3)  # a window changes the other keys
