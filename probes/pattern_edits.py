"""Pure edits of an attention pattern ``[batch, head, query, key]``, each returning a new
tensor: keys masked (and rows renormalised as the kind would), rows renormalised over
their keys, rows made one-hot (``sinkscope.probes.interventions`` applies them)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Bool, Float, Int


def mask_keys(
    pattern: Float[torch.Tensor, "batch head query key"],
    keys: Int[torch.Tensor, "batch query"],
    heads: Sequence[int],
    renormalise: bool,
    null_slot: bool = False,
) -> Float[torch.Tensor, "batch head query key"]:
    """Zero A[b, h, i, keys[b, i]] for the listed heads (keys = -1: leave row i alone),
    then renormalise those rows if ``renormalise``: over what is left of them, or with
    ``null_slot`` over 1 - the removed mass (a softmax with a null logit). Returns a new
    tensor.
    """
    edited = pattern.clone()
    selected = edited[:, list(heads)]
    has_key = keys >= 0
    hit = torch.zeros_like(selected[:, 0], dtype=torch.bool)
    hit.scatter_(-1, keys.clamp_min(0).unsqueeze(-1), has_key.unsqueeze(-1))
    kept = selected.masked_fill(hit.unsqueeze(1), 0.0)
    removed = (selected - kept).sum(dim=-1, keepdim=True)
    selected = kept
    if renormalise and null_slot:
        scaled = selected / (1.0 - removed).clamp_min(torch.finfo(selected.dtype).tiny)
        selected = torch.where(has_key.unsqueeze(1).unsqueeze(-1), scaled, selected)
    elif renormalise:
        rest = selected.sum(dim=-1, keepdim=True)
        # divide by the rest itself, however small: a strong sink leaves subnormal masses,
        # and clamping the divisor to the smallest normal float would shrink those rows
        scaled = selected / torch.where(rest > 0, rest, torch.ones_like(rest))
        selected = torch.where(has_key.unsqueeze(1).unsqueeze(-1), scaled, selected)
    edited[:, list(heads)] = selected
    return edited


def renormalise_rows(
    pattern: Float[torch.Tensor, "batch head query key"], heads: Sequence[int]
) -> Float[torch.Tensor, "batch head query key"]:
    """The listed heads' rows divided by their sums over real keys, so a learned sink's
    share goes to the keys in proportion; a row with no mass on any key stays zero."""
    edited = pattern.clone()
    selected = edited[:, list(heads)]
    total = selected.sum(dim=-1, keepdim=True)
    edited[:, list(heads)] = selected / torch.where(total > 0, total, torch.ones_like(total))
    return edited


def one_hot_rows(
    pattern: Float[torch.Tensor, "batch head query key"],
    anchor: Int[torch.Tensor, " batch"],
    rows: Bool[torch.Tensor, "batch query"],
    heads: Sequence[int],
) -> Float[torch.Tensor, "batch head query key"]:
    """Rows ``rows`` of the listed heads become one-hot on ``anchor``."""
    edited = pattern.clone()
    target = torch.zeros_like(pattern[:, 0])
    target.scatter_(-1, anchor.view(-1, 1, 1).expand(-1, pattern.shape[2], 1), 1.0)
    for head in heads:
        edited[:, head] = torch.where(rows.unsqueeze(-1), target, pattern[:, head])
    return edited
