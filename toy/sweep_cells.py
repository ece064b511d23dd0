"""The cells of a sweep's grid and their rows: one configuration (``Cell``) and what its
seeds measured together (``SweepRow``, a row of ``summary.json``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from sinkscope.infra.bounds import COUNT, FRACTION, NONNEGATIVE, POSITIVE, Bound, Problem, at_most


@dataclass(frozen=True)
class Cell:
    """One configuration of the grid."""

    attention: str
    n_layers: int
    n_heads: int
    d_model: int
    seq_len: int
    layer_norm: bool = False
    mlp: bool = False

    @property
    def extras(self) -> str:
        return "".join(suffix for flag, suffix in ((self.layer_norm, "-ln"), (self.mlp, "-mlp")) if flag)

    def run_name(self, seed: int) -> str:
        return (
            f"{self.attention}-{self.n_layers}x{self.n_heads}-d{self.d_model}-L{self.seq_len}{self.extras}-seed{seed}"
        )


@dataclass
class SweepRow:
    """One configuration, aggregated over its seeds. ``sink_fraction``: the share of all
    its heads (over seeds) with ``anchor_mass_default >= 0.9``; steps and seconds are
    means over seeds. ``*_range``: the smallest and largest value over the seeds (per
    seed, the sink fraction is that model's share of sink heads); ``mean_default_mse``:
    the mean over seeds of the MSE at default (non-trigger) positions. A row is
    ``finished`` only when every seed converged; otherwise its numbers are where training
    stopped at the step cap, not what the configuration learns."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "n_layers": POSITIVE,
        "n_heads": POSITIVE,
        "d_model": POSITIVE,
        "seq_len": POSITIVE,
        "seeds": POSITIVE,
        "converged": COUNT,
        "mean_steps": NONNEGATIVE,
        "mean_seconds": NONNEGATIVE,
        "sink_fraction": FRACTION,
        "mean_anchor_mass_default": NONNEGATIVE,
        "seeds_with_sink": COUNT,
        "sink_fraction_range": FRACTION,
        "steps_range": COUNT,
        "mean_default_mse": NONNEGATIVE,
        "default_mse_range": NONNEGATIVE,
        "mean_row_mass": NONNEGATIVE,
    }

    attention: str
    n_layers: int
    n_heads: int
    d_model: int
    seq_len: int
    seeds: int
    converged: int
    mean_steps: float
    mean_seconds: float
    sink_fraction: float
    mean_anchor_mass_default: float
    seeds_with_sink: int
    layer_norm: bool = False
    mlp: bool = False
    sink_fraction_range: tuple[float, float] | None = None
    steps_range: tuple[int, int] | None = None
    mean_default_mse: float | None = None
    default_mse_range: tuple[float, float] | None = None
    # mean total weight of a default query's row over heads and seeds: 1 under softmax, free
    # under ReLU and sigmoid, where anchor_mass alone does not say what share BOS gets
    mean_row_mass: float | None = None

    def inconsistencies(self) -> Iterator[Problem]:
        """Counts over seeds of at most the number of seeds."""
        yield from at_most("converged", self.converged, self.seeds, "seeds")
        yield from at_most("seeds_with_sink", self.seeds_with_sink, self.seeds, "seeds")

    @property
    def finished(self) -> bool:
        """Every seed converged before the step cap: only then are its numbers a result."""
        return self.converged == self.seeds

    @property
    def status(self) -> str:
        """``converged`` or ``at step cap (k/n converged)``: how far a reader may trust the row."""
        return "converged" if self.finished else f"at step cap ({self.converged}/{self.seeds} converged)"

    @property
    def label(self) -> str:
        extras = "".join(text for flag, text in ((self.layer_norm, " +LN"), (self.mlp, " +MLP")) if flag)
        return f"{self.attention} {self.n_layers}x{self.n_heads} d{self.d_model} L{self.seq_len}{extras}"


def upgrade_sweep_row_v1(row: dict[str, Any]) -> dict[str, Any]:
    """A ``SweepRow`` of schema version 1 in today's names: its counts ``layers``/``heads``
    are ``n_layers``/``n_heads``."""
    names = {"layers": "n_layers", "heads": "n_heads"}
    return {names.get(key, key): value for key, value in row.items()}


def find_row(
    rows: list[SweepRow],
    attention: str,
    layers: int,
    heads: int,
    d_model: int,
    seq_len: int,
    layer_norm: bool,
    mlp: bool,
) -> SweepRow:
    key = (attention, layers, heads, d_model, seq_len, layer_norm, mlp)
    return next(
        r for r in rows if (r.attention, r.n_layers, r.n_heads, r.d_model, r.seq_len, r.layer_norm, r.mlp) == key
    )
