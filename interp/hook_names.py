"""TransformerLens hook names, written once.

Shapes (TransformerLens conventions):
- ``q``, ``k``, ``v``, ``z``: ``[batch, pos, head, d_head]`` (``k``/``v``: n_kv_heads heads
  under grouped-query attention)
- ``attn_scores``, ``pattern``: ``[batch, head, query, key]``
- ``resid_pre``, ``resid_post``, ``attn_out``: ``[batch, pos, d_model]``
- ``null`` (kinds whose rows may leave mass on no token): ``[batch, head, query]``
- ``gate`` (gated kinds): ``[batch, pos, head]`` or ``[batch, pos, head, d_head]``
"""

from __future__ import annotations

from typing import Any

from sinkscope.infra.errors import SUPPORTED_FAMILIES_DOC, InputError

ATTN_HOOKS = ("q", "k", "v", "z", "attn_scores", "pattern", "rot_q", "rot_k", "null", "gate")
BLOCK_HOOKS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")


def attn_hook(layer: int, name: str) -> str:
    """``blocks.{layer}.attn.hook_{name}`` for name in q, k, v, z, attn_scores, pattern, and the
    rotated rot_q, rot_k of rotary models (after RoPE; q and k are before it)."""
    if name not in ATTN_HOOKS:
        raise InputError(f"unknown attention hook {name!r}; choose one of {', '.join(ATTN_HOOKS)}")
    return f"blocks.{layer}.attn.hook_{name}"


def block_hook(layer: int, name: str) -> str:
    """``blocks.{layer}.hook_{name}`` for name in resid_pre, resid_mid, resid_post, attn_out, mlp_out."""
    if name not in BLOCK_HOOKS:
        raise InputError(f"unknown block hook {name!r}; choose one of {', '.join(BLOCK_HOOKS)}")
    return f"blocks.{layer}.hook_{name}"


def pattern_hook(layer: int) -> str:
    return attn_hook(layer, "pattern")


def require_attention_everywhere(model: Any, hook_names: frozenset[str], n_layers: int) -> None:
    """Refuse, in one line naming the family, a bridge some of whose layers have no attention:
    state-space models (Mamba) and hybrids with convolution or recurrent layers (LFM2), which
    the bridge boots but whose layers sink probes cannot all read."""
    layers = [
        layer
        for layer in range(n_layers)
        if any(attn_hook(layer, name) not in hook_names for name in ("pattern", "v", "z"))
    ]
    if not layers:
        return
    original = getattr(model, "original_model", model)
    family = getattr(getattr(original, "config", None), "model_type", "unknown")
    where = "any layer" if len(layers) == n_layers else f"layer {layers[0]} ({len(layers)} of {n_layers} layers)"
    raise InputError(
        f"{type(original).__name__} has no attention hooks in {where}: the {family} family is not "
        f"all attention, and sink probes read every layer's; the supported families are listed in "
        f"{SUPPORTED_FAMILIES_DOC}"
    )
