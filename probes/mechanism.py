"""Toy models and pretrained models side by side: the shared probes of every sink head.

The paper's mechanism question is what a sink head writes. In the trigger task a softmax
sink head parks its attention on BOS and (value-weighted) almost all of what it writes
comes from BOS; with a residual stream, the layers' outputs then cancel at the default
positions. In a pretrained LM the expectation is the other way round: the anchor takes
the attention but its value is small, so it contributes little. ``compare_mechanisms``
puts the numbers that decide this in one table, from ``ProbeResult``s only (any hooked
model, toy or pretrained): per sink head, the anchor mass, the value-weighted anchor
share, the anchor's value norm, the dormant flag and its layer's output norms; per model,
the attention output of all layers summed against the sum of their norms.

Gathering ``ProbeResult``s from directories (toy runs, audits) is the top package's job
(``sinkscope.mechanism``); this module only builds the table.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from sinkscope.infra.bounds import COUNT, FRACTION, NONNEGATIVE, POSITIVE, Bound, Problem, at_most
from sinkscope.infra.codec import Upgrade, read_result
from sinkscope.infra.errors import InputError
from sinkscope.probes.mechanism_rules import CANCELS_BELOW, KINDS, WRITES_ANCHOR_SHARE
from sinkscope.probes.probe import ProbeResult
from sinkscope.probes.sink_metrics import is_sink_head
from sinkscope.reports.frames import dataframe, row_of

if TYPE_CHECKING:
    import pandas

MECHANISM_FILE = "mechanism.json"


@dataclass(frozen=True)
class MechanismSource:
    """One probed model to compare (in memory): ``label`` names it in the table, ``kind``
    is ``"toy"`` or ``"pretrained"``, ``model`` says what it is, ``origin`` how its probe
    was obtained (read from a file, computed, passed in), ``directory`` where it came from."""

    label: str
    kind: str
    model: str
    probe: ProbeResult
    origin: str = "passed in memory"
    directory: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}", field="kind")
        if not self.label:
            raise InputError("every source needs a label; name it (e.g. the run or model name)", field="label")


@dataclass(frozen=True)
class MechanismHead:
    """One sink head: the ``HeadProbe`` values of the shared probes, and its layer's
    ``LayerProbe`` output norms (``layer_attn_out_norm`` = ||sum of the layer's heads||,
    ``layer_head_out_norm_sum`` = sum of the heads' norms: far apart when the heads cancel)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "layer": COUNT,
        "head": COUNT,
        "anchor_mass": NONNEGATIVE,
        "value_weighted_anchor_share": FRACTION,
        "anchor_value_norm": NONNEGATIVE,
        "head_out_norm": NONNEGATIVE,
        "layer_attn_out_norm": NONNEGATIVE,
        "layer_head_out_norm_sum": NONNEGATIVE,
    }

    source: str
    kind: str
    layer: int
    head: int
    anchor_mass: float
    value_weighted_anchor_share: float
    anchor_value_norm: float
    head_out_norm: float
    dormant: bool
    layer_attn_out_norm: float
    layer_head_out_norm_sum: float


@dataclass(frozen=True)
class MechanismModel:
    """One compared model. ``attn_out_norm_of_sum`` / ``attn_out_sum_of_norms``: the
    probe's ||sum over layers of attn_out|| and sum over layers of ||attn_out||;
    ``cancellation`` is their ratio (1: nothing cancels; near 0: the layers undo each
    other; NaN without values). The sink-head means are NaN without sink heads."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "n_layers": POSITIVE,
        "n_heads": POSITIVE,
        "n_inputs": COUNT,
        "sink_eps": FRACTION,
        "n_sink_heads": COUNT,
        "n_dormant_sink_heads": COUNT,
        "sink_anchor_mass": NONNEGATIVE,
        "sink_value_weighted_anchor_share": FRACTION,
        "sink_anchor_value_norm": NONNEGATIVE,
        "attn_out_norm_of_sum": NONNEGATIVE,
        "attn_out_sum_of_norms": NONNEGATIVE,
        "cancellation": NONNEGATIVE,
    }

    source: str
    kind: str
    model: str
    origin: str
    directory: str | None
    attention: str
    n_layers: int
    n_heads: int
    n_inputs: int
    sink_eps: float  # sink heads: anchor_mass >= 1 - sink_eps
    n_sink_heads: int
    n_dormant_sink_heads: int
    sink_anchor_mass: float
    sink_value_weighted_anchor_share: float
    sink_anchor_value_norm: float
    attn_out_norm_of_sum: float
    attn_out_sum_of_norms: float
    cancellation: float

    def inconsistencies(self) -> Iterator[Problem]:
        """Sink heads among the model's heads, dormant ones among the sink heads."""
        yield from at_most("n_sink_heads", self.n_sink_heads, self.n_layers * self.n_heads, "n_layers x n_heads")
        yield from at_most("n_dormant_sink_heads", self.n_dormant_sink_heads, self.n_sink_heads, "n_sink_heads")

    @property
    def writes_anchor(self) -> bool | None:
        """Whether its sink heads' output comes mostly from the anchor (None without sink heads)."""
        if self.n_sink_heads == 0 or math.isnan(self.sink_value_weighted_anchor_share):
            return None
        return self.sink_value_weighted_anchor_share >= WRITES_ANCHOR_SHARE

    @property
    def layers_cancel(self) -> bool | None:
        """Whether the layers cancel (None for one layer, where nothing can, or unmeasured)."""
        if self.n_layers < 2 or math.isnan(self.cancellation):
            return None
        return self.cancellation < CANCELS_BELOW


def upgrade_mechanism_v1(comparison: dict[str, Any]) -> dict[str, Any]:
    """``mechanism.json`` of schema version 1 in version 2's names: each model row's
    ``attention_kind`` is ``attention``."""
    models = [
        {("attention" if key == "attention_kind" else key): value for key, value in model.items()}
        for model in comparison.get("models", [])
    ]
    return {**comparison, "models": models}


@dataclass(frozen=True)
class MechanismComparison:
    """Toy and pretrained models' sink heads side by side; persisted as ``mechanism.json``
    (``sinkscope.infra.codec``). ``models`` in the order given; ``heads``: every sink head of every
    model, in that order."""

    SCHEMA: ClassVar[str] = "mechanism"
    SCHEMA_VERSION: ClassVar[int] = 2  # 2: MechanismModel.attention
    UPGRADES: ClassVar[dict[int, Upgrade]] = {1: upgrade_mechanism_v1}

    models: tuple[MechanismModel, ...]
    heads: tuple[MechanismHead, ...]
    notes: tuple[str, ...] = field(default=())

    def inconsistencies(self) -> Iterator[Problem]:
        """At least one model; every sink head belongs to one of them."""
        if not self.models:
            yield "models", "empty", "one row per model compared (at least one)"
        sources = {model.source for model in self.models}
        for index, head in enumerate(self.heads):
            if head.source not in sources:
                yield f"heads[{index}].source", repr(head.source), "the source of one of the models"

    def model(self, source: str) -> MechanismModel:
        for row in self.models:
            if row.source == source:
                return row
        raise InputError(f"no source {source!r} in this comparison; choose one of {[m.source for m in self.models]}")

    def head_pairs(self) -> list[tuple[MechanismHead, MechanismModel]]:
        """Every sink head beside the model it belongs to, in order."""
        by_source = {row.source: row for row in self.models}
        return [(head, by_source[head.source]) for head in self.heads]

    def _repr_html_(self) -> str:
        """Inline display in a notebook: the findings, one row per model, every sink head."""
        from sinkscope.probes.mechanism_display import mechanism_html  # the display imports this module's types

        return mechanism_html(self)

    def to_dataframe(self) -> pandas.DataFrame:
        """One row per sink head: its source's model, attention kind and cancellation
        beside every ``MechanismHead`` column."""
        by_source = {row.source: row for row in self.models}
        return dataframe(
            row_of(
                head,
                model=by_source[head.source].model,
                attention=by_source[head.source].attention,
                attn_out_norm_of_sum=by_source[head.source].attn_out_norm_of_sum,
                attn_out_sum_of_norms=by_source[head.source].attn_out_sum_of_norms,
                cancellation=by_source[head.source].cancellation,
            )
            for head in self.heads
        )

    def models_dataframe(self) -> pandas.DataFrame:
        """One row per compared model (also those without sink heads)."""
        return dataframe(row_of(row) for row in self.models)


def _mean(values: Sequence[float]) -> float:
    finite = [value for value in values if not math.isnan(value)]
    return sum(finite) / len(finite) if finite else math.nan


def unique_labels(labels: Sequence[str]) -> tuple[str, ...]:
    """``labels`` with repeats numbered (``run``, ``run (2)``): rows are keyed by label."""
    seen: list[str] = []
    for label in labels:
        name, number = label, 2
        while name in seen:
            name, number = f"{label} ({number})", number + 1
        seen.append(name)
    return tuple(seen)


def _model_row(
    source: MechanismSource, label: str, sink_eps: float | None
) -> tuple[MechanismModel, tuple[MechanismHead, ...]]:
    probe = source.probe
    layers = {layer.layer: layer for layer in probe.layers}
    eps = probe.config.sink_eps if sink_eps is None else sink_eps
    # re-thresholded from the stored anchor mass (NaN is never a sink), so models probed
    # with different sink_eps can be compared at one threshold
    sinks = [head for head in probe.heads if is_sink_head(head.anchor_mass, eps)]
    heads = tuple(
        MechanismHead(
            source=label,
            kind=source.kind,
            layer=head.layer,
            head=head.head,
            anchor_mass=head.anchor_mass,
            value_weighted_anchor_share=head.value_weighted_anchor_share,
            anchor_value_norm=head.anchor_value_norm,
            head_out_norm=head.head_out_norm,
            dormant=head.dormant,
            layer_attn_out_norm=layers[head.layer].attn_out_norm if head.layer in layers else math.nan,
            layer_head_out_norm_sum=layers[head.layer].head_out_norm_sum if head.layer in layers else math.nan,
        )
        for head in sinks
    )
    of_sum, sum_of = probe.attn_out_norm_of_sum, probe.attn_out_sum_of_norms
    model = MechanismModel(
        source=label,
        kind=source.kind,
        model=source.model,
        origin=source.origin,
        directory=source.directory,
        attention=probe.model.attention,
        n_layers=probe.model.n_layers,
        n_heads=probe.model.n_heads,
        n_inputs=probe.n_inputs,
        sink_eps=eps,
        n_sink_heads=len(sinks),
        n_dormant_sink_heads=sum(head.dormant for head in sinks),
        sink_anchor_mass=_mean([head.anchor_mass for head in sinks]),
        sink_value_weighted_anchor_share=_mean([head.value_weighted_anchor_share for head in sinks]),
        sink_anchor_value_norm=_mean([head.anchor_value_norm for head in sinks]),
        attn_out_norm_of_sum=of_sum,
        attn_out_sum_of_norms=sum_of,
        cancellation=of_sum / sum_of if sum_of > 0 else math.nan,  # NaN (not measured) compares False too
    )
    return model, heads


def compare_mechanisms(
    sources: Sequence[MechanismSource], notes: Sequence[str] = (), sink_eps: float | None = None
) -> MechanismComparison:
    """One ``MechanismModel`` per source (in order) and one ``MechanismHead`` per sink head.
    ``sink_eps``: a head is a sink head when its anchor mass is >= 1 - sink_eps; None keeps
    each probe's own threshold (the paper's 0.1 by default, which few heads of a real LM
    reach: a looser one, e.g. 0.5, compares the heads that park most of their attention)."""
    if sink_eps is not None and not 0.0 <= sink_eps < 1.0:
        raise InputError(f"sink_eps must lie in [0, 1), got {sink_eps}", field="sink_eps")
    if not sources:
        raise InputError("nothing to compare; pass at least one toy run or audit")
    labels = unique_labels([source.label for source in sources])
    models: list[MechanismModel] = []
    heads: list[MechanismHead] = []
    for source, label in zip(sources, labels):
        model, model_heads = _model_row(source, label, sink_eps)
        models.append(model)
        heads.extend(model_heads)
    return MechanismComparison(models=tuple(models), heads=tuple(heads), notes=tuple(notes))


def read_mechanism(directory: str | os.PathLike) -> MechanismComparison:
    """``directory/mechanism.json`` read back."""
    return read_result(Path(directory) / MECHANISM_FILE, MechanismComparison, "regenerate it with sinkscope compare")
