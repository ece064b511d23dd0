"""The probe's batches: user inputs and their masks split into ``ProbeBatch``es, token ids
grouped by length so each batch pads only to its own longest row."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from sinkscope.infra.errors import InputError
from sinkscope.probes.probe import ProbeBatch


def iterate_batches(
    inputs: torch.Tensor | Sequence[str],
    attention_mask: torch.Tensor | None,
    query_mask: torch.Tensor | None,
    batch_size: int,
) -> Iterator[ProbeBatch]:
    """Split inputs (and their masks, ``[n, pos]``) into ``ProbeBatch``es of ``batch_size``.

    Token ids with an ``attention_mask`` are batched by length: rows sorted by where
    their real tokens end (a stable sort: equal lengths keep the given order), each
    batch cut after its last real column, so it pads only to its own longest row.
    Probe results do not depend on the grouping (see the module docstring). Strings and
    toy tokens keep the given order.
    """
    if isinstance(inputs, str):
        inputs = [inputs]
    n = len(inputs)
    if n == 0:
        raise InputError("the input set is empty; pass at least one input")
    if query_mask is not None and not torch.is_tensor(inputs):
        raise InputError("query_mask needs fixed positions: pass token ids (model.to_tokens) instead of strings")
    is_token_ids = torch.is_tensor(inputs) and inputs.ndim == 2 and not inputs.is_floating_point()
    if not is_token_ids or attention_mask is None:
        for start in range(0, n, batch_size):
            stop = min(start + batch_size, n)
            yield ProbeBatch(
                inputs=inputs[start:stop],
                attention_mask=None if attention_mask is None else attention_mask[start:stop],
                query_mask=None if query_mask is None else query_mask[start:stop],
            )
        return
    assert isinstance(inputs, torch.Tensor)  # token ids with a mask, as checked above
    for name, mask in (("attention_mask", attention_mask), ("query_mask", query_mask)):
        if mask is not None and mask.shape != inputs.shape:
            raise InputError(f"{name} {tuple(mask.shape)} must match token ids {tuple(inputs.shape)}")
    real = attention_mask.bool()
    # one past each row's last real token (the full width for a row with none, which
    # HookedModel.prepare then refuses)
    ends = inputs.shape[1] - real.flip(1).to(torch.long).argmax(dim=1)
    order = torch.sort(ends, stable=True).indices
    for start in range(0, n, batch_size):
        rows = order[start : start + batch_size]
        width = int(ends[rows].max())
        yield ProbeBatch(
            inputs=inputs[rows, :width],
            attention_mask=attention_mask[rows, :width],
            query_mask=None if query_mask is None else query_mask[rows, :width],
        )
