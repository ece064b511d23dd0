"""A hooked multi-head attention layer with a pluggable attention kind.

The math is the paper's (no biases, optional 1/sqrt(d_head)); the hook names are
TransformerLens's, so a layer placed at ``blocks.{l}.attn`` exposes
``blocks.{l}.attn.hook_q|hook_k|hook_v|hook_attn_scores|hook_pattern|hook_z``.
Weights use TransformerLens's layout: ``W_Q/W_K/W_V [head, d_model, d_head]`` and
``W_O [head, d_head, d_model]``.
"""

from __future__ import annotations

import torch
from torch import nn
from transformer_lens.hook_points import HookPoint

from interp.attention_kinds import (
    causal_mask,
    fixed_row_scale,
    score_scale,
    scores_to_pattern,
    validate_attention_kind,
)


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
        self.hook_q = HookPoint()
        self.hook_k = HookPoint()
        self.hook_v = HookPoint()
        self.hook_attn_scores = HookPoint()
        self.hook_pattern = HookPoint()
        self.hook_z = HookPoint()
        self._mask_cache: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor | None]] = {}

    def _mask_and_scale(self, n_pos: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        key = (n_pos, str(device))
        if key not in self._mask_cache:
            self._mask_cache[key] = (
                ~causal_mask(n_pos, n_pos, device),
                fixed_row_scale(self.attention, n_pos, device),
            )
        return self._mask_cache[key]

    def _project(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``x [batch, pos, d_model]`` times ``weight [head, d_model, d_head]`` -> ``[batch, pos, head, d_head]``.

        One flat matmul instead of an einsum: the toy models are tiny, so per-op
        overhead, not FLOPs, sets the training speed.
        """
        flat = weight.permute(1, 0, 2).reshape(self.d_model, self.n_heads * self.d_head)
        return (x @ flat).view(*x.shape[:-1], self.n_heads, self.d_head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n_pos = x.shape[-2]
        hidden_mask, row_scale = self._mask_and_scale(n_pos, x.device)
        q = self.hook_q(self._project(x, self.W_Q))
        k = self.hook_k(self._project(x, self.W_K))
        v = self.hook_v(self._project(x, self.W_V))
        # [batch, head, query, key]
        scores = q.transpose(1, 2) @ k.permute(0, 2, 3, 1)
        if self.scale != 1.0:
            scores = scores * self.scale
        scores = self.hook_attn_scores(scores.masked_fill(hidden_mask, float("-inf")))
        pattern = self.hook_pattern(scores_to_pattern(self.attention, scores, row_scale))
        # [batch, pos, head, d_head]
        z = self.hook_z((pattern @ v.transpose(1, 2)).transpose(1, 2))
        w_o = self.W_O.reshape(self.n_heads * self.d_head, self.d_model)
        return z.reshape(*z.shape[:-2], self.n_heads * self.d_head) @ w_o
