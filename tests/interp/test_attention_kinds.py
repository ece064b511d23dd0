"""Attention kinds against their formulas, masking, and gradient flow."""

from __future__ import annotations

import math

import pytest
import torch

from sinkscope.infra.errors import InputError
from sinkscope.interp.attention_kinds import (
    ATTENTION_KINDS,
    LEARNED_NULL_KINDS,
    NORMALISED_KINDS,
    SOFTPICK_EPS,
    causal_mask,
    fixed_row_scale,
    score_scale,
    scores_to_pattern,
    validate_attention_kind,
)
from sinkscope.toy.model import ToyModelConfig, ToyTransformer
from sinkscope.toy.task import TaskConfig, sample_batch

B, H, P = 3, 2, 6
# kinds whose rows are a function of the scores alone (the others need learned weights)
SCORE_KINDS = tuple(kind for kind in ATTENTION_KINDS if kind not in LEARNED_NULL_KINDS)


def _masked_scores(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    raw = torch.randn(B, H, P, P, generator=generator) * 3
    visible = causal_mask(P, P)
    return raw.masked_fill(~visible, float("-inf")), visible


def _by_formula(kind: str, scores: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Entry-by-entry reference in float64 with explicit loops."""
    out = torch.zeros(scores.shape, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(P):
                row = [float(scores[b, h, i, k]) for k in range(i + 1)]
                for k in range(i + 1):
                    s = row[k]
                    if kind in NORMALISED_KINDS:  # softmax; the gated kinds gate after it
                        top = max(row)
                        value = math.exp(s - top) / sum(math.exp(r - top) for r in row)
                    elif kind == "softmax1":  # a null logit of 0 beside the keys
                        value = math.exp(s) / (1.0 + sum(math.exp(r) for r in row))
                    elif kind == "softpick":
                        value = max(math.exp(s) - 1.0, 0.0) / (sum(abs(math.exp(r) - 1.0) for r in row) + SOFTPICK_EPS)
                    elif kind == "relu":
                        value = max(s, 0.0) / max(i, 1)
                    elif kind == "relu_prefix":
                        value = max(s, 0.0) / (i + 1)
                    else:  # sigmoid
                        value = 1.0 / (1.0 + math.exp(-(s - math.log(i + 1))))
                    out[b, h, i, k] = value
    return out


def test_causal_mask():
    mask = causal_mask(4, 4)
    assert mask.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
        [True, True, True, True],
    ]
    # queries as the last positions of a longer key sequence
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]


@pytest.mark.parametrize("kind", SCORE_KINDS)
def test_kind_matches_formula(kind):
    scores, visible = _masked_scores()
    pattern = scores_to_pattern(kind, scores)
    assert pattern.shape == scores.shape
    torch.testing.assert_close(pattern.double(), _by_formula(kind, scores, visible), atol=1e-6, rtol=1e-5)
    # masked entries are exactly zero (not tiny), visible ones finite
    assert torch.all(pattern[..., ~visible] == 0)
    assert torch.isfinite(pattern).all()
    # the cached row scale gives the same result
    cached = scores_to_pattern(kind, scores, fixed_row_scale(kind, P))
    assert torch.equal(pattern, cached)


@pytest.mark.parametrize("kind", LEARNED_NULL_KINDS)
def test_a_kind_with_learned_null_weights_has_no_rule_from_scores_alone(kind):
    scores, _ = _masked_scores()
    with pytest.raises(InputError, match="use softmax_with_null"):
        scores_to_pattern(kind, scores)


def test_only_the_normalised_kinds_give_rows_that_sum_to_one():
    scores, _ = _masked_scores(1)
    sums = {kind: scores_to_pattern(kind, scores).sum(-1) for kind in SCORE_KINDS}
    for kind in NORMALISED_KINDS:
        torch.testing.assert_close(sums[kind], torch.ones(B, H, P))
    for kind in set(SCORE_KINDS) - set(NORMALISED_KINDS):
        assert not torch.allclose(sums[kind], torch.ones(B, H, P), atol=1e-2), kind


def test_relu_scales_differ_exactly_as_documented():
    # all-ones scores: relu rows give i / max(i, 1) (1 for i >= 1, and 1 at i = 0);
    # relu_prefix rows give (i + 1) / (i + 1) = 1; an entry is 1/max(i,1) vs 1/(i+1)
    ones = torch.ones(1, 1, P, P).masked_fill(~causal_mask(P, P), float("-inf"))
    relu, prefix = scores_to_pattern("relu", ones), scores_to_pattern("relu_prefix", ones)
    for i in range(P):
        assert relu[0, 0, i, 0] == pytest.approx(1 / max(i, 1))
        assert prefix[0, 0, i, 0] == pytest.approx(1 / (i + 1))
    assert fixed_row_scale("softmax", P) is None


def test_negative_scores_give_no_relu_attention():
    scores = -torch.rand(1, 1, P, P) - 0.1
    scores = scores.masked_fill(~causal_mask(P, P), float("-inf"))
    assert torch.all(scores_to_pattern("relu", scores) == 0)
    assert torch.all(scores_to_pattern("relu_prefix", scores) == 0)


def test_score_scale():
    assert score_scale(16, scaled=False) == 1.0
    assert score_scale(16, scaled=True) == pytest.approx(0.25)


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown attention kind 'linear'; choose one of softmax"):
        validate_attention_kind("linear")
    with pytest.raises(ValueError, match="unknown attention kind"):
        scores_to_pattern("linear", torch.zeros(1, 1, 2, 2))
    with pytest.raises(ValueError, match="unknown attention kind"):
        ToyModelConfig(attention="linear")


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_gradients_flow_through_every_kind(kind):
    torch.manual_seed(0)
    config = ToyModelConfig(n_layers=2, n_heads=2, d_model=8, seq_len=8, attention=kind, init_std=0.3)
    model = ToyTransformer(config)
    task = TaskConfig(d_model=8, seq_len=8, eval_trigger_position=5)
    batch = sample_batch(task, 16, torch.Generator().manual_seed(0), config.target)
    loss = (model(batch.tokens) - batch.targets).pow(2).mean()
    loss.backward()
    for layer in range(2):
        attn = model.blocks[layer].attn
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            grad = getattr(attn, name).grad
            assert grad is not None and torch.isfinite(grad).all(), (layer, name)
            assert grad.abs().max() > 0, (layer, name)
