"""Sink metrics on hand-built patterns, checked against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from sinkscope.probes.sink_metrics import (
    alpha_k,
    anchor_mass,
    is_sink_head,
    massive_activations,
    output_gram,
    projected_value_norms,
    row_entropy_sums,
    sink_rate,
    value_weighted_anchor_share_sums,
)

torch.set_num_threads(1)

# one input, two heads, three causal positions
HEAD_A = [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]
HEAD_B = [[1.0, 0.0, 0.0], [0.9, 0.1, 0.0], [0.95, 0.03, 0.02]]
PATTERN = torch.tensor([[HEAD_A, HEAD_B]])


def test_gu_alpha_k_and_sink_rate_match_hand_computation():
    alpha0 = alpha_k(PATTERN, k=0)
    assert alpha0.shape == (1, 2)
    assert alpha0[0, 0].item() == pytest.approx((1.0 + 0.5 + 0.2) / 3)
    assert alpha0[0, 1].item() == pytest.approx((1.0 + 0.9 + 0.95) / 3)
    alpha1 = alpha_k(PATTERN, k=1)
    assert alpha1[0, 0].item() == pytest.approx((0.5 + 0.3) / 2)
    assert sink_rate(alpha0, 0.3) == pytest.approx(100.0)
    assert sink_rate(alpha0, 0.8) == pytest.approx(50.0)
    assert sink_rate(alpha1, 0.3) == pytest.approx(50.0)


def test_anchor_mass_excludes_anchor_row_and_respects_query_mask():
    assert anchor_mass(PATTERN).tolist() == pytest.approx([(0.5 + 0.2) / 2, (0.9 + 0.95) / 2])
    only_last = torch.tensor([[False, False, True]])
    assert anchor_mass(PATTERN, 0, only_last).tolist() == pytest.approx([0.2, 0.95])
    assert is_sink_head(anchor_mass(PATTERN), eps=0.1).tolist() == [False, True]


def test_per_row_anchor_for_left_padding():
    # row 1 is left-padded by one position: its anchor is position 1
    padded = torch.zeros(1, 2, 4, 4)
    padded[0, :, 1:, 1:] = PATTERN[0]
    pattern = torch.cat([torch.nn.functional.pad(PATTERN, (0, 1, 0, 1)), padded])
    real = torch.tensor([[True, True, True, False], [False, True, True, True]])
    anchor = torch.tensor([0, 1])
    assert anchor_mass(pattern, anchor, real).tolist() == pytest.approx(anchor_mass(PATTERN).tolist())
    assert alpha_k(pattern, 0, anchor, real)[1].tolist() == pytest.approx(alpha_k(PATTERN)[0].tolist())


def test_value_weighted_share_by_hand():
    pattern = torch.tensor([[[[1.0, 0.0], [0.8, 0.2]]]])
    v = torch.tensor([[[[1.0]], [[3.0]]]])  # [batch, pos, head, d_head]
    w_o = torch.tensor([[[2.0, 0.0]]])  # [head, d_head, d_model]
    norms = projected_value_norms(v, output_gram(w_o))
    assert norms.tolist() == [[[2.0, 6.0]]]
    sums, counts = value_weighted_anchor_share_sums(pattern, norms)
    assert counts.tolist() == [1]
    assert sums.item() == pytest.approx(0.8 * 2 / (0.8 * 2 + 0.2 * 6))


def test_value_weighted_share_of_a_signed_pattern_uses_magnitudes():
    """A pattern with negative weights (a signed attention kind) counts |A|: the no-copy
    path for non-negative patterns must not be taken for it."""
    pattern = torch.tensor([[[[1.0, 0.0], [-0.8, 0.2]]]])
    norms = torch.tensor([[[2.0, 6.0]]])
    sums, counts = value_weighted_anchor_share_sums(pattern, norms)
    assert counts.tolist() == [1]
    assert sums.item() == pytest.approx(0.8 * 2 / (0.8 * 2 + 0.2 * 6))


def test_value_weighted_share_leaves_out_a_query_that_attends_almost_nowhere():
    """A ReLU head whose weights sum to 6e-7 writes rounding residue: a share of it (here
    0.97) would be read as the head writing the anchor's value; so does one whose weights
    sum to 5e-4 of a value (below SILENT_WRITE_FRACTION of the layer's largest); a row above
    both thresholds counts."""
    pattern = torch.tensor([[[[1.0, 0.0, 0.0], [5.8e-7, 0.2e-7, 0.0], [1.94e-3, 0.06e-3, 0.0]]]])
    norms = torch.tensor([[[1.0, 1.0, 1.0]]])
    sums, counts = value_weighted_anchor_share_sums(pattern, norms)
    assert counts.tolist() == [1]  # the third query only: 2e-3 of a value is heard
    assert sums.item() == pytest.approx(0.97)
    quiet = pattern.clone()
    quiet[0, 0, 2] = torch.tensor([4.85e-4, 0.15e-4, 0.0])  # 5e-4 >= SILENT_ROW_MASS, < 1e-3 of a value
    assert value_weighted_anchor_share_sums(quiet, norms)[1].tolist() == [0]


def test_value_weighted_share_leaves_out_a_head_that_writes_nothing_beside_its_layer():
    """A softmax head whose W_O has decayed to 1e-9 of its neighbour's attends normally but
    writes nothing: its ratio of two rounding-sized norms (here 0.976) is no share. The
    same head alone in its layer writes as much as its own values and keeps its share."""
    rows = torch.tensor([[0.976, 0.024], [0.976, 0.024]])  # query 1's rows, two heads
    pattern = torch.zeros(1, 2, 2, 2)
    pattern[0, :, 0, 0] = 1.0
    pattern[0, :, 1] = rows
    norms = torch.tensor([[[1.0, 1.0], [1e-9, 1e-9]]])  # [batch, head, key]
    sums, counts = value_weighted_anchor_share_sums(pattern, norms)
    assert counts.tolist() == [1, 0]
    assert sums[0].item() == pytest.approx(0.976)
    alone_sums, alone_counts = value_weighted_anchor_share_sums(pattern[:, 1:], norms[:, 1:])
    assert alone_counts.tolist() == [1] and alone_sums.item() == pytest.approx(0.976)


def test_value_weighted_share_agrees_with_the_elementwise_sum_on_a_random_pattern():
    generator = torch.Generator().manual_seed(0)
    pattern = torch.rand(2, 3, 7, 7, generator=generator).tril().softmax(dim=-1)
    norms = torch.rand(2, 3, 7, generator=generator)
    anchor = torch.tensor([0, 2])
    weighted = pattern * norms.unsqueeze(2)
    share = weighted[torch.arange(2), :, :, anchor] / weighted.sum(dim=-1)  # [batch, head, query]
    after = torch.arange(7).unsqueeze(0) > anchor.unsqueeze(1)  # [batch, query]: the queries after the anchor
    expected = (share * after.unsqueeze(1)).sum(dim=(0, 2))
    sums, counts = value_weighted_anchor_share_sums(pattern, norms, anchor)
    assert counts.tolist() == [int(after.sum())] * 3
    assert sums.tolist() == pytest.approx(expected.tolist(), rel=1e-6)


def test_row_entropy_normalised_by_visible_keys():
    visible = torch.tril(torch.ones(3, 3, dtype=torch.bool)).unsqueeze(0)
    sums, counts = row_entropy_sums(PATTERN, visible)
    # rows with one visible key are skipped
    assert counts.tolist() == [2, 2]
    expected_a = 1.0 + (-(0.2 * math.log(0.2) + 0.3 * math.log(0.3) + 0.5 * math.log(0.5)) / math.log(3))
    assert sums[0].item() == pytest.approx(expected_a, rel=1e-5)


def test_the_lower_median_is_torch_s_median_exactly():
    from sinkscope.probes.sink_metrics import lower_median

    generator = torch.Generator().manual_seed(0)
    for width in (1, 2, 7, 64, 1001):
        values = torch.randn(5, width, generator=generator).abs()
        assert torch.equal(lower_median(values), values.median(dim=1).values)
    doubles = torch.rand(3, 10, dtype=torch.float64, generator=generator)
    assert torch.equal(lower_median(doubles), doubles.median(dim=1).values)


def _entropy_reference(pattern, visible):
    """Row entropy over the visible keys after renormalising, / log(#visible), element by element."""
    probs = pattern.clamp_min(0) * visible.unsqueeze(1)
    mass = probs.sum(dim=-1, keepdim=True)
    probs = probs / mass.clamp_min(1e-30)
    entropy = -(probs * torch.where(probs > 0, probs.log(), 0.0)).sum(dim=-1)
    n_visible = visible.sum(dim=-1).unsqueeze(1)
    rows = (n_visible >= 2) & (mass.squeeze(-1) > 0)  # a row with no mass has no entropy
    return ((entropy / torch.log(n_visible.clamp_min(2))) * rows).sum(dim=(0, 2)), rows.sum(dim=(0, 2))


def test_row_entropy_of_masked_patterns_and_of_patterns_with_hidden_mass_match_the_definition():
    """A causal softmax pattern (zero on hidden keys: the one-temporary path), a ReLU pattern
    that does not sum to one, and a pattern with mass on hidden keys (the general path)."""
    generator = torch.Generator().manual_seed(0)
    visible = torch.ones(2, 6, 6, dtype=torch.bool).tril()
    scores = torch.randn(2, 3, 6, 6, generator=generator)
    softmax = scores.masked_fill(~visible.unsqueeze(1), -math.inf).softmax(dim=-1)
    relu = scores.relu() * visible.unsqueeze(1)
    leaky = softmax + 0.01  # mass on the hidden keys, which the entropy must not count
    for pattern in (softmax, relu, leaky):
        sums, counts = row_entropy_sums(pattern, visible)
        expected, expected_counts = _entropy_reference(pattern, visible)
        assert counts.tolist() == expected_counts.tolist()
        assert sums.tolist() == pytest.approx(expected.tolist(), rel=1e-5)


def test_massive_activations_counts_anchor_outliers():
    resid = torch.full((1, 4, 8), 0.05)
    resid[0, 0, 3] = 500.0
    resid[0, 2, 1] = 90.0
    stats = massive_activations(resid, torch.ones(1, 4, dtype=torch.bool), torch.tensor([0]))
    assert (stats.count, stats.at_anchor) == (1, 1)
    assert stats.max_abs == pytest.approx(500.0)


def test_massive_activations_use_each_prompts_own_median():
    resid = torch.full((2, 3, 4), 0.01)
    resid[1] = 1.0  # a loud prompt: its 150s are not 1000x its median
    resid[:, 1, 0] = 150.0
    resid[0, 2] = 7.0  # padding: ignored by the median and the counts
    real = torch.tensor([[True, True, False], [True, True, True]])
    stats = massive_activations(resid, real, torch.tensor([0, 0]))
    assert stats.median_abs.tolist() == pytest.approx([0.01, 1.0])  # torch.median: the lower middle value
    assert (stats.count, stats.at_anchor, stats.max_abs) == (1, 0, 150.0)


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="k=5"):
        alpha_k(PATTERN, k=5)
    with pytest.raises(ValueError, match="eps"):
        is_sink_head(torch.tensor([0.5]), eps=1.5)
    with pytest.raises(ValueError, match="at least one alpha"):
        sink_rate(torch.tensor([float("nan")]))


def test_head_output_norms_match_the_explicit_projection():
    """The Gram-matrix shortcut equals ||x_h W_O[h]|| computed the long way."""
    from sinkscope.probes.sink_metrics import head_output_norms

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 4, 8, generator=generator, dtype=torch.float64)
    w_o = torch.randn(4, 8, 32, generator=generator, dtype=torch.float64)
    explicit = torch.einsum("bphd,hdm->bphm", x, w_o).norm(dim=-1)
    assert torch.allclose(head_output_norms(x, output_gram(w_o)), explicit, rtol=1e-10)
    x32, w32 = x.float(), w_o.float()
    assert torch.allclose(head_output_norms(x32, output_gram(w32)), explicit.float(), rtol=1e-4)


def test_massive_activations_without_padding_match_the_per_prompt_median():
    """The batched median (no padding) equals each prompt's own median taken row by row."""
    generator = torch.Generator().manual_seed(1)
    resid = torch.randn(3, 5, 8, generator=generator)
    resid[1, 2, 3] = 5000.0
    real = torch.ones(3, 5, dtype=torch.bool)
    stats = massive_activations(resid, real, torch.zeros(3, dtype=torch.long))
    assert stats.median_abs.tolist() == [float(resid[row].abs().median()) for row in range(3)]
    assert (stats.count, stats.max_abs) == (1, 5000.0)
    padded = real.clone()
    padded[0, 4] = False  # the row-by-row path: row 0's median over its 4 real tokens only
    assert float(massive_activations(resid, padded, torch.zeros(3, dtype=torch.long)).median_abs[0]) == float(
        resid[0, :4].abs().median()
    )


def test_alpha_of_a_row_whose_only_query_is_the_anchor_is_not_measured():
    pattern = torch.tensor([[[[1.0, 0.0], [0.6, 0.4]]], [[[1.0, 0.0], [0.0, 0.0]]]])  # [batch 2, head 1, 2, 2]
    real = torch.tensor([[True, True], [True, False]])  # the second row has one token
    alpha = alpha_k(pattern, 0, 0, real)
    assert alpha[0, 0].item() == pytest.approx(0.8)
    assert math.isnan(alpha[1, 0].item())
