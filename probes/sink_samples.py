"""Per-prompt sufficient statistics of the sink rate and the anchor mass, kept during the probe's own pass.

The probe (``runner.ProbeAccumulator``) pools every query of every prompt into per-head
sums. The sink experiments need more: an interval over prompts, the sink rate at any
list of eps, and the numbers at several prompt lengths T. All of them follow from each
prompt's Gu et al. alpha and anchor mass per (layer, head) at each length, kept here as
``[prompt, length, layer, head]`` arrays (a few kilobytes per prompt): the sink rate at
any eps is a threshold on the kept alpha, so one pass serves every eps.

Lengths come from the same pass. In a causal model a query never sees a later token, so
the pattern of a prompt cut to T tokens is the top-left T x T block of the full prompt's
pattern; running sums over the queries, read at the query T - 1 after the anchor, give
the cut prompt's numbers without another forward. T counts tokens from the anchor,
anchor included; a prompt shorter than T gives NaN at T (it cannot be cut to T). A
bidirectional model's queries see later keys, so there each T needs its own pass of
prompts cut to T (``cut_tokens``), with ``lengths=()`` here.
"""

from __future__ import annotations

import torch

from sinkscope.interp.hooked_model import PreparedBatch
from sinkscope.interp.visibility import sees_key
from sinkscope.probes.sink_metrics import column


class SampleSums:
    """Per-prompt alpha_k and anchor mass of ``n_layers`` x ``n_heads`` heads at each prompt's
    full length and at each of ``lengths`` (causal models), over the queries the probe's
    headline numbers use (queries that see the anchor; for alpha, real queries that see
    key k)."""

    def __init__(self, n_layers: int, n_heads: int, k: int, lengths: tuple[int, ...] = ()) -> None:
        self.shape, self.k, self.lengths = (n_layers, n_heads), k, tuple(lengths)
        self._alpha: list[torch.Tensor] = []  # one [batch, point, layer, head] tensor per batch
        self._mass: list[torch.Tensor] = []
        self._batch: PreparedBatch | None = None  # the batch the last blocks belong to

    @property
    def n_points(self) -> int:
        """Full length, then each of ``lengths``."""
        return 1 + len(self.lengths)

    def _begin(self, batch: PreparedBatch) -> None:
        """A new batch's blocks: every (prompt, length, layer, head) not measured stays NaN."""
        self._batch = batch
        shape = (batch.batch_size, self.n_points, *self.shape)
        self._alpha.append(torch.full(shape, torch.nan, dtype=torch.float64))
        self._mass.append(torch.full(shape, torch.nan, dtype=torch.float64))

    def add(
        self, layer: int, pattern: torch.Tensor, batch: PreparedBatch, selected: torch.Tensor, visible: torch.Tensor
    ) -> None:
        """One layer's ``pattern [batch, head, query, key]`` of the current batch; ``selected``
        and ``visible`` as in ``PatternSums.add``."""
        if batch is not self._batch:
            self._begin(batch)
        anchor, real = batch.anchor, batch.attention_mask
        ends = self._ends(batch)
        seen = selected & sees_key(visible, anchor)
        self._mass[-1][:, :, layer] = _prefix_means(column(pattern, anchor), seen, ends)
        key = (anchor + self.k).clamp_max(batch.n_pos - 1)
        positions = torch.arange(batch.n_pos, device=real.device).unsqueeze(0)
        alpha_queries = real & sees_key(visible, key) & (positions >= key.unsqueeze(1))
        alpha_queries &= (anchor + self.k < batch.n_pos).unsqueeze(1)  # no key k in a row this short
        self._alpha[-1][:, :, layer] = _prefix_means(column(pattern, key), alpha_queries, ends)

    def _ends(self, batch: PreparedBatch) -> torch.Tensor:
        """``[batch, n_points]``: the last query of each point (-1 where the prompt is shorter)."""
        real = batch.attention_mask
        last = real.shape[1] - 1 - real.flip(1).to(torch.long).argmax(dim=1)
        ends = [last]
        for length in self.lengths:
            end = batch.anchor + length - 1
            inside = (end <= last) & (end < real.shape[1])
            ends.append(torch.where(inside, end, torch.full_like(end, -1)))
        return torch.stack(ends, dim=1)

    def alpha(self) -> torch.Tensor:
        """``[prompt, point, layer, head]`` alpha_k, prompts in the order probed."""
        return torch.cat(self._alpha) if self._alpha else torch.empty(0, self.n_points, *self.shape)

    def mass(self) -> torch.Tensor:
        """``[prompt, point, layer, head]`` anchor mass, prompts in the order probed."""
        return torch.cat(self._mass) if self._mass else torch.empty(0, self.n_points, *self.shape)


def _prefix_means(values: torch.Tensor, queries: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """``[batch, point, head]``: the mean of ``values [batch, head, query]`` over the
    ``queries [batch, query]`` up to and including each ``ends [batch, point]`` query
    (NaN where none, or where the end is -1)."""
    weights = queries.to(torch.float64)
    sums = (values.double() * weights.unsqueeze(1)).cumsum(dim=-1)  # [batch, head, query]
    counts = weights.cumsum(dim=-1)  # [batch, query]
    index = ends.clamp_min(0).to(sums.device)
    picked = sums.gather(-1, index.unsqueeze(1).expand(-1, sums.shape[1], -1)).transpose(1, 2)
    count = counts.gather(-1, index).unsqueeze(-1)
    valid = (ends.to(sums.device) >= 0).unsqueeze(-1) & (count > 0)
    return torch.where(valid, picked / count.clamp_min(1), torch.nan).cpu()


def cut_tokens(tokens: torch.Tensor, attention_mask: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``tokens``/``attention_mask [n, pos]`` of the prompts that hold at least
    ``length`` tokens, cut to their first ``length`` (for models whose queries see later keys)."""
    keep = attention_mask.sum(dim=1) >= length
    return tokens[keep, :length], attention_mask[keep, :length]
