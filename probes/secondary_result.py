"""The secondary sinks and massive-activation tokens of a probe (``ProbeResult.secondary_sinks``):
persisted rows, their tables (one definition each, for every medium), a DataFrame and the
inline display. ``sinkscope.probes.secondary_sinks`` gathers them."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from sinkscope.infra.bounds import COUNT, FRACTION, NONNEGATIVE, Bound
from sinkscope.probes.secondary_sinks import NO_LAYER, SecondarySinkSums, TokenTally
from sinkscope.reports.document import Column, TableDefinition
from sinkscope.reports.frames import dataframe, row_of

if TYPE_CHECKING:
    from collections.abc import Callable

    import pandas

KEPT_TOKENS = 40  # rows persisted per list: the most used tokens
HEADS_LISTED = 6  # heads named per token, most hits first


@dataclass(frozen=True)
class SecondarySinkToken:
    """One token that is a secondary sink somewhere. occurrences: its real (non-padding)
    occurrences over every prompt; sink_occurrences: those that are a secondary sink in at
    least one head; head_hits: (occurrence, head) pairs; mean_mass: mean over those pairs
    of the mean attention from later queries; heads: the heads with most hits, "L{l}H{h}";
    massive_share: share of sink occurrences that carry a massive activation (NaN when
    residuals were not read); first_massive_layer: the earliest layer any occurrence of
    the token carries one (-1: none); mean_position: the sink occurrences' mean distance
    from the anchor (1: right after it)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "token_id": COUNT,
        "occurrences": COUNT,
        "sink_occurrences": COUNT,
        "head_hits": COUNT,
        "mean_mass": FRACTION,
        "n_heads": COUNT,
        "mean_position": NONNEGATIVE,
        "massive_share": FRACTION,
        "first_massive_layer": Bound(-1),
    }

    token_id: int
    token: str
    occurrences: int
    sink_occurrences: int
    head_hits: int
    mean_mass: float
    n_heads: int
    heads: tuple[str, ...]
    massive_share: float
    first_massive_layer: int
    mean_position: float = math.nan


@dataclass(frozen=True)
class MassiveToken:
    """One token whose residual stream carries massive activations. occurrences: how many
    of its occurrences carry one after some probed layer (at_anchor of them as the
    anchor); first_layer / n_layers: the earliest layer and how many layers show one;
    max_abs: the largest |x| seen on it."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "token_id": COUNT,
        "occurrences": COUNT,
        "at_anchor": COUNT,
        "first_layer": COUNT,
        "n_layers": COUNT,
        "max_abs": NONNEGATIVE,
    }

    token_id: int
    token: str
    occurrences: int
    at_anchor: int
    first_layer: int
    n_layers: int
    max_abs: float


@dataclass(frozen=True)
class SecondarySinks:
    """Secondary sinks (key positions other than the anchor with mean attention from later
    queries >= ``min_mass`` over >= ``min_queries`` queries) and massive-activation
    tokens (|x| > ``massive_abs`` and > ``massive_ratio`` x the prompt's median |x|),
    aggregated by token over ``n_prompts`` prompts (by position for toy inputs)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "min_mass": FRACTION,
        "min_queries": COUNT,
        "massive_abs": NONNEGATIVE,
        "massive_ratio": NONNEGATIVE,
        "n_prompts": COUNT,
        "n_sink_tokens": COUNT,
    }

    min_mass: float
    min_queries: int
    massive_abs: float
    massive_ratio: float
    n_prompts: int
    by_position: bool
    residuals_read: bool
    n_sink_tokens: int
    tokens: tuple[SecondarySinkToken, ...]
    massive: tuple[MassiveToken, ...]

    def with_token_text(self, decode: Callable[[int], str]) -> SecondarySinks:
        """The same result with each token's text from ``decode(token_id)``."""
        if self.by_position:
            return self
        return replace(
            self,
            tokens=tuple(replace(row, token=decode(row.token_id)) for row in self.tokens),
            massive=tuple(replace(row, token=decode(row.token_id)) for row in self.massive),
        )

    def rule(self) -> str:
        """The thresholds in words."""
        return (
            f"a secondary sink is a key other than the anchor whose mean attention from the later queries that see it "
            f"is \u2265 {self.min_mass:g} (over \u2265 {self.min_queries} such queries), in one head and prompt; "
            f"a massive activation is a residual entry with |x| > {self.massive_abs:g} and > {self.massive_ratio:g} "
            "x its prompt's median |x|"
        )

    def to_dataframe(self) -> pandas.DataFrame:
        """One row per secondary-sink token, most sink occurrences first, then most head hits."""
        return dataframe(row_of(row) for row in self.tokens)

    def massive_dataframe(self) -> pandas.DataFrame:
        return dataframe(row_of(row) for row in self.massive)

    def _repr_html_(self) -> str:
        from sinkscope.reports.html import fragment, inline_table

        subtitle = f"{self.n_prompts} prompts; {self.n_sink_tokens} tokens are secondary sinks somewhere"
        parts = [inline_table(SECONDARY_TABLE.table(self.tokens, note=self.rule()))]
        if self.residuals_read:
            parts.append(inline_table(MASSIVE_TABLE.table(self.massive)))
        return fragment("Secondary sinks", subtitle, parts)


def _sink_row(key: int, tally: TokenTally, by_position: bool, residuals_read: bool) -> SecondarySinkToken:
    heads = [f"L{layer}H{head}" for (layer, head), _ in tally.heads.most_common(HEADS_LISTED)]
    share = tally.sink_massive / tally.sink_occurrences if residuals_read and tally.sink_occurrences else math.nan
    first = tally.first_massive_layer
    return SecondarySinkToken(
        token_id=key,
        token=f"position {key}" if by_position else str(key),
        occurrences=tally.occurrences,
        sink_occurrences=tally.sink_occurrences,
        head_hits=tally.head_hits,
        mean_mass=tally.mass / tally.head_hits,
        n_heads=len(tally.heads),
        heads=tuple(heads),
        massive_share=share,
        first_massive_layer=-1 if first == NO_LAYER else first,
        mean_position=tally.sink_offsets / tally.sink_occurrences if tally.sink_occurrences else math.nan,
    )


def _massive_row(key: int, tally: TokenTally, by_position: bool) -> MassiveToken:
    return MassiveToken(
        token_id=key,
        token=f"position {key}" if by_position else str(key),
        occurrences=tally.massive,
        at_anchor=tally.massive_at_anchor,
        first_layer=tally.first_massive_layer,
        n_layers=len(tally.massive_layers),
        max_abs=tally.max_abs,
    )


def secondary_sinks_of(sums: SecondarySinkSums, n_prompts: int, residuals_read: bool) -> SecondarySinks:
    """The persisted summary of ``sums``: the ``KEPT_TOKENS`` tokens that are a sink in most
    occurrences (then most head hits: a token seen once, such as the first word after the
    anchor, can be a sink in many heads and still say nothing about the token), and with most
    massive occurrences."""
    sinks = sorted(
        ((k, t) for k, t in sums.tally.items() if t.head_hits),
        key=lambda kt: (-kt[1].sink_occurrences, -kt[1].head_hits, kt[0]),
    )
    massive = sorted(((k, t) for k, t in sums.tally.items() if t.massive), key=lambda kt: (-kt[1].massive, kt[0]))
    return SecondarySinks(
        min_mass=sums.min_mass,
        min_queries=sums.min_queries,
        massive_abs=sums.massive_abs,
        massive_ratio=sums.massive_ratio,
        n_prompts=n_prompts,
        by_position=sums.by_position,
        residuals_read=residuals_read,
        n_sink_tokens=len(sinks),
        tokens=tuple(_sink_row(k, t, sums.by_position, residuals_read) for k, t in sinks[:KEPT_TOKENS]),
        massive=tuple(_massive_row(k, t, sums.by_position) for k, t in massive[:KEPT_TOKENS]),
    )


SECONDARY_TABLE: TableDefinition[SecondarySinkToken] = TableDefinition(
    "Secondary sinks",
    (
        Column("token"),
        Column("occurrences", numeric=True),
        Column("as a sink", numeric=True),
        Column("mean position", ".1f", numeric=True),
        Column("head hits", numeric=True),
        Column("mean mass", ".3f", numeric=True),
        Column("heads", numeric=True),
        Column("most used in"),
        Column("with massive activation", ".0%", numeric=True),
        Column("first massive layer", numeric=True),
    ),
    lambda row: (
        row.token,
        row.occurrences,
        row.sink_occurrences,
        row.mean_position,
        row.head_hits,
        row.mean_mass,
        row.n_heads,
        ", ".join(row.heads),
        row.massive_share,
        None if row.first_massive_layer < 0 else row.first_massive_layer,
    ),
    "occurrences: over every prompt; as a sink: occurrences that are a secondary sink in at least one head; "
    "mean position: their mean distance from the anchor (1: the token right after it); "
    "head hits: (occurrence, head) pairs; mean mass: mean over those pairs of the mean attention from later "
    "queries; with massive activation: share of the sink occurrences whose residual stream carries one.",
)

MASSIVE_TABLE: TableDefinition[MassiveToken] = TableDefinition(
    "Tokens carrying massive activations",
    (
        Column("token"),
        Column("occurrences", numeric=True),
        Column("as the anchor", numeric=True),
        Column("first layer", numeric=True),
        Column("layers", numeric=True),
        Column("max |x|", ",.0f", numeric=True),  # every value is above the massive threshold (> 100)
    ),
    lambda row: (row.token, row.occurrences, row.at_anchor, row.first_layer, row.n_layers, row.max_abs),
    "occurrences: token occurrences whose residual stream (after a probed block) has a massive entry; "
    "first layer: the earliest block after which one appears; layers: how many blocks show one.",
)


def secondary_sinks(result: object) -> SecondarySinks:
    """The ``SecondarySinks`` of a ``ProbeResult`` or of any result holding one as ``.probe``
    (an ``AuditResult``); an ``InputError`` when the probe did not gather them."""
    from sinkscope.infra.errors import InputError

    probe = getattr(result, "probe", result)
    found = getattr(probe, "secondary_sinks", None)
    if found is None:
        raise InputError(
            "this result has no secondary sinks; probe with ProbeConfig(with_secondary_sinks=True) "
            "or audit with AuditConfig(secondary_sinks=True)"
        )
    return found
