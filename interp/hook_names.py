"""TransformerLens hook names, written once.

Shapes (TransformerLens conventions):
- ``q``, ``k``, ``v``, ``z``: ``[batch, pos, head, d_head]`` (``k``/``v``: n_kv_heads heads
  under grouped-query attention)
- ``attn_scores``, ``pattern``: ``[batch, head, query, key]``
- ``resid_pre``, ``resid_post``, ``attn_out``: ``[batch, pos, d_model]``
- ``null`` (kinds whose rows may leave mass on no token): ``[batch, head, query]``
- ``gate`` (gated kinds): ``[batch, pos, head]`` or ``[batch, pos, head, d_head]``
- ``q_gate`` (bridges whose q_proj is doubled into query and gate halves, Qwen3-Next): the
  gate half before its sigmoid, ``[batch, pos, head * d_head]``; ``q`` then carries both
  halves, ``[batch, pos, 2 * head, d_head]`` (head h's query at 2h, its gate at 2h + 1)
"""

from __future__ import annotations

from typing import Any

from sinkscope.infra.errors import SUPPORTED_FAMILIES_DOC, InputError
from sinkscope.interp.model_spec import NoPatternLayer

ATTN_HOOKS = ("q", "k", "v", "z", "attn_scores", "pattern", "rot_q", "rot_k", "null", "gate", "q_gate")
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


LINEAR_ATTENTION = "linear_attn"  # a hybrid block's linear-attention module (TransformerBridge's name)


def no_pattern_layers(model: Any, hook_names: frozenset[str], n_layers: int) -> tuple[NoPatternLayer, ...]:
    """The layers of a bridge without attention hooks, each a linear-attention layer that
    probes skip (Qwen3-Next's Gated DeltaNet layers between its attention layers).

    Refused in one line naming the family: a bridge without attention in any layer
    (state-space models: Mamba), and one some of whose layers are neither attention nor
    linear attention (LFM2's convolution layers), which the bridge boots but probes
    cannot account for."""
    missing = [
        layer
        for layer in range(n_layers)
        if any(attn_hook(layer, name) not in hook_names for name in ("pattern", "v", "z"))
    ]
    linear = [layer for layer in missing if f"blocks.{layer}.{LINEAR_ATTENTION}.hook_out" in hook_names]
    if missing and (len(missing) == n_layers or linear != missing):
        original = getattr(model, "original_model", model)
        family = getattr(getattr(original, "config", None), "model_type", "unknown")
        if len(missing) == n_layers:
            where, why = "any layer", f"the {family} family has no attention for sink probes to read"
        else:
            layer = next(layer for layer in missing if layer not in linear)
            where = f"layer {missing[0]} ({len(missing)} of {n_layers} layers)"
            why = (
                f"the {family} family is not all attention, and its layer {layer} is not linear attention "
                "either (the one kind of layer sink probes skip)"
            )
        raise InputError(
            f"{type(original).__name__} has no attention hooks in {where}: {why}; the supported families are "
            f"listed in {SUPPORTED_FAMILIES_DOC}"
        )
    return tuple(NoPatternLayer(layer, _linear_kind(model, layer)) for layer in linear)


def _linear_kind(model: Any, layer: int) -> str:
    """``linear attention (<the wrapped module's class>)``, e.g. ``Qwen3NextGatedDeltaNet``."""
    bridge = getattr(model.blocks[layer], LINEAR_ATTENTION, None)
    module = getattr(bridge, "original_component", None)
    return "linear attention" if module is None else f"linear attention ({type(module).__name__})"
