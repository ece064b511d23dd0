"""Sink-head classes and the random-key null against numbers written out from transformers'
eager attention on the same weights: a tiny GPT-2 with a BOS sink planted in L1H0 (a
broadcast head: it writes BOS's value to every query), the same with the sink in L0H0 and
BOS's value projected out of that head (a no-op head), and the null's 99th percentile."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pandas
import pytest
import torch

from sinkscope.infra.codec import read_result, write_result
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.probes.head_classes import BROADCAST_STABLE_RANK, NO_OP_RATIO, head_class, random_keys
from sinkscope.probes.probe import ProbeConfig, ProbeResult
from sinkscope.probes.report_sections import sink_rules_phrase
from sinkscope.probes.runner import probe_model
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2, load_bridge, load_hf_model

torch.set_num_threads(1)

PROMPTS = TINY_GPT2_PROMPTS + ["Softmax rows sum to one.", "The lazy dog sleeps."]
CONFIG = ProbeConfig(batch_size=2, random_key_seed=3)


def direct(hf, batch) -> dict[str, torch.Tensor]:
    """Per head, from transformers' eager attention (right padding, anchor = position 0):
    the attention patterns, each head's values v_j W_O[h] and outputs z_i W_O[h]."""
    width, n_heads = hf.config.n_embd, hf.config.n_head
    d_head = width // n_heads
    values = {}
    hooks = [
        block.attn.c_attn.register_forward_hook(
            lambda module, args, out, layer=layer: values.__setitem__(layer, out[..., 2 * width :].detach())
        )
        for layer, block in enumerate(hf.transformer.h)
    ]
    with torch.no_grad():
        out = hf(batch.model_input, attention_mask=batch.attention_mask.long(), output_attentions=True)
    for hook in hooks:
        hook.remove()
    projected, outputs = [], []
    for layer, pattern in enumerate(out.attentions):
        v = values[layer].double().view(*values[layer].shape[:2], n_heads, d_head)  # [batch, pos, head, d]
        W_O = hf.transformer.h[layer].attn.c_proj.weight.detach().double().view(n_heads, d_head, width)
        projected.append(torch.einsum("bphd,hdm->bhpm", v, W_O))
        z = torch.einsum("bhqk,bkhd->bqhd", pattern.double(), v)
        outputs.append(torch.einsum("bqhd,hdm->bhqm", z, W_O))
    return {"patterns": out.attentions, "projected": projected, "outputs": outputs}


def expected_class_numbers(reference, mask, layer: int, head: int) -> tuple[float, float]:
    """(||v_a W_O|| over the lower median of the other real tokens', averaged over prompts;
    ||M||_F^2 / ||M||_2^2 of the head's outputs at every real query after the anchor)."""
    ratios, rows = [], []
    for row in range(mask.shape[0]):
        real = mask[row].nonzero().flatten().tolist()
        norms = reference["projected"][layer][row, head].norm(dim=-1)
        others = sorted(float(norms[j]) for j in real[1:])
        ratios.append(float(norms[real[0]]) / others[(len(others) - 1) // 2])
        rows.extend(reference["outputs"][layer][row, head, i] for i in real[1:])
    M = torch.stack(rows)
    stable = float(torch.linalg.matrix_norm(M) ** 2 / torch.linalg.matrix_norm(M, ord=2) ** 2)
    return float(np.mean(ratios)), stable


def probed(directory):
    hooked = HookedModel(load_bridge(directory))
    batch = hooked.prepare(PROMPTS, padding_side="right")
    assert batch.anchor.tolist() == [0] * len(PROMPTS)
    return probe_model(hooked, PROMPTS, config=CONFIG), direct(load_hf_model(directory), batch), batch


def test_a_planted_bos_sink_is_a_broadcast_head_with_both_numbers_as_transformers_gives_them(tmp_path):
    result, reference, batch = probed(build_tiny_gpt2(tmp_path / "g", bos_sink_head=(1, 0)))
    assert result.sink_heads() == [(1, 0)]
    sink = next(row for row in result.heads if row.is_sink_head)
    ratio, stable = expected_class_numbers(reference, batch.attention_mask, 1, 0)
    assert sink.anchor_projected_value_norm_ratio == pytest.approx(ratio, rel=1e-4)
    assert sink.update_stable_rank == pytest.approx(stable, rel=1e-4)
    assert sink.anchor_projected_value_norm_ratio >= NO_OP_RATIO and sink.update_stable_rank < BROADCAST_STABLE_RANK
    assert sink.sink_class == "broadcast"
    for row in result.heads:  # the class and its numbers are a sink head's only
        if not row.is_sink_head:
            assert row.sink_class is None and math.isnan(row.update_stable_rank)
            assert math.isnan(row.anchor_projected_value_norm_ratio)
    frame = result.to_dataframe().set_index(["layer", "head"])
    assert frame.loc[(1, 0), "sink_class"] == "broadcast" and pandas.isna(frame.loc[(0, 1), "sink_class"])
    csv = result.heads_csv("tiny").splitlines()
    assert "sink_class" in csv[0] and "update_stable_rank" in csv[0]


def test_a_sink_head_whose_anchor_value_is_projected_out_is_a_no_op_head(tmp_path):
    directory = build_tiny_gpt2(tmp_path / "g", bos_sink_head=(0, 0))
    hf = load_hf_model(directory)
    width, d_head = hf.config.n_embd, hf.config.n_embd // hf.config.n_head
    bos = hf.get_input_embeddings().weight[hf.config.bos_token_id].detach().clone()
    with torch.no_grad():
        hf.transformer.wpe.weight[0] = 0.0  # BOS's residual is u itself, and LN(u) = u at initialisation
        c_attn = hf.transformer.h[0].attn.c_attn
        cols = slice(2 * width, 2 * width + d_head)  # head 0's value
        W_v = c_attn.weight[:, cols]
        c_attn.weight[:, cols] = W_v - torch.outer(bos, bos @ W_v) / bos.dot(bos)
        c_attn.bias[cols] = 0.0
    hf.save_pretrained(tmp_path / "noop")
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(directory)).save_pretrained(tmp_path / "noop")
    result, reference, batch = probed(tmp_path / "noop")
    sink = next(row for row in result.heads if (row.layer, row.head) == (0, 0))
    assert sink.is_sink_head
    ratio, stable = expected_class_numbers(reference, batch.attention_mask, 0, 0)
    assert ratio < 1e-3
    assert sink.anchor_projected_value_norm_ratio == pytest.approx(ratio, abs=1e-5)
    assert sink.update_stable_rank == pytest.approx(stable, rel=1e-3)
    assert sink.sink_class == "no-op"


def test_the_random_key_null_and_its_99th_percentile_match_transformers_eager_attention(tmp_path):
    result, reference, batch = probed(build_tiny_gpt2(tmp_path / "g", bos_sink_head=(1, 0)))
    mask = batch.attention_mask
    # one draw per prompt from a hash of the seed and its own real tokens, rank 1 + floor(u (n - 2))
    draws = []
    for row in range(len(PROMPTS)):
        ids = batch.model_input[row][mask[row]].numpy().tobytes()
        digest = hashlib.blake2b(ids, digest_size=8, key=(3).to_bytes(8, "little")).digest()
        draws.append(int.from_bytes(digest, "little") / 2.0**64)
    keys = [1 + math.floor(u * (int(mask[row].sum()) - 2)) for row, u in enumerate(draws)]
    assert random_keys(mask, torch.tensor(draws, dtype=torch.float64))[0].tolist() == keys
    assert len(set(keys)) > 1  # not one position for every prompt
    n_heads = result.model.n_heads
    masses = torch.zeros(result.model.n_layers, n_heads, len(PROMPTS), dtype=torch.float64)
    for layer, pattern in enumerate(reference["patterns"]):
        for row, key in enumerate(keys):
            queries = [i for i in range(mask.shape[1]) if mask[row, i] and i > key]
            masses[layer, :, row] = pattern[row, :, queries, key].double().mean(dim=-1)
    p99 = float(np.percentile(masses.flatten().numpy(), 99))
    assert result.random_key_p99 == pytest.approx(p99, abs=1e-6)
    torch.testing.assert_close(result.matrix("random_key_mass"), masses.mean(dim=-1), atol=1e-6, rtol=0)
    for row in result.heads:
        assert row.above_random_key_p99 == (row.anchor_mass > p99)
    phrase = sink_rules_phrase(result)
    n_null = sum(row.anchor_mass > p99 for row in result.heads)
    assert phrase is not None and f"{n_null} pass the random-key null" in phrase
    assert "1 of 4 heads pass the fixed rule" in phrase and "1 broadcast" in phrase


def test_new_fields_persist_and_a_file_without_them_reads_as_not_measured(tmp_path):
    result = probe_model(HookedModel(load_bridge(build_tiny_gpt2(tmp_path / "g", bos_sink_head=(1, 0)))), PROMPTS)
    write_result(tmp_path / "probe.json", result)
    again = read_result(tmp_path / "probe.json", ProbeResult)
    flags = [(row.sink_class, row.above_random_key_p99) for row in result.heads]
    assert [(row.sink_class, row.above_random_key_p99) for row in again.heads] == flags
    for name in ("anchor_projected_value_norm_ratio", "update_stable_rank", "random_key_mass"):
        torch.testing.assert_close(again.matrix(name), result.matrix(name), equal_nan=True)
    assert again.random_key_p99 == pytest.approx(result.random_key_p99)
    data = json.loads((tmp_path / "probe.json").read_text())
    data.pop("random_key_p99")
    for row in data["heads"]:
        for name in ("sink_class", "update_stable_rank", "random_key_mass", "above_random_key_p99"):
            row.pop(name, None)
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = read_result(tmp_path / "old.json", ProbeResult)
    assert math.isnan(old.random_key_p99) and all(row.sink_class is None for row in old.heads)
    assert sink_rules_phrase(old) is None


def test_the_class_rule():
    assert head_class(0.1, 5.0) == "no-op"
    assert head_class(0.5, 1.2) == "broadcast"
    assert head_class(0.5, 2.0) == "other"
    assert head_class(math.nan, 1.0) is None
