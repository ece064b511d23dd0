"""transformers' own eager attention with an edited pattern: the reference an intervention
is compared with (the same edit, made inside transformers)."""

from __future__ import annotations

import sys
from contextlib import contextmanager

import torch


@contextmanager
def edited_eager_attention(hf, edits):
    """Run transformers' own eager attention, then replace the pattern of the layers in
    ``edits`` ({layer: fn(weights [b, head, q, k]) -> weights}) and recompute its output
    from the repeated values, as transformers does."""
    module = sys.modules[type(hf.model.layers[0].self_attn).__module__]
    original = module.eager_attention_forward

    def eager(attn, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        output, weights = original(attn, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        if attn.layer_idx not in edits:
            return output, weights
        weights = edits[attn.layer_idx](weights)
        values = module.repeat_kv(value, attn.num_key_value_groups)
        return torch.matmul(weights, values).transpose(1, 2).contiguous(), weights

    module.eager_attention_forward = eager
    try:
        yield
    finally:
        module.eager_attention_forward = original
