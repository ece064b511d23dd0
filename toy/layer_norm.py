"""A hooked LayerNorm (opt-in for toy models; the paper's models have none)."""

from __future__ import annotations

import torch
from torch import nn
from transformer_lens.hook_points import HookPoint


class HookedLayerNorm(nn.Module):
    """LayerNorm with a learned gain and no bias; ``hook_scale [batch, pos, 1]`` and
    ``hook_normalized [batch, pos, d_model]`` as in TransformerLens."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(d_model))
        self.eps = eps
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)
        scale = self.hook_scale((centred.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(centred / scale) * self.w
