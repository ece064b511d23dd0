"""The sink-circuit battery: every circuit edit (``sinkscope.probes.circuit_edits``) beside
its matched control, on one model and one input set, read out as the share of the sink
heads' baseline anchor mass that the edit leaves, and the change in the model's error.

Readouts (docs/metrics.md, "Sink circuit"): an input's anchor mass for a head is the mean
of A[i, anchor] over its real queries after the anchor; the share left is
sum over inputs of the edited mass / sum of the baseline mass (per head, and for the mean
over sink heads), with a paired percentile bootstrap over inputs; the error change is the
mean over inputs of edited minus baseline error, bootstrapped likewise. An edit the model
cannot take is a row marked not applicable, with the reason, never left out.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from jaxtyping import Float

from sinkscope.infra.arguments import check_argument
from sinkscope.infra.errors import InputError
from sinkscope.interp.hook_names import pattern_hook
from sinkscope.interp.hooked_model import FwdHooks, HookedModel, PreparedBatch
from sinkscope.probes.circuit_edits import CircuitEdit, HeadRef, applicability, edit_hooks, key_input_hook
from sinkscope.probes.circuit_result import CircuitBattery, CircuitConfig, CircuitRow, EditOutcome, HeadShare
from sinkscope.probes.circuit_transplant import TransplantResult, transplant_test
from sinkscope.probes.default_state import bootstrap, ratio_bootstrap
from sinkscope.probes.sink_metrics import SINK_EPS, column, queries_after_anchor

OFFSET = 256  # rotary positions start here in offset_positions: far from 0, inside common contexts
ErrorFn = Callable[[torch.Tensor, PreparedBatch], torch.Tensor]


@dataclass(frozen=True)
class Readout:
    """Per input: each sink head's anchor mass ``[n, sink_head]`` and the error ``[n]``."""

    anchor_mass: Float[torch.Tensor, "n sink_head"]
    error: Float[torch.Tensor, " n"] | None


def _batches(model: HookedModel, inputs: object, attention_mask: torch.Tensor | None, size: int) -> list[PreparedBatch]:
    if isinstance(inputs, list | tuple):
        strings = list(inputs)
        if not strings or not all(isinstance(text, str) for text in strings):
            raise InputError("inputs must be a non-empty list of strings, token ids [batch, pos] or toy tokens")
        return [
            model.prepare(strings[start : start + size], padding_side="right") for start in range(0, len(strings), size)
        ]
    if not isinstance(inputs, torch.Tensor) or inputs.shape[0] == 0:
        raise InputError("inputs must be a non-empty list of strings, token ids [batch, pos] or toy tokens")
    if attention_mask is not None:
        mask = attention_mask.bool()
        if mask.ndim != 2 or bool((mask[:, 1:] & ~mask[:, :-1]).any()):
            raise InputError("attention_mask must be right-padded: each row's real tokens first, then padding only")
    return [
        model.prepare(
            inputs[start : start + size], None if attention_mask is None else attention_mask[start : start + size]
        )
        for start in range(0, int(inputs.shape[0]), size)
    ]


def _mass_hook(heads: list[int], sink_rows: list[torch.Tensor], batch: PreparedBatch) -> Callable[..., None]:
    def hook(pattern: Float[torch.Tensor, "batch head query key"], hook: object) -> None:
        to_anchor = column(pattern[:, heads].double(), batch.anchor.to(pattern.device))
        after = queries_after_anchor(
            pattern.shape[2], batch.anchor, pattern.shape[0], batch.attention_mask, pattern.device
        )
        weights = after.double().unsqueeze(1)
        sink_rows.append((to_anchor * weights).sum(-1) / weights.sum(-1).clamp_min(1.0))

    return hook


def _counted(hooks: FwdHooks, fired: set[str]) -> FwdHooks:
    """``hooks``, each recording its name in ``fired`` when it runs: an edit whose hook
    point exists but never fires would otherwise read as an edit that changes nothing."""

    def counted(name: str, hook: Callable[..., Any]) -> Callable[..., Any]:
        def run(tensor: torch.Tensor, **kwargs: Any) -> Any:
            fired.add(name)
            return hook(tensor, **kwargs)

        return run

    return [(name, counted(name, hook)) for name, hook in hooks]


def anchor_mass_readout(
    model: HookedModel,
    batches: Sequence[PreparedBatch],
    sink_heads: Sequence[HeadRef],
    edit: CircuitEdit | None,
    error_fn: ErrorFn | None,
) -> Readout:
    layers = sorted({layer for layer, _ in sink_heads})
    masses, errors = [], []
    for batch in batches:
        by_layer: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
        fired: set[str] = set()
        edits: FwdHooks = [] if edit is None else edit_hooks(model, batch, edit)
        hooks = _counted(edits, fired)
        for layer in layers:
            heads = [head for at, head in sink_heads if at == layer]
            hooks.append((pattern_hook(layer), _mass_hook(heads, by_layer[layer], batch)))
        with torch.no_grad():
            output = model.run_with_hooks(batch, hooks)
        if edit is not None and len(fired) < len({name for name, _ in edit_hooks(model, batch, edit)}):
            raise RuntimeError(
                f"{edit.kind}: a hook it edits at never fired ({sorted(fired)} fired); the edit did nothing"
            )
        masses.append(torch.cat([by_layer[layer][0] for layer in layers], dim=1).cpu())
        if error_fn is not None:
            errors.append(error_fn(output, batch).double().cpu())
    return Readout(torch.cat(masses), torch.cat(errors) if error_fn is not None else None)


def top_key_dims(
    model: HookedModel, batches: Sequence[PreparedBatch], layers: Sequence[int], k: int, seed: int
) -> tuple[tuple[tuple[int, tuple[int, ...]], ...], tuple[tuple[int, tuple[int, ...]], ...]]:
    """Per layer, the ``k`` key-input dimensions with the largest mean |x| at the anchor
    over the inputs, and ``k`` others drawn at random (the control)."""
    _check_k_dims(k, model.spec.d_model)
    sums = {layer: torch.zeros(model.spec.d_model, dtype=torch.float64) for layer in layers}

    def add(layer: int, batch: PreparedBatch) -> Callable[..., None]:
        def hook(x: Float[torch.Tensor, "batch pos d_model"], hook: object) -> None:
            rows = torch.arange(x.shape[0], device=x.device)
            gain = key_input_hook(model, layer)[1]
            x = x if gain is None else x * gain.to(x.device, x.dtype)
            sums[layer] += x[rows, batch.anchor.to(x.device)].abs().double().sum(0).cpu()

        return hook

    for batch in batches:
        with torch.no_grad():
            model.run_with_hooks(batch, [(key_input_hook(model, layer)[0], add(layer, batch)) for layer in layers])
    generator = torch.Generator().manual_seed(seed)
    top, other = [], []
    for layer in layers:
        order = torch.argsort(sums[layer], descending=True, stable=True)
        rest = order[k:][torch.randperm(model.spec.d_model - k, generator=generator)[:k]]
        top.append((layer, tuple(sorted(int(d) for d in order[:k]))))
        other.append((layer, tuple(sorted(int(d) for d in rest))))
    return tuple(top), tuple(other)


def _plan(
    model: HookedModel,
    batches: Sequence[PreparedBatch],
    sink_heads: Sequence[HeadRef],
    config: CircuitConfig,
    position: int,
) -> list[tuple[str, CircuitEdit, CircuitEdit | None]]:
    """The battery's rows: a label, the edit and its control (None: the row is a control)."""
    heads = tuple(sink_heads)
    layers = sorted({layer for layer, _ in heads})
    top, other = top_key_dims(model, batches, layers, config.k_dims, config.seed)
    swap = CircuitEdit("swap_later_positions", position=position)
    write = config.write_layer
    return [
        (
            "null the sink heads' query bias",
            CircuitEdit("null_query_bias", heads=heads),
            CircuitEdit("random_query_bias", heads=heads, seed=config.seed),
        ),
        (
            f"replace the anchor's position embedding with position {position}'s",
            CircuitEdit("replace_first_position", position=position),
            swap,
        ),
        ("remove every position embedding", CircuitEdit("remove_positions", position=position), swap),
        (
            f"swap the anchor's effective position embedding with position {position}'s",
            CircuitEdit("swap_effective_positions", position=position),
            CircuitEdit("swap_later_effective_positions", position=position),
        ),
        (
            f"zero layer {write}'s MLP write into the anchor",
            CircuitEdit("zero_anchor_write", layer=write),
            CircuitEdit("zero_random_write", layer=write, seed=config.seed),
        ),
        (
            f"zero layer {write}'s attention write into the anchor",
            CircuitEdit("zero_anchor_write", layer=write, part="attn"),
            CircuitEdit("zero_random_write", layer=write, part="attn", seed=config.seed),
        ),
        (
            f"zero the top-{config.k_dims} key input dimensions in each sink layer",
            CircuitEdit("zero_key_dims", key_dims=top),
            CircuitEdit("zero_random_key_dims", key_dims=other),
        ),
        ("replace the anchor's token embedding with the last token's", CircuitEdit("replace_anchor_token"), None),
        (
            f"start the rotary positions at {OFFSET} (theory: no change)",
            CircuitEdit("offset_positions", offset=OFFSET),
            None,
        ),
    ]


def _outcome(
    model: HookedModel,
    batches: Sequence[PreparedBatch],
    sink_heads: Sequence[HeadRef],
    edit: CircuitEdit,
    baseline: Readout,
    error_fn: ErrorFn | None,
    config: CircuitConfig,
) -> EditOutcome:
    why_not = applicability(model, edit)
    if why_not is not None:
        return EditOutcome(
            edit=edit.kind, applicable=False, why_not=why_not, share_left=None, error_change=None, heads=()
        )
    edited = anchor_mass_readout(model, batches, sink_heads, edit, error_fn)

    def generator() -> torch.Generator:  # every estimate resamples the same inputs
        return torch.Generator().manual_seed(config.seed)

    heads = tuple(
        HeadShare(
            layer=layer,
            head=head,
            baseline=float(baseline.anchor_mass[:, index].mean()),
            share_left=ratio_bootstrap(
                edited.anchor_mass[:, index], baseline.anchor_mass[:, index], config.n_bootstrap, generator()
            ),
        )
        for index, (layer, head) in enumerate(sink_heads)
    )
    share = ratio_bootstrap(edited.anchor_mass.mean(1), baseline.anchor_mass.mean(1), config.n_bootstrap, generator())
    change = None
    if edited.error is not None and baseline.error is not None:
        change = bootstrap(edited.error - baseline.error, config.n_bootstrap, generator())
    return EditOutcome(
        edit=edit.kind, applicable=True, why_not=None, share_left=share, error_change=change, heads=heads
    )


def _transplant(
    model: HookedModel, batches: Sequence[PreparedBatch], position: int, config: CircuitConfig, sink_eps: float
) -> tuple[TransplantResult | None, str]:
    """The transplant of ``position``, or None and why not."""
    n_layers = model.spec.n_layers
    if n_layers < 2:
        return None, "a one-layer model has no later layer to read a transplanted sink in"
    if not model.spec.pattern_writable:
        return None, "this model's attention patterns are read-only"
    layers = config.transplant_layers if config.transplant_layers is not None else min(2, n_layers - 1)
    return transplant_test(model, batches, position, layers, sink_eps, config.n_bootstrap, config.seed), ""


def _is_index(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _checked_heads(
    model: HookedModel, sink_heads: Sequence[HeadRef], config: CircuitConfig, sink_eps: float
) -> tuple[HeadRef, ...]:
    """``sink_heads`` as distinct (layer, head) pairs inside the model, after the checks of
    ``config`` and ``sink_eps`` that need the model; one line naming the fix otherwise."""
    check_argument(config, CircuitConfig, "config", "a CircuitConfig")
    if not (isinstance(sink_eps, (int, float)) and 0.0 <= sink_eps < 1.0):
        raise InputError(f"sink_eps must lie in [0, 1), got {sink_eps!r}", field="sink_eps")
    pairs = [tuple(pair) if isinstance(pair, (tuple, list)) else (pair,) for pair in sink_heads]
    if any(len(pair) != 2 or not all(_is_index(index) for index in pair) for pair in pairs):
        raise InputError(f"sink heads must be (layer, head) pairs of integers, got {list(sink_heads)!r}")
    heads = tuple((int(layer), int(head)) for layer, head in pairs)
    if not heads:
        raise InputError("the battery needs at least one sink head; probe the model first (no head passed the rule)")
    if len(set(heads)) != len(heads):
        raise InputError(f"sink heads repeat: {list(heads)}; give each (layer, head) once")
    spec = model.spec
    for layer, head in heads:
        if not (0 <= layer < spec.n_layers and 0 <= head < spec.n_heads):
            raise InputError(
                f"sink head L{layer}H{head} is outside the model ({spec.n_layers} layers x {spec.n_heads} heads)"
            )
    if config.write_layer >= spec.n_layers:
        raise InputError(
            f"write layer {config.write_layer} is outside the model's {spec.n_layers} layers", field="write_layer"
        )
    _check_k_dims(config.k_dims, spec.d_model)
    _check_transplant_layers(config.transplant_layers, spec.n_layers)
    return heads


def _check_transplant_layers(layers: int | None, n_layers: int) -> None:
    """Asked for, the transplant is refused up front where it cannot run, not skipped."""
    if layers is None or layers < n_layers:
        return
    if n_layers == 1:
        message = "a one-layer model has no later layer to read a transplanted sink in: leave transplant_layers out"
    else:
        message = f"the transplant edits the first n layers and reads the rest: n must lie in [1, {n_layers - 1}]"
    raise InputError(f"{message}; got {layers}", field="transplant_layers")


def _check_k_dims(k: int, d_model: int) -> None:
    if 2 * k > d_model:
        raise InputError(
            f"k must be at most half the model width {d_model} (its control zeroes k other dimensions); got {k}",
            field="k_dims",
        )


def run_circuit_battery(
    model: HookedModel,
    inputs: object,
    sink_heads: Sequence[HeadRef],
    config: CircuitConfig | None = None,
    attention_mask: torch.Tensor | None = None,
    error_fn: ErrorFn | None = None,
    sink_eps: float = SINK_EPS,
) -> CircuitBattery:
    """Run every circuit edit and its control on ``inputs`` (strings, right-padded token
    ids with ``attention_mask``, or toy tokens), reading ``sink_heads``' anchor mass and
    ``error_fn(output, batch) -> [batch]`` (e.g. next-token loss; None: no error readout).
    ``sink_eps``: the sink rule the transplant counts new sink heads by."""
    config = config or CircuitConfig()
    heads = _checked_heads(model, sink_heads, config, sink_eps)
    batches = _batches(model, inputs, attention_mask, config.batch_size)
    shortest = min(int(batch.attention_mask.sum(1).min()) for batch in batches)
    position = config.position if config.position is not None else max(1, shortest // 2)
    if position + 1 >= shortest:
        raise InputError(
            f"position {position} needs inputs of at least {position + 2} tokens; the shortest has {shortest}",
            field="position",
        )
    baseline = anchor_mass_readout(model, batches, heads, None, error_fn)
    rows = []
    for label, edit, control in _plan(model, batches, heads, config, position):
        outcome = _outcome(model, batches, heads, edit, baseline, error_fn, config)
        paired = None if control is None else _outcome(model, batches, heads, control, baseline, error_fn, config)
        rows.append(CircuitRow(label=label, intervention=outcome, control=paired))
    transplant, note = _transplant(model, batches, position, config, sink_eps)
    return CircuitBattery(
        config=replace(config, position=position),
        n_inputs=int(baseline.anchor_mass.shape[0]),
        sink_heads=heads,
        baseline_anchor_mass=float(baseline.anchor_mass.mean()),
        baseline_error=None if baseline.error is None else float(baseline.error.mean()),
        rows=tuple(rows),
        transplant=transplant,
        transplant_note=note,
    )
