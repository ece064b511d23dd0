"""The probe's per-(layer, head) sums of a gated model's gate (``hook_gate``), one batch at a
time: at the selected queries (the toy task's default positions) and at the other real
queries after the anchor (its trigger)."""

from __future__ import annotations

import math

import torch
from jaxtyping import Bool, Float

from sinkscope.interp.hooked_model import PreparedBatch
from sinkscope.probes.sink_metrics import gate_sums


class GateSums:
    """Gate sums and counts of ``n_layers`` x ``n_heads`` heads (float64)."""

    def __init__(self, n_layers: int, n_heads: int) -> None:
        shape = (n_layers, n_heads)
        self.selected = (torch.zeros(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.float64))
        self.others = (torch.zeros(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.float64))

    def add(
        self,
        layer: int,
        gate: Float[torch.Tensor, "batch pos head *d_head"],
        batch: PreparedBatch,
        selected: Bool[torch.Tensor, "batch pos"],
    ) -> None:
        positions = torch.arange(batch.n_pos, device=selected.device)
        others = batch.attention_mask & ~selected & (positions.unsqueeze(0) > batch.anchor.unsqueeze(1))
        for (total, count), queries in ((self.selected, selected), (self.others, others)):
            sums, counts = gate_sums(gate, queries)
            total[layer] += sums.double().cpu()
            count[layer] += counts.double().cpu()

    def means(self) -> tuple[Float[torch.Tensor, "layer head"], Float[torch.Tensor, "layer head"]]:
        """The mean gate at the selected and at the other queries; NaN where none was summed."""
        return tuple(  # type: ignore[return-value]
            torch.where(count > 0, total / count.clamp_min(1), torch.full_like(total, math.nan))
            for total, count in (self.selected, self.others)
        )
