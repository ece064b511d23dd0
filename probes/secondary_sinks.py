"""Secondary sinks and the tokens that carry massive activations, summed in the probe's pass.

A key position other than the anchor is a secondary sink of a head when the mean
attention it receives from the later selected queries that see it (queries strictly
after it; its own query is left out) is at least ``min_mass``, over at least
``min_queries`` such queries. Hits are aggregated by token (token id for token inputs;
position for toy inputs, which have no vocabulary) over every prompt: occurrences, the
(occurrence, head) hits, their mean mass and the heads. A token occurrence carries a
massive activation (Sun et al. 2024) when some entry of its residual stream after a
probed block has |x| > ``massive_abs`` and > ``massive_ratio`` x the prompt's median |x|
(the rule of ``LayerProbe.massive_count``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

import torch

from sinkscope.interp.hooked_model import PreparedBatch

NO_LAYER = 1 << 30  # the first massive layer of a position that carries none


def later_query_mass(
    pattern: torch.Tensor, queries: torch.Tensor, visible: torch.Tensor, clean: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per key, the summed attention from the later ``queries`` [batch, query] that see it,
    ``[batch, head, key]``, and how many such queries there are, ``[batch, key]``.
    ``clean``: the pattern is ``masked_cleanly`` (zero on every hidden key); under causal
    visibility the sum is then one matrix product over all queries less each key's own."""
    positions = torch.arange(pattern.shape[-1], device=pattern.device)
    later = positions.view(1, -1, 1) > positions.view(1, 1, -1)
    mask = visible & later & queries.unsqueeze(-1)
    if clean and not bool(visible.triu(1).any()):  # no query sees a later key: causal
        weights = queries.to(pattern.dtype)  # [batch, query]
        every = (weights[:, None, None, :] @ pattern).squeeze(2)  # [batch, head, key]
        return every - pattern.diagonal(dim1=-2, dim2=-1) * weights[:, None, :], mask.sum(dim=1)
    return torch.einsum("bhqk,bqk->bhk", pattern, mask.to(pattern.dtype)), mask.sum(dim=1)


def massive_positions(
    position_max: torch.Tensor, real: torch.Tensor, median: torch.Tensor, abs_min: float, ratio: float
) -> torch.Tensor:
    """``[batch, pos]``: real positions with an entry |x| > ``abs_min`` and > ``ratio`` x the
    row's ``median`` |x|, from each position's largest |x| (``position_max``), which decides
    whether any of its entries passes."""
    limit = torch.clamp(ratio * median.view(-1, 1).to(position_max.dtype), min=abs_min)
    return (position_max > limit) & real


@dataclass
class TokenTally:
    """What one token (or toy position) gathered over every prompt."""

    occurrences: int = 0
    sink_occurrences: int = 0
    sink_offsets: int = 0  # summed distance from the anchor of the sink occurrences
    head_hits: int = 0
    mass: float = 0.0
    heads: Counter = field(default_factory=Counter)
    sink_massive: int = 0  # secondary-sink occurrences that carry a massive activation
    massive: int = 0  # occurrences that carry one
    massive_at_anchor: int = 0
    first_massive_layer: int = NO_LAYER
    massive_layers: set = field(default_factory=set)
    max_abs: float = 0.0


class SecondarySinkSums:
    """Per-token tallies of secondary sinks and massive activations, one batch at a time."""

    def __init__(self, min_mass: float, min_queries: int, massive_abs: float, massive_ratio: float) -> None:
        self.min_mass, self.min_queries = min_mass, min_queries
        self.massive_abs, self.massive_ratio = massive_abs, massive_ratio
        self.tally: dict[int, TokenTally] = defaultdict(TokenTally)
        self.by_position = False
        self._hit: torch.Tensor | None = None  # [batch, pos]: a secondary sink in some head
        self._first_massive: torch.Tensor | None = None  # [batch, pos]: first massive layer

    def start(self, batch: PreparedBatch) -> None:
        self._keys = self._token_keys(batch)
        self._hit = torch.zeros(batch.attention_mask.shape, dtype=torch.bool)
        self._first_massive = torch.full(batch.attention_mask.shape, NO_LAYER, dtype=torch.long)

    def _token_keys(self, batch: PreparedBatch) -> torch.Tensor:
        """Each position's token id, or (toy inputs, float vectors) its position."""
        model_input = batch.model_input
        if torch.is_tensor(model_input) and not model_input.is_floating_point() and model_input.ndim == 2:
            return model_input.detach().cpu().long()
        self.by_position = True
        return torch.arange(batch.n_pos).expand(batch.batch_size, -1)

    def add_pattern(
        self,
        layer: int,
        pattern: torch.Tensor,
        batch: PreparedBatch,
        selected: torch.Tensor,
        visible: torch.Tensor,
        clean: bool = False,
    ) -> None:
        sums, counts = later_query_mass(pattern, selected, visible, clean)
        mean = sums.float() / counts.clamp_min(1).unsqueeze(1)
        rows = torch.arange(batch.batch_size, device=mean.device)
        eligible = batch.attention_mask & (counts >= self.min_queries)
        eligible[rows, batch.anchor] = False
        hits = (mean >= self.min_mass) & eligible.unsqueeze(1)  # [batch, head, key]
        found = hits.nonzero().cpu()  # [n, 3]: (row, head, key)
        if not len(found):
            return
        masses = mean[hits].double().cpu()
        assert self._hit is not None
        self._hit[found[:, 0], found[:, 2]] = True
        # one Python step per distinct (token, head) of the batch, not per hit
        tokens, heads = self._keys[found[:, 0], found[:, 2]], found[:, 1]
        pairs, inverse, counts = torch.unique(
            tokens * pattern.shape[1] + heads, return_inverse=True, return_counts=True
        )
        mass_sums = torch.zeros(len(pairs), dtype=torch.float64).index_add_(0, inverse, masses)
        for pair, count, mass in zip(pairs.tolist(), counts.tolist(), mass_sums.tolist()):
            tally = self.tally[pair // pattern.shape[1]]
            tally.head_hits += count
            tally.mass += mass
            tally.heads[(layer, pair % pattern.shape[1])] += count

    def add_resid(self, layer: int, position_max: torch.Tensor, batch: PreparedBatch, median: torch.Tensor) -> None:
        """One layer's massive activations: ``position_max`` each position's largest |x|,
        ``median`` each prompt's median |x| (``massive_activations``)."""
        massive = massive_positions(position_max, batch.attention_mask, median, self.massive_abs, self.massive_ratio)
        massive, magnitude = massive.cpu(), position_max.float().cpu()
        assert self._first_massive is not None
        self._first_massive = torch.where(massive, self._first_massive.clamp_max(layer), self._first_massive)
        for row, pos in massive.nonzero().tolist():
            tally = self.tally[int(self._keys[row, pos])]
            tally.massive_layers.add(layer)
            tally.max_abs = max(tally.max_abs, float(magnitude[row, pos]))

    def finish(self, batch: PreparedBatch) -> None:
        """Close the batch: count every real occurrence, tie its hits to massive activations."""
        assert self._hit is not None and self._first_massive is not None
        real = batch.attention_mask.cpu()
        tokens, counts = torch.unique(self._keys[real], return_counts=True)
        for token, count in zip(tokens.tolist(), counts.tolist()):
            self.tally[token].occurrences += count
        anchors = batch.anchor.cpu()
        sink = real & self._hit
        offsets = (torch.arange(batch.n_pos).view(1, -1) - anchors.view(-1, 1))[sink]
        sinks, inverse, counts = torch.unique(self._keys[sink], return_inverse=True, return_counts=True)
        offset_sums = torch.zeros(len(sinks), dtype=torch.long).index_add_(0, inverse, offsets)
        for token, count, offset in zip(sinks.tolist(), counts.tolist(), offset_sums.tolist()):
            self.tally[token].sink_occurrences += count
            self.tally[token].sink_offsets += offset
        # positions carrying a massive activation are few (mostly the anchor): one step each
        for row, pos in (real & (self._first_massive != NO_LAYER)).nonzero().tolist():
            tally = self.tally[int(self._keys[row, pos])]
            tally.massive += 1
            tally.massive_at_anchor += pos == int(anchors[row])
            tally.sink_massive += bool(self._hit[row, pos])
            tally.first_massive_layer = min(tally.first_massive_layer, int(self._first_massive[row, pos]))
        self._hit = self._first_massive = None
