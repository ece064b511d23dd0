"""The probe runner on toy models: sink detection, query masks, batch accumulation,
serialisation, cancellation between layers, and the one-layer-at-a-time memory bound."""

from __future__ import annotations

import math
import weakref
from dataclasses import fields

import pytest
import torch

from sinkscope.infra.codec import encode, read_result, write_result
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.probes.probe import HeadProbe, ProbeConfig, ProbeResult
from sinkscope.probes.runner import probe_model
from sinkscope.probes.tables import GEOMETRY_COLUMN_FIELDS
from sinkscope.toy.model import ToyModelConfig, ToyTransformer
from sinkscope.toy.task import TaskConfig, eval_batch
from tiny_models import toy_sink_model as sink_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def task_batch():
    return eval_batch(TaskConfig(d_model=8, seq_len=8, eval_trigger_position=5), 16, seed=0, target="residual")


def test_sink_head_detected_and_query_mask_split(task_batch):
    result = probe_model(sink_model(), task_batch.tokens, query_mask=task_batch.default_query_mask())
    assert result.sink_heads() == [(0, 0)]
    head = result.heads[0]
    assert head.anchor_mass > 0.99 and head.anchor_mass_other > 0.99
    assert head.dormant and head.row_entropy < 0.05
    assert head.alpha > 0.99
    assert result.n_queries == 16 * 6  # 7 positions after BOS, minus the trigger
    # near-uniform causal heads have alpha_0 = mean_i 1/(i+1) ~ 0.34 over 8 positions
    assert [(rate.eps, rate.percent) for rate in result.sink_rates] == [(0.3, 100.0), (0.8, 25.0)]
    assert not result.heads[1].is_sink_head


def test_batches_accumulate_exactly(task_batch):
    model = sink_model()
    whole = probe_model(model, task_batch.tokens, query_mask=task_batch.default_query_mask())
    split = probe_model(
        model, task_batch.tokens, query_mask=task_batch.default_query_mask(), config=ProbeConfig(batch_size=3)
    )
    for a, b in zip(whole.heads, split.heads):
        for name in (
            "anchor_mass",
            "anchor_mass_other",
            "alpha",
            "value_weighted_anchor_share",
            "row_entropy",
            "head_out_norm",
        ):
            assert getattr(a, name) == pytest.approx(getattr(b, name), rel=1e-5, abs=1e-7), name
    assert whole.attn_out_norm_of_sum == pytest.approx(split.attn_out_norm_of_sum, rel=1e-5)
    for a, b in zip(whole.layers, split.layers):  # residual medians are per prompt, so batch-size free too
        assert a.median_abs_resid == pytest.approx(b.median_abs_resid, rel=1e-6)
        assert (a.massive_count, a.max_abs_resid) == (b.massive_count, b.max_abs_resid)


def test_serialises_to_json_and_csv(task_batch, tmp_path):
    result = probe_model(sink_model(), task_batch.tokens)
    data = encode(result)
    assert data["model"]["family"] == "toy"
    assert len(data["heads"]) == 4 and data["heads"][0]["anchor_mass_other"] is None
    assert {
        "layer",
        "head",
        "anchor_mass",
        "alpha",
        "is_sink_head",
        "value_weighted_anchor_share",
        "row_entropy",
        "dormant",
    } <= set(data["heads"][0])
    write_result(tmp_path / "probe.json", result)
    assert encode(read_result(tmp_path / "probe.json", ProbeResult)) == data  # NaN (null) included
    frame = result.to_dataframe()
    # every field but the metrics measured for no head here (NaN throughout), as in heads.csv
    unmeasured = {"anchor_mass_other", "null_mass", "anchor_mass_all_queries", "alpha_all_queries"}
    unmeasured |= {"gate_default", "gate_trigger", "gated_anchor_norm"}  # a model without gates
    unmeasured |= set(GEOMETRY_COLUMN_FIELDS)  # key geometry: not asked for here
    assert list(frame.columns) == [field.name for field in fields(HeadProbe) if field.name not in unmeasured]
    assert len(frame) == 4 and all(math.isnan(getattr(result.heads[0], name)) for name in unmeasured)
    assert frame["anchor_mass"].tolist() == [row.anchor_mass for row in result.heads]
    result.write_heads_csv(str(tmp_path / "heads.csv"))
    lines = (tmp_path / "heads.csv").read_text().splitlines()
    # led by the model and its revision (empty); anchor_mass_other, measured nowhere here, is left out
    assert len(lines) == 5 and lines[0].startswith("model,revision,layer,head,anchor_mass,alpha")


def test_cancellation_between_layers_is_visible():
    model = ToyTransformer(ToyModelConfig(n_layers=2, n_heads=1, d_model=4, seq_len=4, init_std=0.3))
    with torch.no_grad():
        # both layers ignore coordinate 3 on input; layer 0 writes +out there and layer 1 -out
        model.blocks[1].attn.W_Q.copy_(model.blocks[0].attn.W_Q)
        model.blocks[1].attn.W_K.copy_(model.blocks[0].attn.W_K)
        model.blocks[1].attn.W_V.copy_(model.blocks[0].attn.W_V)
        model.blocks[0].attn.W_O.zero_()
        model.blocks[0].attn.W_O[0, :, 3] = 1.0
        model.blocks[1].attn.W_O.zero_()
        model.blocks[1].attn.W_O[0, :, 3] = -1.0
        for block in model.blocks:
            block.attn.W_Q[0, 3].zero_()
            block.attn.W_K[0, 3].zero_()
            block.attn.W_V[0, 3].zero_()
    tokens = torch.randn(8, 4, 4)
    result = probe_model(model, tokens)
    assert result.attn_out_sum_of_norms > 0.1
    assert result.attn_out_norm_of_sum < 1e-5 * result.attn_out_sum_of_norms
    assert result.layers[0].attn_out_norm == pytest.approx(result.layers[1].attn_out_norm, rel=1e-5)


def test_at_most_one_layer_pattern_alive():
    """A 12-layer model on 64 inputs of 64 tokens: when a layer's pattern hook fires, no
    earlier layer's pattern is still referenced anywhere."""
    model = ToyTransformer(ToyModelConfig(n_layers=12, n_heads=2, d_model=8, seq_len=64))
    alive: list[weakref.ref] = []
    worst = []

    def watch(pattern, hook):
        worst.append(sum(ref() is not None for ref in alive))
        alive.append(weakref.ref(pattern))

    for layer in range(12):
        model.blocks[layer].attn.hook_pattern.add_perma_hook(watch)
    try:
        result = probe_model(model, torch.randn(64, 64, 8), config=ProbeConfig(batch_size=64))
    finally:
        model.reset_hooks(including_permanent=True)
    assert result.n_inputs == 64 and len(worst) == 12
    assert max(worst) == 0


def test_bad_inputs_raise_clear_errors():
    model = sink_model()
    with pytest.raises(ValueError, match="float tokens"):
        probe_model(model, torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="empty"):
        probe_model(model, torch.zeros(0, 3, 8))
    with pytest.raises(ValueError, match="query_mask"):
        probe_model(model, torch.zeros(2, 3, 8), query_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="already a HookedModel"):
        HookedModel(HookedModel(model))


def test_a_sink_rate_reads_as_the_papers_write_it_and_hides_an_unmeasured_field():
    from sinkscope.probes.probe import SinkRate

    assert repr(SinkRate(k=0, eps=0.3, percent=83.33333)) == "SinkRate(Sink_1: k=0, eps=0.3, percent=83.33)"
    narrowed = SinkRate(k=0, eps=0.3, percent=83.3, percent_all_queries=70.0)
    assert repr(narrowed).endswith("percent=83.3, percent_all_queries=70)")


def test_the_probe_s_switches_take_true_or_false_only():
    from sinkscope.infra.errors import InputError
    from sinkscope.probes.probe import ProbeConfig

    for name in ("with_key_geometry", "with_secondary_sinks"):
        with pytest.raises(InputError, match=f"{name} must be True or False"):
            ProbeConfig(**{name: "yes"})
