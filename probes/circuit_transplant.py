"""The sink transplant: can a later token become a sink by being made to attend only to
itself, as the first token must (being first, it sees only itself)?

In the first ``n_layers`` layers, every head's row of position p becomes one-hot on p
itself (a pattern edit at ``hook_pattern``). The readout is, per head of the layers after
them, the mass that later queries put on p (the mean of A[i, p] over real queries i > p,
then over inputs), and how many heads reach the sink rule on p (>= 1 - sink_eps). The
control scales p's residual stream after those layers by the factor the transplant changed
its norm by (per input), without changing what p attended to: a norm alone is not a sink.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from jaxtyping import Float

from sinkscope.infra.bounds import COUNT, NONNEGATIVE, Bound
from sinkscope.infra.errors import InputError
from sinkscope.interp.hook_names import block_hook, pattern_hook
from sinkscope.interp.hooked_model import FwdHooks, HookedModel, PreparedBatch
from sinkscope.probes.default_state import Estimate, bootstrap
from sinkscope.probes.pattern_edits import one_hot_rows


@dataclass(frozen=True)
class TransplantResult:
    """The transplant of ``position`` in the first ``n_layers`` layers: ``mass_on_position``
    (mean over the later layers' heads and over inputs of the mass later queries put on it)
    at baseline, under the transplant and under the norm control, each with its interval
    over inputs; how many of those heads pass the sink rule on it; which ones did under the
    transplant."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "position": COUNT,
        "n_layers": COUNT,
        "n_heads_read": COUNT,
        "sink_heads_baseline": COUNT,
        "sink_heads_transplant": COUNT,
        "sink_heads_control": COUNT,
        "norm_factor": NONNEGATIVE,
    }

    position: int
    n_layers: int
    n_heads_read: int
    baseline: Estimate
    transplant: Estimate
    control: Estimate
    sink_heads_baseline: int
    sink_heads_transplant: int
    sink_heads_control: int
    new_sink_heads: tuple[tuple[int, int], ...]
    norm_factor: float  # the mean over inputs of the control's scale on p's residual


def _transplant_hook(position: int, batch: PreparedBatch, n_heads: int) -> Callable[..., torch.Tensor]:
    rows = torch.zeros_like(batch.attention_mask)
    rows[:, position] = True
    key = torch.full_like(batch.anchor, position)

    def hook(pattern: Float[torch.Tensor, "batch head query key"], hook: Any) -> torch.Tensor:
        return one_hot_rows(pattern, key.to(pattern.device), rows.to(pattern.device), range(n_heads))

    return hook


def _scale_hook(position: int, factor: torch.Tensor) -> Callable[..., torch.Tensor]:
    def hook(resid: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> torch.Tensor:
        scaled = resid.clone()
        scaled[:, position] = resid[:, position] * factor.to(resid.device, resid.dtype).unsqueeze(-1)
        return scaled

    return hook


def _read(
    model: HookedModel, batch: PreparedBatch, position: int, n_layers: int, edits: FwdHooks
) -> tuple[Float[torch.Tensor, "batch head"], Float[torch.Tensor, " batch"]]:
    """Per input: each later head's mean mass on ``position`` from later real queries
    ``[batch, head]`` (layers after the edited ones, flattened), and the norm of
    ``position``'s residual after the edited layers ``[batch]``."""
    spec = model.spec
    masses: list[torch.Tensor] = []
    norms: list[torch.Tensor] = []
    later = batch.attention_mask.clone()
    later[:, : position + 1] = False
    weights = later.double().unsqueeze(1)

    def mass(pattern: torch.Tensor, hook: Any) -> None:
        on_p = pattern[:, :, :, position].double() * weights.to(pattern.device)
        masses.append((on_p.sum(-1) / weights.sum(-1).clamp_min(1.0).to(pattern.device)).cpu())

    def norm(resid: torch.Tensor, hook: Any) -> None:
        norms.append(resid[:, position].double().norm(dim=-1).cpu())

    hooks: FwdHooks = [*edits, (block_hook(n_layers - 1, "resid_post"), norm)]
    hooks += [(pattern_hook(layer), mass) for layer in range(n_layers, spec.n_layers)]
    with torch.no_grad():
        model.run_with_hooks(batch, hooks)
    return torch.cat(masses, dim=1), norms[0]


def transplant_test(
    model: HookedModel,
    batches: Sequence[PreparedBatch],
    position: int,
    n_layers: int,
    sink_eps: float,
    n_bootstrap: int,
    seed: int,
) -> TransplantResult:
    """Transplant ``position`` in the first ``n_layers`` layers, and the norm control."""
    spec = model.spec
    if not 1 <= n_layers < spec.n_layers:
        raise InputError(
            f"the transplant edits the first n layers and reads the rest: n must lie in [1, {spec.n_layers - 1}], "
            f"got {n_layers}",
            field="transplant_layers",
        )
    if not spec.pattern_writable:
        raise InputError("this model's attention patterns are read-only; the transplant edits them")
    parts: dict[str, list[torch.Tensor]] = {"baseline": [], "moved": [], "control": [], "factor": []}
    for batch in batches:
        base, base_norm = _read(model, batch, position, n_layers, [])
        edits = [(pattern_hook(layer), _transplant_hook(position, batch, spec.n_heads)) for layer in range(n_layers)]
        moved, moved_norm = _read(model, batch, position, n_layers, edits)
        factor = moved_norm / base_norm.clamp_min(1e-12)
        scale = [(block_hook(n_layers - 1, "resid_post"), _scale_hook(position, factor))]
        scaled, _ = _read(model, batch, position, n_layers, scale)
        for name, value in (("baseline", base), ("moved", moved), ("control", scaled), ("factor", factor)):
            parts[name].append(value)
    per_head = {name: torch.cat(values) for name, values in parts.items()}
    heads = [(layer, head) for layer in range(n_layers, spec.n_layers) for head in range(spec.n_heads)]

    def summary(name: str) -> tuple[Estimate, torch.Tensor]:
        values = per_head[name]
        estimate = bootstrap(values.mean(1), n_bootstrap, torch.Generator().manual_seed(seed))
        return estimate, values.mean(0) >= 1 - sink_eps

    baseline, base_sinks = summary("baseline")
    transplanted, moved_sinks = summary("moved")
    control, control_sinks = summary("control")
    return TransplantResult(
        position=position,
        n_layers=n_layers,
        n_heads_read=len(heads),
        baseline=baseline,
        transplant=transplanted,
        control=control,
        sink_heads_baseline=int(base_sinks.sum()),
        sink_heads_transplant=int(moved_sinks.sum()),
        sink_heads_control=int(control_sinks.sum()),
        new_sink_heads=tuple(
            head for head, new, old in zip(heads, moved_sinks, base_sinks, strict=True) if new and not old
        ),
        norm_factor=float(per_head["factor"].mean()),
    )
