"""A hooked two-layer MLP (opt-in for toy models; the paper's models have none)."""

from __future__ import annotations

import torch
from torch import nn
from transformer_lens.hook_points import HookPoint


class HookedMLP(nn.Module):
    """``x [batch, pos, d_model] -> [batch, pos, d_model]`` through ReLU, without biases.

    Hooks: ``hook_pre`` and ``hook_post`` ``[batch, pos, d_mlp]`` (TransformerLens names).
    """

    def __init__(self, d_model: int, d_mlp: int, init_std: float = 0.02) -> None:
        super().__init__()
        self.W_in = nn.Parameter(torch.randn(d_model, d_mlp) * init_std)
        self.W_out = nn.Parameter(torch.randn(d_mlp, d_model) * init_std)
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.hook_post(torch.relu(self.hook_pre(x @ self.W_in)))
        return hidden @ self.W_out
