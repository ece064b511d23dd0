"""A hooked multi-head attention layer with a pluggable attention kind.

The math is the paper's (no biases, optional 1/sqrt(d_head)); the hook names are
TransformerLens's, so a layer placed at ``blocks.{l}.attn`` exposes
``blocks.{l}.attn.hook_q|hook_k|hook_v|hook_attn_scores|hook_pattern|hook_z``.
Weights use TransformerLens's layout: ``W_Q/W_K/W_V [head, d_model, d_head]`` and
``W_O [head, d_head, d_model]``.

Two evaluation orders of the same math, chosen per call:
- per head (``_forward_per_head``): q, k, v and z are materialised and fire their hooks;
- by circuits (``_forward_circuits``): the QK circuit ``W_Q W_K^T`` and the OV circuit
  ``W_V W_O`` (TransformerLens's names) are formed first, so q, k, v and z never exist.
  On the paper's full-width heads this is fewer FLOPs and no head-axis transposes, so a
  training step runs faster (the "circuits speedup" column of benchmarks/RESULTS.md).
The circuit order runs whenever nothing listens to ``hook_q/k/v/z`` and heads are at
least as wide as the residual stream (narrower heads make the circuits the bigger
product); ``hook_attn_scores`` and ``hook_pattern`` fire in both, with the same values
to float rounding.

The mitigation kinds (docs/toy-task.md): ``gated_element`` and ``value_gated`` gate inside a
head (per output element, or each key's value) and run per head only; the others also run
by circuits (a bias slot's logit as x (W_Q k'), a head's gate scaling its row, v' W_O added
with the null's weight). ``hook_null`` fires in the per-head order only, which runs whenever
something listens to it. The mitigation kinds add weights after the four above,
so the paper's kinds draw the same initial weights as before: ``sinks [head]``
(``learned_sink``), ``null_key [head, d_head]`` and ``null_value [head, d_head]``
(``kv_bias``; ``kv_bias_zero_value`` has no value), ``W_gate`` (``gated_head``:
``[head, d_model]``; ``gated_element`` and ``value_gated``: ``[head, d_model, d_head]``).
Their extra hooks: ``hook_null`` (``[batch, head, query]``, 1 - the row's sum over real
keys, read after ``hook_pattern`` so a pattern edit moves the null with it; ``kv_bias``
writes that weight times v') and ``hook_gate`` (the gate values).
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import nn
from transformer_lens.hook_points import HookPoint

from sinkscope.interp.attention_kinds import (
    GATED_KINDS,
    LEARNED_NULL_KINDS,
    NULL_KINDS,
    causal_mask,
    fixed_row_scale,
    score_scale,
    scores_to_pattern,
    softmax_with_null,
    validate_attention_kind,
)

# a gate per output element, or on each key's value, acts inside the head: no circuit order
PER_HEAD_ONLY_KINDS: tuple[str, ...] = ("gated_element", "value_gated")


class HookedAttention(nn.Module):
    """Causal multi-head attention: ``x [batch, pos, d_model] -> [batch, pos, d_model]``."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_head: int,
        attention: str = "softmax",
        scale_scores: bool = False,
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        self.attention = validate_attention_kind(attention)
        self.n_heads = n_heads
        self.d_head = d_head
        self.d_model = d_model
        self.scale = score_scale(d_head, scale_scores)
        self.W_Q = nn.Parameter(torch.randn(n_heads, d_model, d_head) * init_std)
        self.W_K = nn.Parameter(torch.randn(n_heads, d_model, d_head) * init_std)
        self.W_V = nn.Parameter(torch.randn(n_heads, d_model, d_head) * init_std)
        self.W_O = nn.Parameter(torch.randn(n_heads, d_head, d_model) * init_std)
        if attention == "learned_sink":
            self.sinks = nn.Parameter(torch.zeros(n_heads))
        if attention in ("kv_bias", "kv_bias_zero_value"):
            self.null_key = nn.Parameter(torch.randn(n_heads, d_head) * init_std)
        if attention == "kv_bias":
            self.null_value = nn.Parameter(torch.randn(n_heads, d_head) * init_std)
        if attention == "gated_head":
            self.W_gate = nn.Parameter(torch.randn(n_heads, d_model) * init_std)
        elif attention in GATED_KINDS:
            self.W_gate = nn.Parameter(torch.randn(n_heads, d_model, d_head) * init_std)
        self.hook_q = HookPoint()
        self.hook_k = HookPoint()
        self.hook_v = HookPoint()
        self.hook_attn_scores = HookPoint()
        self.hook_pattern = HookPoint()
        self.hook_z = HookPoint()
        self.hook_null = HookPoint()
        self.hook_gate = HookPoint()
        self._mask_cache: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor | None]] = {}
        self._bias_cache: dict[tuple[int, str, torch.dtype], torch.Tensor] = {}

    def _mask_and_scale(self, n_pos: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        key = (n_pos, str(device))
        if key not in self._mask_cache:
            self._mask_cache[key] = (
                ~causal_mask(n_pos, n_pos, device),
                fixed_row_scale(self.attention, n_pos, device),
            )
        return self._mask_cache[key]

    def _causal_bias(self, n_pos: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """``[query, head, key]``: 0 where visible, -inf above the diagonal.

        Added rather than ``masked_fill``-ed: the sum's backward is the identity, the
        fill's is a second masked copy of the gradient. Materialised over heads because
        a broadcast over the middle axis makes the add 4.6x slower on CPU.
        """
        key = (n_pos, str(device), dtype)
        if key not in self._bias_cache:
            hidden = ~causal_mask(n_pos, n_pos, device)
            bias = torch.zeros(n_pos, n_pos, device=device, dtype=dtype).masked_fill(hidden, float("-inf"))
            self._bias_cache[key] = bias.unsqueeze(1).expand(n_pos, self.n_heads, n_pos).contiguous()
        return self._bias_cache[key]

    def _project(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``x [batch, pos, d_model]`` times ``weight [head, d_model, d_head]`` -> ``[batch, pos, head, d_head]``.

        One flat matmul instead of an einsum: the toy models are tiny, so per-op
        overhead, not FLOPs, sets the training speed.
        """
        flat = weight.permute(1, 0, 2).reshape(self.d_model, self.n_heads * self.d_head)
        return (x @ flat).view(*x.shape[:-1], self.n_heads, self.d_head)

    def _circuits_apply(self) -> bool:
        """True when the circuit order gives every hook that something listens to."""
        if self.d_head < self.d_model or self.attention in PER_HEAD_ONLY_KINDS:
            return False
        if self.attention in NULL_KINDS and _listened(self.hook_null):
            return False
        return not any(_listened(hook) for hook in (self.hook_q, self.hook_k, self.hook_v, self.hook_z))

    def forward(self, x: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_model"]:
        if self._circuits_apply():
            return self._forward_circuits(x)
        return self._forward_per_head(x)

    def _forward_per_head(self, x: torch.Tensor) -> torch.Tensor:
        n_pos = x.shape[-2]
        hidden_mask, row_scale = self._mask_and_scale(n_pos, x.device)
        q = self.hook_q(self._project(x, self.W_Q))
        k = self.hook_k(self._project(x, self.W_K))
        v = self.hook_v(self._project(x, self.W_V))
        if self.attention == "value_gated":  # each key's value gated by that key's own input
            v = v * self.hook_gate(torch.sigmoid(self._project(x, self.W_gate)))
        # [batch, head, query, key]
        scores = q.transpose(1, 2) @ k.permute(0, 2, 3, 1)
        if self.scale != 1.0:
            scores = scores * self.scale
        scores = self.hook_attn_scores(scores.masked_fill(hidden_mask, float("-inf")))
        if self.attention in LEARNED_NULL_KINDS:
            pattern = self.hook_pattern(softmax_with_null(scores, self._null_logit(q))[0])
        else:
            pattern = self.hook_pattern(scores_to_pattern(self.attention, scores, row_scale))
        # [batch, pos, head, d_head]
        z = (pattern @ v.transpose(1, 2)).transpose(1, 2)
        if self.attention in NULL_KINDS:
            null = self.hook_null(1.0 - pattern.sum(dim=-1))  # [batch, head, query]
            if self.attention == "kv_bias":
                z = z + null.transpose(1, 2).unsqueeze(-1) * self.null_value
        if self.attention == "gated_head":
            z = z * self.hook_gate(torch.sigmoid(x @ self.W_gate.T)).unsqueeze(-1)
        elif self.attention == "gated_element":
            z = z * self.hook_gate(torch.sigmoid(self._project(x, self.W_gate)))
        z = self.hook_z(z)
        w_o = self.W_O.reshape(self.n_heads * self.d_head, self.d_model)
        return z.reshape(*z.shape[:-2], self.n_heads * self.d_head) @ w_o

    def _null_logit(self, q: Float[torch.Tensor, "batch pos head d_head"]) -> Float[torch.Tensor, "batch head pos"]:
        """The null's logit per row: the learned sink ``sinks[h]``, or q_i . k'_h."""
        if self.attention == "learned_sink":
            return self.sinks.view(1, -1, 1).expand(q.shape[0], -1, q.shape[1])
        logit = (q * self.null_key).sum(dim=-1).transpose(1, 2)
        return logit * self.scale if self.scale != 1.0 else logit

    def _forward_circuits(self, x: torch.Tensor) -> torch.Tensor:
        """Same output as ``_forward_per_head``, evaluated as
        ``sum_h pattern_h (x W_OV_h)`` with ``scores_h = (x W_QK_h) x^T``."""
        *batch_shape, n_pos, d_model = x.shape
        x = x.reshape(-1, n_pos, d_model)
        n_batch, n_heads = x.shape[0], self.n_heads
        _, row_scale = self._mask_and_scale(n_pos, x.device)
        # [d_model, head * d_model]: column block h is W_Q[h] W_K[h]^T (resp. W_V[h] W_O[h])
        w_qk = (self.W_Q @ self.W_K.transpose(1, 2)).permute(1, 0, 2).reshape(d_model, n_heads * d_model)
        if self.scale != 1.0:
            w_qk = w_qk * self.scale
        w_ov = (self.W_V @ self.W_O).permute(1, 0, 2).reshape(d_model, n_heads * d_model)
        # (x W_QK) viewed as [batch, query * head, d_model] times x^T: scores laid out
        # [batch, query, head, key], so one batched matmul covers every head
        scores = ((x @ w_qk).view(n_batch, n_pos * n_heads, d_model) @ x.transpose(1, 2)).view(
            n_batch, n_pos, n_heads, n_pos
        )
        # out of place: an in-place add on the matmul's view makes autograd copy it back
        scores = scores + self._causal_bias(n_pos, x.device, scores.dtype)
        # Hooks see the usual [batch, head, query, key] (a transposed view); the math stays
        # in [batch, query, head, key], where the pattern flattens to [batch, query,
        # head * key] without a copy. With no hook, the two transposes cancel.
        scores = self.hook_attn_scores(scores.transpose(1, 2)).transpose(1, 2)
        if self.attention in LEARNED_NULL_KINDS:
            pattern = softmax_with_null(scores, self._null_logit_by_query(x))[0]
        else:
            pattern = scores_to_pattern(self.attention, scores, None if row_scale is None else row_scale.unsqueeze(-1))
        pattern = self.hook_pattern(pattern.transpose(1, 2)).transpose(1, 2)
        # [batch, head * key, d_model]: x W_OV per head, matching the pattern's flattening
        values = (
            (x @ w_ov).view(n_batch, n_pos, n_heads, d_model).transpose(1, 2).reshape(n_batch, n_heads * n_pos, d_model)
        )
        weights = pattern
        if self.attention == "gated_head":  # a head's gate scales its whole row: sum_h g_h pattern_h (x W_OV_h)
            weights = pattern * self.hook_gate(torch.sigmoid(x @ self.W_gate.T)).unsqueeze(-1)
        out = weights.reshape(n_batch, n_pos, n_heads * n_pos) @ values
        if self.attention == "kv_bias":  # the null's weight (1 - row sum) times v' W_O, per head
            out = out + (1.0 - pattern.sum(dim=-1)) @ (self.null_value.unsqueeze(1) @ self.W_O).squeeze(1)
        return out.view(*batch_shape, n_pos, d_model)

    def _null_logit_by_query(self, x: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, ...]:
        """``_null_logit`` in the circuit order's ``[batch, query, head]`` layout, without q:
        q_i . k'_h = x_i (W_Q[h] k'_h)."""
        if self.attention == "learned_sink":
            return self.sinks.view(1, 1, -1)
        logit = x @ (self.W_Q @ self.null_key.unsqueeze(-1)).squeeze(-1).T
        return logit * self.scale if self.scale != 1.0 else logit


def _listened(hook: HookPoint) -> bool:
    """Whether anything listens to ``hook``."""
    return bool(hook._forward_hooks or hook._backward_hooks or hook._forward_pre_hooks)
