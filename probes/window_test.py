"""The streaming window test, for any hooked model: a loss per position under each mask of
``sinkscope.probes.window_masks``, summarised per setting with intervals over units.

The caller supplies the units (text chunks of a language model, sequences of the toy task)
as prepared batches and a per-position loss; ``run_window_test`` runs every setting on
every unit and ``WindowTestResult`` keeps, per setting, the mean loss over the scored
positions (those from ``scored_from`` on, where every restricted setting hides keys and the
control has S keys to draw from) with a percentile bootstrap interval over units, the
paired increase over full attention, and the per-position curve (mean over units).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from sinkscope.infra.bounds import COUNT, NONNEGATIVE, POSITIVE, UNBOUNDED, Bound
from sinkscope.infra.errors import InputError
from sinkscope.interp.hooked_model import HookedModel, PreparedBatch
from sinkscope.interp.visibility import layer_reach
from sinkscope.probes.default_state import Estimate, bootstrap
from sinkscope.probes.window_masks import WindowSetting, allowed_keys, window_hooks

if TYPE_CHECKING:
    import pandas

# a per-position loss [batch, pos] from the model's output on a batch
PositionLoss = Callable[[torch.Tensor, PreparedBatch], torch.Tensor]


@dataclass(frozen=True)
class SettingLoss:
    """One setting's loss: ``loss``, the mean over units of each unit's mean over the scored
    positions; ``increase``, the paired increase over full attention (unit by unit)."""

    setting: WindowSetting
    loss: Estimate
    increase: Estimate


@dataclass(frozen=True)
class WindowTestResult:
    """The window test of ``model`` on ``source``: ``n_units`` units (``unit``: what one is,
    e.g. a text chunk) of ``n_positions`` scored-or-not positions each; ``loss_name``: what
    the loss is. ``curves[k][i]``: setting k's loss at position i, mean over units.
    ``seconds``: the forward passes' wall time for ``tokens`` positions in all."""

    SCHEMA: ClassVar[str] = "window_test"
    SCHEMA_VERSION: ClassVar[int] = 1
    BOUNDS: ClassVar[dict[str, Bound]] = {
        "n_units": POSITIVE,
        "n_positions": POSITIVE,
        "scored_from": COUNT,
        "seed": UNBOUNDED,
        "n_bootstrap": POSITIVE,
        "curves": UNBOUNDED,
        "seconds": NONNEGATIVE,
        "tokens": COUNT,
    }

    model: str
    source: str
    unit: str
    loss_name: str
    n_units: int
    n_positions: int
    scored_from: int
    seed: int
    n_bootstrap: int
    rows: tuple[SettingLoss, ...]
    curves: tuple[tuple[float, ...], ...]
    seconds: float
    tokens: int
    notes: tuple[str, ...] = ()  # what the reader needs to read the settings (the model's own window)

    @property
    def seconds_per_1k_tokens(self) -> float:
        """Wall time per 1,000 positions forwarded (every setting's pass counted)."""
        return 1000.0 * self.seconds / self.tokens if self.tokens else math.nan

    def row(self, label: str) -> SettingLoss:
        for row in self.rows:
            if row.setting.label == label:
                return row
        raise InputError(f"no setting {label!r}; settings: {', '.join(r.setting.label for r in self.rows)}")

    def to_dataframe(self) -> pandas.DataFrame:
        """One row per setting: its kind, W, S, mean loss and interval, increase over full."""
        from sinkscope.probes.window_report import window_rows
        from sinkscope.reports.frames import dataframe

        return dataframe(window_rows(self))

    def _repr_html_(self) -> str:
        from sinkscope.probes.window_report import window_html

        return window_html(self)


def scored_from(settings: Sequence[WindowSetting]) -> int:
    """The first query position every restricted setting narrows, with S candidates left for
    the random control: max(W + 2S) over the settings (0 with full attention only)."""
    return max((s.window + 2 * s.sinks for s in settings if s.kind != "full"), default=0)


def position_losses(
    hooked: HookedModel,
    batches: Sequence[PreparedBatch],
    setting: WindowSetting,
    loss: PositionLoss,
    seed: int,
) -> torch.Tensor:
    """``[unit, pos]`` losses of every unit of ``batches`` under ``setting``'s mask."""
    rows = []
    for batch in batches:
        hooks = window_hooks(hooked, allowed_keys(setting, batch.n_pos, seed))
        with torch.no_grad():
            rows.append(loss(hooked.run_with_hooks(batch, hooks), batch).double().cpu())
    return torch.cat(rows)


@dataclass(frozen=True)
class WindowRun:
    """What a window test ran on: the model's label, the source's description, what one
    unit is, what the loss measures, and how many positions at a unit's end have no loss
    (``shift``: 1 for a next-token loss, whose last token predicts nothing)."""

    model: str
    source: str
    unit: str
    loss_name: str
    shift: int = 0


def own_window_notes(hooked: HookedModel) -> tuple[str, ...]:
    """A note when the model limits attention itself (sliding windows, chunks): in those
    layers no setting shows a query more than the model does, so a W at or beyond the
    model's own window equals full attention there, and the first tokens are already hidden
    from queries further on than it."""
    spec = hooked.spec
    reaches = [layer_reach(spec, layer) for layer in range(spec.n_layers)]
    limited = [(layer, reach) for layer, reach in enumerate(reaches) if any(reach)]
    if not limited:
        return ()
    sizes = sorted({size for _, reach in limited for size in reach if size})
    return (
        f"The model limits attention itself in {len(limited)} of {spec.n_layers} layers (windows or chunks of "
        f"{', '.join(map(str, sizes))} keys): there no setting shows a query more than the model does, so a W at or "
        "beyond that size equals full attention in those layers, and the first tokens are hidden from queries "
        "further on than it whatever the setting.",
    )


def run_window_test(
    hooked: HookedModel,
    batches: Sequence[PreparedBatch],
    settings: Sequence[WindowSetting],
    loss: PositionLoss,
    run: WindowRun,
    seed: int = 0,
    n_bootstrap: int = 1000,
    tick: Callable[[], None] = lambda: None,
) -> WindowTestResult:
    """Every setting on every unit; ``settings[0]`` must be full attention (the baseline of
    the increases). ``tick`` is called once per setting (a progress bar)."""
    if not settings or settings[0].kind != "full":
        raise InputError("the first window setting must be full attention, the baseline of the increases")
    first = scored_from(settings)
    n_positions = batches[0].n_pos - run.shift if batches else 0
    if n_positions <= first:
        raise InputError(
            f"units of {n_positions} scored positions leave none from position {first} (= max W + 2S) on; "
            "use longer chunks or smaller --windows/--sinks",
            field="windows",
        )
    started, per_setting = time.perf_counter(), []
    for setting in settings:
        per_setting.append(position_losses(hooked, batches, setting, loss, seed))
        tick()
    seconds = time.perf_counter() - started
    unit_means = [losses[:, first:].mean(dim=1) for losses in per_setting]
    rows = tuple(
        SettingLoss(
            setting,
            # one seed per setting: the same resamples, so the intervals pair unit by unit
            bootstrap(means, n_bootstrap, torch.Generator().manual_seed(seed)),
            bootstrap(means - unit_means[0], n_bootstrap, torch.Generator().manual_seed(seed)),
        )
        for setting, means in zip(settings, unit_means, strict=True)
    )
    return WindowTestResult(
        model=run.model,
        source=run.source,
        unit=run.unit,
        loss_name=run.loss_name,
        n_units=int(unit_means[0].shape[0]),
        n_positions=n_positions,
        scored_from=first,
        seed=seed,
        n_bootstrap=n_bootstrap,
        rows=rows,
        curves=tuple(tuple(float(v) for v in losses.mean(dim=0)) for losses in per_setting),
        seconds=seconds,
        tokens=sum(batch.batch_size * batch.n_pos for batch in batches) * len(settings),
        notes=own_window_notes(hooked),
    )
