"""Learned attention sinks: a per-head logit that joins every row's softmax as one more
key that no token holds (gpt-oss's ``sinks``), so each row of the pattern over real keys
sums to less than one and the missing mass, 1 - row sum, is the learned sink's.

TransformerBridge's attention already folds these logits into ``hook_pattern`` (it
appends them as a column before the softmax and drops that column after), so probes
read the sink-adjusted pattern; this module only says whether a model has such logits.
"""

from __future__ import annotations

from typing import Any

import torch

from sinkscope.interp.attention_kinds import NULL_KINDS, NULL_SLOT_KINDS
from sinkscope.interp.hooked_model import HookedModel

SINK_LOGITS = "sinks"  # the parameter's name on transformers' GptOssAttention


def _attention_module(block_attention: Any) -> Any:
    """The module that owns the weights: a bridge's wrapped Hugging Face attention, or a
    toy model's attention itself."""
    return getattr(block_attention, "original_component", None) or block_attention


def learned_sink_logits(model: HookedModel, layer: int) -> torch.Tensor | None:
    """``[head]`` learned sink logits of ``layer``, or None when its attention has none."""
    logits = getattr(_attention_module(model.model.blocks[layer].attn), SINK_LOGITS, None)
    return logits.detach() if isinstance(logits, torch.Tensor) else None


def has_learned_sinks(model: HookedModel) -> bool:
    """Whether any layer's attention has learned sink logits (softmax models only: other
    kinds have no row sum that a sink could take mass from)."""
    return model.spec.normalised and any(
        learned_sink_logits(model, layer) is not None for layer in model.spec.pattern_layers
    )


def has_null(model: HookedModel) -> bool:
    """Whether the model's rows may leave mass on no token: learned sink logits, or a toy
    kind with a null (``NULL_KINDS``)."""
    return model.spec.attention in NULL_KINDS or has_learned_sinks(model)


def has_null_slot(model: HookedModel) -> bool:
    """Whether the model's null is one more logit in its softmax (learned sink logits, a
    bias slot, softmax1's 1), which ``remove_null`` can take away. softpick has a null but
    no slot: its null is the rows' own emptiness."""
    return model.spec.attention in NULL_SLOT_KINDS or has_learned_sinks(model)
