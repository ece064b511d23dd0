"""Toy attention-only transformers for the trigger task, as TransformerLens modules.

Readable in one sitting: a stack of blocks, each ``x -> x + attn(x)`` (or, for the
paper's single-layer model, ``x -> attn(x)`` with no residual). The paper's models have
no MLP, LayerNorm, positional encoding or biases and score with unscaled Q K^T; the
options beyond the paper are off by default.

Hook names follow TransformerLens: ``hook_embed``, ``hook_pos_embed``,
``blocks.{l}.hook_resid_pre|hook_attn_out|hook_resid_mid|hook_mlp_out|hook_resid_post``,
``blocks.{l}.attn.hook_q|hook_k|hook_v|hook_attn_scores|hook_pattern|hook_z``,
``blocks.{l}.ln1.hook_normalized``, ``blocks.{l}.mlp.hook_pre|hook_post``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, cast

import torch
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from sinkscope.infra.bounds import POSITIVE, POSITIVE_NUMBER, Bound, check_bounds
from sinkscope.infra.errors import InputError
from sinkscope.infra.field_types import check_field_types
from sinkscope.interp.attention_kinds import validate_attention_kind
from sinkscope.toy.attention import HookedAttention
from sinkscope.toy.layer_norm import HookedLayerNorm
from sinkscope.toy.mlp import HookedMLP
from sinkscope.toy.task import TargetKind


@dataclass(frozen=True)
class ToyModelConfig:
    """Architecture of a toy model. ``d_head=None`` means full width (d_model), as in the
    paper; ``residual=None`` means the paper's choice (no residual for one layer,
    residual for several)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "n_layers": POSITIVE,
        "n_heads": POSITIVE,
        "d_model": POSITIVE,
        "seq_len": POSITIVE,
        "d_head": POSITIVE,
        "d_mlp": POSITIVE,
        "init_std": POSITIVE_NUMBER,
    }

    n_layers: int = 1
    n_heads: int = 1
    d_model: int = 16
    seq_len: int = 16
    attention: str = "softmax"
    d_head: int | None = None
    residual: bool | None = None
    layer_norm: bool = False
    mlp: bool = False
    d_mlp: int | None = None
    positional_embedding: bool = False
    scale_scores: bool = False
    init_std: float = 0.02

    def __post_init__(self) -> None:
        check_field_types(self)  # a wrong type is named here, not a TypeError further on
        validate_attention_kind(self.attention)
        check_bounds(self)  # NaN, inf and 0 for init_std fail here, not inside torch; sizes >= 1

    @property
    def head_width(self) -> int:
        return self.d_model if self.d_head is None else self.d_head

    @property
    def has_residual(self) -> bool:
        return self.n_layers > 1 if self.residual is None else self.residual

    @property
    def mlp_width(self) -> int:
        return 4 * self.d_model if self.d_mlp is None else self.d_mlp

    @property
    def target(self) -> TargetKind:
        """Which task target this architecture is trained on (see ``sinkscope.toy.task``)."""
        return "residual" if self.has_residual else "single"


class ToyBlock(nn.Module):
    """One layer: ``[batch, pos, d_model] -> [batch, pos, d_model]``."""

    def __init__(self, config: ToyModelConfig) -> None:
        super().__init__()
        self.residual = config.has_residual
        self.ln1 = HookedLayerNorm(config.d_model) if config.layer_norm else None
        self.attn = HookedAttention(
            config.d_model,
            config.n_heads,
            config.head_width,
            attention=config.attention,
            scale_scores=config.scale_scores,
            init_std=config.init_std,
        )
        self.ln2 = HookedLayerNorm(config.d_model) if (config.layer_norm and config.mlp) else None
        self.mlp = HookedMLP(config.d_model, config.mlp_width, config.init_std) if config.mlp else None
        self.hook_resid_pre = HookPoint()
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, resid: torch.Tensor) -> torch.Tensor:
        resid = self.hook_resid_pre(resid)
        attn_in = self.ln1(resid) if self.ln1 is not None else resid
        attn_out = self.hook_attn_out(self.attn(attn_in))
        resid = resid + attn_out if self.residual else attn_out
        if self.mlp is not None:
            resid = self.hook_resid_mid(resid)
            mlp_in = self.ln2(resid) if self.ln2 is not None else resid
            mlp_out = self.hook_mlp_out(self.mlp(mlp_in))
            resid = resid + mlp_out if self.residual else mlp_out
        return self.hook_resid_post(resid)


class ToyTransformer(HookedRootModule):
    """Tokens ``[batch, pos, d_model]`` (continuous vectors) -> outputs ``[batch, pos, d_model]``.

    The output is the last block's ``hook_resid_post``: there is no unembedding, because
    the task's targets live in the token space.
    """

    def __init__(self, config: ToyModelConfig) -> None:
        super().__init__()
        self.cfg = config
        self.hook_embed = HookPoint()
        self.hook_pos_embed = HookPoint()
        self.W_pos = (
            nn.Parameter(torch.randn(config.seq_len, config.d_model) * config.init_std)
            if config.positional_embedding
            else None
        )
        self.blocks = nn.ModuleList(ToyBlock(config) for _ in range(config.n_layers))
        self.setup()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.ndim != 3 or tokens.shape[-1] != self.cfg.d_model:
            raise InputError(f"expected tokens of shape [batch, pos, {self.cfg.d_model}], got {tuple(tokens.shape)}")
        if tokens.shape[1] > self.cfg.seq_len and self.W_pos is not None:
            raise InputError(
                f"sequence of {tokens.shape[1]} positions exceeds the model's positional "
                f"embedding of {self.cfg.seq_len}; build the model with seq_len >= {tokens.shape[1]}"
            )
        resid = self.hook_embed(tokens)
        if self.W_pos is not None:
            resid = resid + self.hook_pos_embed(self.W_pos[: tokens.shape[1]]).unsqueeze(0)
        for block in self.blocks:
            resid = block(resid)
        return resid

    def attention(self, layer: int) -> HookedAttention:
        """Layer ``layer``'s attention module (its ``W_Q``, ``W_K``, ``W_V``, ``W_O``)."""
        return cast(ToyBlock, self.blocks[layer]).attn
