"""The probe runner: every sink metric of docs/metrics.md for every (layer, head), in one pass.

``probe_model(model, inputs, ...)`` works on toy models and ``TransformerBridge``
models alike (see ``sinkscope.interp.hooked_model``). It caches nothing: forward hooks reduce
each layer's tensors to per-head sums and counts as they fire and drop them, so at
most one layer's pattern (and that layer's values) is alive at a time, and batches
accumulate without keeping earlier patterns. Only the hooks a measurement reads are
attached (``hook_v``, ``hook_pattern``, ``hook_z`` per layer; ``hook_resid_post`` when
residual statistics are asked for). Every metric is per query head; under grouped- or
multi-query attention a value-side metric of query head h reads the key/value head it
shares (``ModelSpec.expand_kv``). Each pass runs under ``torch.inference_mode`` and
ends after the last block (``HookedModel.run_with_hooks(stop_after=...)``): the final
layer norm and the unembedding never run, so no ``[batch, pos, vocab]`` logits exist.
Every number is a sum over prompts divided by a count (or a maximum), so results do not
depend on how prompts are batched (up to float rounding); ``iterate_batches`` groups token
ids by length.

``ProbeConfig.layers`` restricts the probe to some layers: only their hooks are attached,
the pass ends after the last of them, and the result holds their rows only.

"Selected queries" below are real queries after the row's anchor that ``query_mask``
keeps (the toy task's default, non-trigger positions); ``anchor_mass_other`` is the
anchor mass over the remaining real queries after the anchor (the trigger positions).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from sinkscope.infra.arguments import check_argument, check_items
from sinkscope.infra.errors import InputError
from sinkscope.interp.hook_names import attn_hook, block_hook
from sinkscope.interp.hooked_model import HookedModel, PreparedBatch
from sinkscope.interp.learned_sinks import has_null
from sinkscope.interp.visibility import layer_reach
from sinkscope.probes.batches import iterate_batches as iterate_batches  # callers import it from here
from sinkscope.probes.gate_sums import GateSums, QueryGateSums
from sinkscope.probes.gate_sums import ratio as _ratio
from sinkscope.probes.head_classes import HeadClassSums
from sinkscope.probes.key_geometry import KeyGeometrySums
from sinkscope.probes.layer_selection import check_pattern_layers, no_pattern_note, normalisation_notes
from sinkscope.probes.pattern_sums import PatternSums
from sinkscope.probes.probe import (
    SECONDARY_MIN_QUERIES,
    HeadProbe,
    LayerProbe,
    ProbeBatch,
    ProbeConfig,
    ProbeResult,
    layers_note,
)
from sinkscope.probes.secondary_result import secondary_sinks_of
from sinkscope.probes.secondary_sinks import SecondarySinkSums
from sinkscope.probes.sink_metrics import (
    default_source,
    head_output_norms,
    is_sink_head,
    masked_cleanly,
    massive_activations,
    null_mass,
    output_gram,
    projected_value_norms,
    queries_after_anchor,
)
from sinkscope.probes.sink_samples import SampleSums


class ProbeAccumulator:
    """Per-(layer, head) sums and counts, filled by forward hooks, one batch at a time."""

    def __init__(self, model: HookedModel, config: ProbeConfig, samples: SampleSums | None = None) -> None:
        self.model = model
        self.config = config
        self.samples = samples  # per-prompt statistics for the sink experiments, kept only when asked
        spec = model.spec
        config.check_layers(spec.n_layers)
        check_pattern_layers(config.layers, spec)
        self.layers = config.probed_layers(spec.n_layers, [row.layer for row in spec.no_pattern_layers])
        shape = (spec.n_layers, spec.n_heads)
        zeros = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
        self.sums = PatternSums(spec.n_layers, spec.n_heads, config.alpha_k, config.sink_rate_eps)
        self.value_norm, self.value_count = zeros(shape), zeros(spec.n_layers)
        self.head_out, self.layer_out = zeros(shape), zeros(spec.n_layers)
        self.head_out_sum, self.out_count = zeros(spec.n_layers), zeros(spec.n_layers)
        # then 1 - row mass is the null's: a learned sink logit, a bias slot, softmax1, softpick
        self.has_null = has_null(model)
        self.gates = GateSums(spec.n_layers, spec.n_heads)
        self.query_gates = QueryGateSums(spec, self.gates, self._context)
        self.resid_norm, self.resid_count = zeros(spec.n_layers), zeros(spec.n_layers)
        self.massive_count, self.massive_at_anchor = zeros(spec.n_layers), zeros(spec.n_layers)
        self.max_abs, self.median_abs = zeros(spec.n_layers), zeros(spec.n_layers)
        self.out_of_sum, self.sum_of_out, self.total_count = zeros(()), zeros(()), zeros(())
        self.n_inputs = 0
        self._batch: PreparedBatch | None = None
        self._selected: torch.Tensor | None = None
        self._visible: dict[tuple[int, int], torch.Tensor] = {}  # per (window, chunk) of this batch
        self._value_norms: torch.Tensor | None = None
        self._out_total: torch.Tensor | None = None
        self._out_norm_total: torch.Tensor | None = None
        self._grams: dict[tuple[int, torch.dtype], torch.Tensor] = {}
        self.geometry = KeyGeometrySums(spec, self._context) if config.with_key_geometry else None
        self.classes = HeadClassSums(spec.n_layers, spec.n_heads, config.random_key_seed)
        self.secondary = (
            SecondarySinkSums(
                config.secondary_min_mass, SECONDARY_MIN_QUERIES, config.massive_abs, config.massive_ratio
            )
            if config.with_secondary_sinks
            else None
        )

    def hooks(self) -> list[tuple[str, Any]]:
        hooks = []
        for layer in self.layers:
            if self.config.with_values:
                hooks.append((attn_hook(layer, "v"), self._make_v_hook(layer)))
            hooks.append((attn_hook(layer, "pattern"), self._make_pattern_hook(layer)))
            if self.config.with_values:
                output_hook = self.model.attention_output_hook(layer)
                hooks.append((attn_hook(layer, "z"), self._make_z_hook(layer, computes_output=output_hook is None)))
                if output_hook is not None:  # the model's own output: no second W_O matmul
                    hooks.append((output_hook, self._make_output_hook(layer)))
            if self.config.with_residual:
                hooks.append((block_hook(layer, "resid_post"), self._make_resid_hook(layer)))
            if attn_hook(layer, "gate") in self.model.spec.hook_names:
                hooks.append((attn_hook(layer, "gate"), self._make_gate_hook(layer)))
            hooks.extend(self.query_gates.hooks(layer))
            if self.geometry is not None:
                hooks.extend(self.geometry.hooks(layer))
        return hooks

    def run(self, batch: PreparedBatch, query_mask: torch.Tensor | None) -> None:
        real_queries = (
            batch.attention_mask
            if query_mask is None
            else batch.attention_mask & query_mask.to(batch.attention_mask.device).bool()
        )
        self._batch = batch
        self._visible = {}
        self._selected = queries_after_anchor(
            batch.n_pos, batch.anchor, batch.batch_size, real_queries, real_queries.device
        )
        self._out_total, self._out_norm_total = None, None
        # hooks only read, so inference mode (no autograd bookkeeping at all); the pass
        # ends after the last probed block, the last hook point any probe reads
        last = block_hook(self.layers[-1], "resid_post")
        if self.secondary is not None:
            self.secondary.start(batch)
        self.classes.start(batch)
        with torch.inference_mode():
            self.model.run_with_hooks(batch, self.hooks(), stop_after=last)
            if self.secondary is not None:
                self.secondary.finish(batch)
            if self._out_total is not None:
                selected = self._selected.to(torch.float64)
                self.out_of_sum += float((self._out_total.norm(dim=-1).double() * selected).sum())
                self.sum_of_out += float((self._out_norm_total.double() * selected).sum())
                self.total_count += float(selected.sum())
        self.n_inputs += batch.batch_size
        self._batch = self._selected = self._value_norms = None
        self._visible = {}
        self._out_total = self._out_norm_total = None

    # hooks ---------------------------------------------------------------------------
    def _pass(self) -> tuple[PreparedBatch, torch.Tensor]:
        """(batch, selected queries) of the pass ``run`` is making; hooks only fire inside it."""
        assert self._batch is not None and self._selected is not None
        return self._batch, self._selected

    def _make_v_hook(self, layer: int):
        def hook(v: torch.Tensor, hook: Any) -> None:
            batch, _ = self._pass()
            # [batch, pos, n_kv_heads, d_head] -> one value per query head (grouped-query attention)
            v = self.model.spec.expand_kv(v)
            self._value_norms = projected_value_norms(v, self._gram(layer, v.dtype))
            self.classes.add_values(layer, self._value_norms, batch)
            rows = torch.arange(batch.batch_size, device=v.device)
            self.value_norm[layer] += v[rows, batch.anchor].norm(dim=-1).double().sum(dim=0).cpu()
            self.value_count[layer] += batch.batch_size

        return hook

    def _context(self, layer: int) -> tuple[PreparedBatch, torch.Tensor, torch.Tensor]:
        """(batch, selected queries, ``layer``'s key visibility) of the pass ``run`` is making."""
        batch, selected = self._pass()
        reach = layer_reach(self.model.spec, layer)
        if reach not in self._visible:
            self._visible[reach] = self.model.visible_keys(batch, layer)
        return batch, selected, self._visible[reach]

    def _make_pattern_hook(self, layer: int):
        def hook(pattern: torch.Tensor, hook: Any) -> None:
            batch, selected, visible = self._context(layer)
            clean = masked_cleanly(pattern, visible)  # decides the cheap paths of the sums below
            self.sums.add(layer, pattern, batch, selected, visible, self._value_norms, clean)
            self.classes.add_pattern(layer, pattern, selected, visible)
            if self.samples is not None:
                self.samples.add(layer, pattern, batch, selected, visible)
            self._value_norms = None
            if self.secondary is not None:
                self.secondary.add_pattern(layer, pattern, batch, selected, visible, clean)

        return hook

    def _gram(self, layer: int, dtype: torch.dtype) -> torch.Tensor:
        """``output_gram`` of ``layer``'s W_O, computed once per probe run."""
        key = (layer, dtype)
        if key not in self._grams:
            self._grams[key] = output_gram(self.model.W_O(layer).to(dtype))
        return self._grams[key]

    def _make_gate_hook(self, layer: int):
        def hook(gate: torch.Tensor, hook: Any) -> None:
            self.gates.add(layer, gate, *self._pass())

        return hook

    def _make_z_hook(self, layer: int, computes_output: bool):
        def hook(z: torch.Tensor, hook: Any) -> None:
            selected = self._pass()[1].to(z.dtype)
            head_norms = head_output_norms(z, self._gram(layer, z.dtype))  # [batch, pos, head]
            self.head_out[layer] += (head_norms * selected.unsqueeze(-1)).sum(dim=(0, 1)).double().cpu()
            self.head_out_sum[layer] += float((head_norms.sum(dim=-1) * selected).sum())
            self.out_count[layer] += float(selected.sum())
            self.classes.add_outputs(layer, z, self._gram(layer, z.dtype), self._pass()[1])
            if computes_output:
                W_O = self.model.W_O(layer).to(z.dtype)  # [head, d_head, d_model]
                # [batch, pos, d_model]: sum_h z_h W_O[h] as one matmul
                layer_out = z.reshape(*z.shape[:2], -1) @ W_O.reshape(-1, W_O.shape[-1])
                bias = self.model.b_O(layer)
                self._add_layer_output(layer, layer_out if bias is None else layer_out + bias.to(z.dtype))

        return hook

    def _make_output_hook(self, layer: int):
        def hook(out: torch.Tensor, hook: Any) -> None:
            self._add_layer_output(layer, out)

        return hook

    def _add_layer_output(self, layer: int, layer_out: torch.Tensor) -> None:
        """Accumulate ``layer``'s attention output ``[batch, pos, d_model]``: its norm and the
        running sum over layers (for ``attn_out_norm_of_sum``)."""
        selected = self._pass()[1].to(layer_out.dtype)
        layer_norm = layer_out.norm(dim=-1)
        self.layer_out[layer] += float((layer_norm * selected).sum())
        self._out_total = layer_out if self._out_total is None else self._out_total + layer_out
        self._out_norm_total = layer_norm if self._out_norm_total is None else self._out_norm_total + layer_norm

    def _make_resid_hook(self, layer: int):
        def hook(resid: torch.Tensor, hook: Any) -> None:
            batch, _ = self._pass()
            rows = torch.arange(batch.batch_size, device=resid.device)
            self.resid_norm[layer] += float(resid[rows, batch.anchor].norm(dim=-1).sum())
            self.resid_count[layer] += batch.batch_size
            stats = massive_activations(
                resid, batch.attention_mask, batch.anchor, self.config.massive_abs, self.config.massive_ratio
            )
            self.massive_count[layer] += stats.count
            self.massive_at_anchor[layer] += stats.at_anchor
            self.max_abs[layer] = max(float(self.max_abs[layer]), stats.max_abs)
            self.median_abs[layer] += float(stats.median_abs.double().sum())
            if self.secondary is not None:
                self.secondary.add_resid(layer, stats.position_max, batch, stats.median_abs)

        return hook

    # result --------------------------------------------------------------------------
    def result(self) -> ProbeResult:
        if self.n_inputs == 0:
            raise InputError("no inputs were probed; pass at least one input")
        spec, config = self.model.spec, self.config
        sums = self.sums
        mass = _ratio(sums.mass, sums.mass_count.unsqueeze(1))
        sink = is_sink_head(mass, config.sink_eps)
        total = float(self.total_count)
        return ProbeResult(
            model=spec,
            config=config,
            n_inputs=self.n_inputs,
            n_queries=int(sums.all_count[self.layers[0]]),
            heads=self._head_rows(mass, sink),
            layers=self._layer_rows(mass, sink),
            sink_rates=self.sums.sink_rates(self.config.alpha_k),
            attn_out_norm_of_sum=float(self.out_of_sum) / total if total > 0 else math.nan,
            attn_out_sum_of_norms=float(self.sum_of_out) / total if total > 0 else math.nan,
            random_key_p99=self.classes.random_key_p99(),
            notes=normalisation_notes(spec) + no_pattern_note(spec) + layers_note(config.layers, spec.n_layers),
            secondary_sinks=(
                None
                if self.secondary is None
                else secondary_sinks_of(self.secondary, self.n_inputs, config.with_residual)
            ),
        )

    def _head_rows(self, mass: torch.Tensor, sink: torch.Tensor) -> tuple[HeadProbe, ...]:
        """One ``HeadProbe`` per (layer, head), from the per-head sums and counts."""
        config, sums = self.config, self.sums
        other = _ratio(sums.other, sums.other_count.unsqueeze(1))
        alpha = _ratio(sums.alpha, sums.alpha_count)
        share = _ratio(sums.share, sums.share_count)
        entropy = _ratio(sums.entropy, sums.entropy_count)
        value_norm = _ratio(self.value_norm, self.value_count.unsqueeze(1))
        head_out = _ratio(self.head_out, self.out_count.unsqueeze(1))
        row_mass = _ratio(sums.row_mass, sums.all_count.unsqueeze(1))
        # over every selected query: reported only in layers where some query cannot see the anchor
        narrowed = (sums.hidden > 0).unsqueeze(1)
        mass_all = _ratio(sums.mass_all, sums.all_count.unsqueeze(1)).where(narrowed, math.nan)
        alpha_all = _ratio(sums.alpha_all, sums.alpha_all_count).where(narrowed, math.nan)
        null = null_mass(row_mass) if self.has_null else torch.full_like(row_mass, math.nan)
        gate, gate_other = self.gates.means()
        dormant = (entropy <= config.dormant_entropy_max) & (mass >= config.dormant_anchor_min)
        # [layer][head] lists: one conversion per field, not one tensor lookup per head and field
        fields: dict[str, Any] = {
            name: values.tolist()
            for name, values in {
                "anchor_mass": mass.double(),
                "anchor_mass_other": other.double(),
                "alpha": alpha.double(),
                "value_weighted_anchor_share": share.double(),
                "anchor_value_norm": value_norm.double(),
                "row_entropy": entropy.double(),
                "head_out_norm": head_out.double(),
                "row_mass": row_mass.double(),
                "null_mass": null.double(),
                "gate_default": gate.double(),
                "gate_trigger": gate_other.double(),
                "gated_anchor_norm": self.query_gates.gated_anchor_norm(),
                "anchor_mass_all_queries": mass_all.double(),
                "alpha_all_queries": alpha_all.double(),
                "is_sink_head": sink.bool(),
                "dormant": dormant.bool(),
            }.items()
        }
        geometry = self.geometry

        def row(layer: int, head: int) -> HeadProbe:
            cells: dict[str, Any] = {name: values[layer][head] for name, values in fields.items()}
            if geometry is not None:
                cells.update(geometry.head_fields(layer, head))
            cells.update(self.classes.head_cells(layer, head, cells["is_sink_head"], cells["anchor_mass"]))
            source = default_source(
                cells["anchor_mass"], cells["null_mass"], cells["row_mass"], cells["gate_default"], config.sink_eps
            )
            return HeadProbe(layer=layer, head=head, default_source=source, **cells)

        return tuple(row(layer, head) for layer in self.layers for head in range(self.model.spec.n_heads))

    def _layer_rows(self, mass: torch.Tensor, sink: torch.Tensor) -> tuple[LayerProbe, ...]:
        """One ``LayerProbe`` per layer, from the per-layer sums and counts."""
        layer_out = _ratio(self.layer_out, self.out_count)
        head_out_sum = _ratio(self.head_out_sum, self.out_count)
        resid_norm = _ratio(self.resid_norm, self.resid_count)
        median_abs = _ratio(self.median_abs, self.resid_count)
        sums = self.sums
        hidden = _ratio(sums.hidden, sums.all_count)
        mass_all = _ratio(sums.mass_all, sums.all_count.unsqueeze(1)).mean(dim=1).where(sums.hidden > 0, math.nan)
        return tuple(
            LayerProbe(
                layer=layer,
                anchor_mass=float(mass[layer].mean()),
                n_sink_heads=int(sink[layer].sum()),
                attn_out_norm=float(layer_out[layer]),
                head_out_norm_sum=float(head_out_sum[layer]),
                anchor_resid_norm=float(resid_norm[layer]),
                massive_count=int(self.massive_count[layer]),
                massive_at_anchor=int(self.massive_at_anchor[layer]),
                max_abs_resid=float(self.max_abs[layer]) if self.resid_count[layer] > 0 else math.nan,
                median_abs_resid=float(median_abs[layer]),
                anchor_hidden_share=float(hidden[layer]),
                anchor_mass_all_queries=float(mass_all[layer]),
            )
            for layer in self.layers
        )


def probe_batches(
    model: torch.nn.Module | HookedModel,
    batches: Iterable[ProbeBatch],
    config: ProbeConfig = ProbeConfig(),
    samples: SampleSums | None = None,
) -> ProbeResult:
    """Probe a stream of batches (e.g. a generator over a dataset), filling ``samples`` too when given."""
    hooked = model if isinstance(model, HookedModel) else HookedModel(model)
    accumulator = ProbeAccumulator(hooked, config, samples)
    for probe_batch in batches:
        prepared = hooked.prepare(probe_batch.inputs, probe_batch.attention_mask)
        if probe_batch.query_mask is not None and probe_batch.query_mask.shape != prepared.attention_mask.shape:
            raise InputError(
                f"query_mask {tuple(probe_batch.query_mask.shape)} must have the inputs' "
                f"[batch, pos] shape {tuple(prepared.attention_mask.shape)}"
            )
        accumulator.run(prepared, probe_batch.query_mask)
    return accumulator.result()


def probe_model(
    model: torch.nn.Module | HookedModel,
    inputs: torch.Tensor | Sequence[str],
    attention_mask: torch.Tensor | None = None,
    query_mask: torch.Tensor | None = None,
    config: ProbeConfig = ProbeConfig(),
) -> ProbeResult:
    """Probe ``model`` on ``inputs`` in batches of ``config.batch_size``.

    inputs: toy tokens ``[n, pos, d_model]``, token ids ``[n, pos]`` or strings;
    attention_mask: ``[n, pos]`` (token ids only); query_mask: ``[n, pos]`` bool, the
    queries that count (e.g. the toy task's default positions).
    """
    check_argument(config, ProbeConfig, "config", "a ProbeConfig")
    if not isinstance(inputs, torch.Tensor):
        inputs = check_items(inputs, str, "inputs", "prompt strings (or a tensor of token ids or toy tokens)")
    return probe_batches(model, iterate_batches(inputs, attention_mask, query_mask, config.batch_size), config)
