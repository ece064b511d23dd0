"""Attention kinds: how a head turns causal scores into attention weights.

Every kind maps scores ``[batch, head, query, key]`` (already causally masked with
``-inf`` above the diagonal) to weights of the same shape. Only ``softmax`` normalises
rows; the others apply a fixed, input-independent scale, so their rows need not sum
to one. That difference is exactly what the toy experiments are about.

Kinds:
- ``softmax``: softmax over visible keys.
- ``relu``: relu(S_ik) / max(i, 1) for 0-indexed query i (Ran-Milo 2026: divide by the
  number of visible non-BOS keys).
- ``relu_prefix``: relu(S_ik) / (i + 1) (Guo et al. 2024: divide by visible keys).
- ``sigmoid``: sigmoid(S_ik - log(i + 1)), no normalisation (Gu et al.'s sigmoid
  attention; the bias uses the number of visible keys of each causal row).

The mitigation kinds (docs/toy-task.md has each formula): ``softmax1``, ``learned_sink``,
``kv_bias`` and ``kv_bias_zero_value`` are a softmax with one more logit that no token
holds (0, a learned per-head logit, or q . k' of a learned key), so a row over real keys
sums to less than one and the rest is the null's (``softmax_with_null``); ``softpick``
rectifies e^s - 1 (``softpick``); ``gated_head``, ``gated_element`` and ``value_gated``
keep softmax rows and gate the head's output or each key's value (``toy/attention.py``).
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
from jaxtyping import Float

from sinkscope.infra.errors import InputError

AttentionKind = Literal[
    "softmax",
    "relu",
    "relu_prefix",
    "sigmoid",
    "softmax1",
    "learned_sink",
    "kv_bias",
    "kv_bias_zero_value",
    "softpick",
    "gated_head",
    "gated_element",
    "value_gated",
]
ATTENTION_KINDS: tuple[str, ...] = get_args(AttentionKind)
# rows sum to one over the visible keys
NORMALISED_KINDS: tuple[str, ...] = ("softmax", "gated_head", "gated_element", "value_gated")
# a softmax with one more logit that no token holds: 1 - row sum is the null's share, and
# masking a key rescales the rest as the softmax would, the null's share included
NULL_SLOT_KINDS: tuple[str, ...] = ("softmax1", "learned_sink", "kv_bias", "kv_bias_zero_value")
# rows sum to at most one, the rest going to no token: the null mass is 1 - row sum
NULL_KINDS: tuple[str, ...] = (*NULL_SLOT_KINDS, "softpick")
GATED_KINDS: tuple[str, ...] = ("gated_head", "gated_element", "value_gated")
# the kinds whose rows need more than the scores (learned logits or keys): formed in the layer
LEARNED_NULL_KINDS: tuple[str, ...] = ("learned_sink", "kv_bias", "kv_bias_zero_value")
SOFTPICK_EPS = 1e-6


def validate_attention_kind(kind: str, field: str = "attention") -> str:
    """``kind`` when it is one of ``ATTENTION_KINDS``; else an InputError naming the setting
    ``field`` (so the command line names its flag)."""
    if kind not in ATTENTION_KINDS:
        raise InputError(f"unknown attention kind {kind!r}; choose one of {', '.join(ATTENTION_KINDS)}", field=field)
    return kind


def causal_mask(n_query: int, n_key: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean ``[query, key]`` mask, True where the key is visible (key <= query).

    Queries are the last ``n_query`` positions of ``n_key`` (no KV cache in this project
    means the two are equal, but the offset keeps the helper honest).
    """
    offset = n_key - n_query
    query_pos = torch.arange(n_query, device=device).unsqueeze(1) + offset
    key_pos = torch.arange(n_key, device=device).unsqueeze(0)
    return key_pos <= query_pos


def fixed_row_scale(kind: str, n_query: int, device: torch.device | str | None = None) -> torch.Tensor | None:
    """The per-query constant a non-normalised kind uses, shape ``[query, 1]``.

    ``relu``: 1 / max(i, 1); ``relu_prefix``: 1 / (i + 1); ``sigmoid``: the additive
    bias -log(i + 1). ``softmax`` has none (returns None).
    """
    query_pos = torch.arange(n_query, device=device, dtype=torch.float32).unsqueeze(1)
    if kind == "relu":
        return 1.0 / query_pos.clamp(min=1.0)
    if kind == "relu_prefix":
        return 1.0 / (query_pos + 1.0)
    if kind == "sigmoid":
        return -torch.log(query_pos + 1.0)
    return None


def scores_to_pattern(kind: str, scores: torch.Tensor, row_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Turn masked scores ``[..., query, key]`` into attention weights of one kind.

    ``row_scale`` is ``fixed_row_scale(kind, n_query)``; pass it to avoid rebuilding it on
    every call (the models cache it). Masked entries (``-inf``) come out exactly 0. Any
    layout whose last axis is the key works when ``row_scale`` is shaped to broadcast
    along its query axis (``HookedAttention`` uses ``[batch, query, head, key]`` with a
    ``[query, 1, 1]`` scale).
    """
    if kind in NORMALISED_KINDS:
        return torch.softmax(scores, dim=-1)
    if kind == "softmax1":
        return softmax_with_null(scores, torch.zeros((), dtype=scores.dtype, device=scores.device))[0]
    if kind == "softpick":
        return softpick(scores)
    if kind in LEARNED_NULL_KINDS:
        raise InputError(f"attention kind {kind!r} forms its rows from learned weights; use softmax_with_null")
    validate_attention_kind(kind)  # before building a scale: an unknown kind has none
    scale = fixed_row_scale(kind, scores.shape[-2], scores.device) if row_scale is None else row_scale
    assert scale is not None  # every kind but softmax has a fixed row scale
    row_scale = scale.to(scores.dtype)
    if kind == "relu" or kind == "relu_prefix":
        return torch.relu(scores) * row_scale
    if kind == "sigmoid":
        return torch.sigmoid(scores + row_scale)
    raise NotImplementedError(f"attention kind {kind!r} is listed but has no pattern rule")


def score_scale(d_head: int, scaled: bool) -> float:
    """The factor on Q K^T: 1 (the paper's toy models) or 1/sqrt(d_head) (standard)."""
    return 1.0 / math.sqrt(d_head) if scaled else 1.0


def softmax_with_null(
    scores: Float[torch.Tensor, "*batch query key"], null_logit: Float[torch.Tensor, ...]
) -> tuple[Float[torch.Tensor, "*batch query key"], Float[torch.Tensor, "*batch query"]]:
    """A softmax over the visible keys and one more logit ``null_logit`` that no token holds
    (broadcast to ``[*batch, query]``): the weights on the keys, and the null's weight.
    Shifted by the row's largest logit, the null's included, so neither overflows."""
    null = null_logit.expand(scores.shape[:-1]).unsqueeze(-1)
    shift = torch.maximum(scores.amax(dim=-1, keepdim=True), null).detach()
    on_keys, on_null = torch.exp(scores - shift), torch.exp(null - shift)
    total = on_keys.sum(dim=-1, keepdim=True) + on_null
    return on_keys / total, (on_null / total).squeeze(-1)


def softpick(scores: Float[torch.Tensor, "*batch query key"]) -> Float[torch.Tensor, "*batch query key"]:
    """ReLU(e^s - 1) / (sum over visible keys of |e^s - 1| + eps), multiplied through by
    e^-m with m = max(0, the row's largest score): the same value, and no exp overflows.
    Hidden keys (score -inf) count in neither sum: e^-inf - 1 would add one to the
    denominator per hidden key."""
    visible = torch.isfinite(scores)
    shift = scores.amax(dim=-1, keepdim=True).clamp_min(0.0).detach()
    shifted_one = torch.exp(-shift)
    excess = torch.where(visible, torch.exp(scores - shift) - shifted_one, torch.zeros_like(scores))
    total = excess.abs().sum(dim=-1, keepdim=True) + SOFTPICK_EPS * shifted_one
    return torch.relu(excess) / total
