"""The mitigation attention kinds (docs/toy-task.md), each against a direct float64
implementation of its formula, computed here query by query from the model's weights."""

from __future__ import annotations

import math

import pytest
import torch

from sinkscope.interp.attention_kinds import ATTENTION_KINDS, GATED_KINDS, NULL_KINDS, softpick
from sinkscope.toy.constructions import kv_bias_zero_value_model, learned_sink_model, softmax_scaled_model
from sinkscope.toy.model import ToyModelConfig, ToyTransformer
from sinkscope.toy.task import TaskConfig, sample_batch

MITIGATION_KINDS = (
    "softmax1",
    "learned_sink",
    "kv_bias",
    "kv_bias_zero_value",
    "softpick",
    "gated_head",
    "gated_element",
    "value_gated",
)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def reference_head(attn: torch.nn.Module, kind: str, x: torch.Tensor, h: int) -> tuple[list, list, torch.Tensor]:
    """One head of one sequence, from the formula: (pattern rows over real keys, null per
    row, z ``[pos, d_head]``), all in float64, one query at a time."""
    x = x.double()
    W_Q, W_K, W_V = (getattr(attn, name)[h].detach().double() for name in ("W_Q", "W_K", "W_V"))
    q, k, v = x @ W_Q, x @ W_K, x @ W_V
    if kind == "value_gated":
        v = v * torch.sigmoid(x @ attn.W_gate[h].detach().double())
    rows, nulls, z = [], [], torch.zeros(x.shape[0], W_V.shape[1], dtype=torch.float64)
    for i in range(x.shape[0]):
        s = [float(q[i] @ k[j]) for j in range(i + 1)]
        if kind in ("softmax", "gated_head", "gated_element", "value_gated"):
            total = sum(math.exp(value) for value in s)
            p = [math.exp(value) / total for value in s]
            null = 0.0
        elif kind == "softmax1":
            total = 1.0 + sum(math.exp(value) for value in s)
            p, null = [math.exp(value) / total for value in s], 1.0 / total
        elif kind == "learned_sink":
            b = float(attn.sinks[h])
            total = math.exp(b) + sum(math.exp(value) for value in s)
            p, null = [math.exp(value) / total for value in s], math.exp(b) / total
        elif kind in ("kv_bias", "kv_bias_zero_value"):
            slot = float(q[i] @ attn.null_key[h].detach().double())
            total = math.exp(slot) + sum(math.exp(value) for value in s)
            p, null = [math.exp(value) / total for value in s], math.exp(slot) / total
        elif kind == "softpick":
            total = sum(abs(math.exp(value) - 1.0) for value in s) + 1e-6
            p = [max(math.exp(value) - 1.0, 0.0) / total for value in s]
            null = 1.0 - sum(p)
        else:
            raise AssertionError(kind)
        out = sum(p[j] * v[j] for j in range(i + 1))
        if kind == "kv_bias":
            out = out + null * attn.null_value[h].detach().double()
        if kind == "gated_head":
            out = out * _sigmoid(float(x[i] @ attn.W_gate[h].detach().double()))
        if kind == "gated_element":
            out = out * torch.sigmoid(x[i] @ attn.W_gate[h].detach().double())
        rows.append(p)
        nulls.append(null)
        z[i] = out
    return rows, nulls, z


@pytest.mark.parametrize("kind", MITIGATION_KINDS)
def test_each_kind_equals_its_formula(kind: str) -> None:
    torch.manual_seed(3)
    model = ToyTransformer(ToyModelConfig(n_layers=1, n_heads=2, d_model=8, seq_len=7, attention=kind, init_std=0.5))
    x = torch.randn(2, 7, 8)
    out, cache = model.run_with_cache(x)
    attn = model.attention(0)
    expected_out = torch.zeros(2, 7, 8, dtype=torch.float64)
    for b in range(2):
        for h in range(2):
            rows, nulls, z = reference_head(attn, kind, x[b], h)
            for i, row in enumerate(rows):
                got = cache["blocks.0.attn.hook_pattern"][b, h, i, : i + 1].double()
                torch.testing.assert_close(got, torch.tensor(row, dtype=torch.float64), atol=2e-6, rtol=1e-5)
                assert float(cache["blocks.0.attn.hook_pattern"][b, h, i, i + 1 :].abs().sum()) == 0.0
            if kind in NULL_KINDS:
                got_null = cache["blocks.0.attn.hook_null"][b, h].double()
                torch.testing.assert_close(got_null, torch.tensor(nulls, dtype=torch.float64), atol=2e-6, rtol=1e-5)
            torch.testing.assert_close(cache["blocks.0.attn.hook_z"][b, :, h].double(), z, atol=2e-6, rtol=1e-5)
            expected_out[b] += z @ attn.W_O[h].detach().double()
    torch.testing.assert_close(out.double(), expected_out, atol=5e-6, rtol=1e-5)
    if kind in GATED_KINDS:
        gate = cache["blocks.0.attn.hook_gate"]
        assert gate.shape[:3] == (2, 7, 2) and bool(((gate > 0) & (gate < 1)).all())


def test_softpick_is_stable_and_ignores_hidden_keys() -> None:
    scores = torch.tensor([[[200.0, 199.0, float("-inf")], [-300.0, -1.0, float("-inf")]]])
    pattern = softpick(scores)
    assert bool(torch.isfinite(pattern).all())
    # the first row: e^200 dominates; by the formula, (e^0 - e^-1) / ((1 - e^-200) + (e^-1 - e^-200)) ...
    expected = (1 - math.exp(-200)) / ((1 - math.exp(-200)) + (math.exp(-1) - math.exp(-200)))
    assert pattern[0, 0, 0].item() == pytest.approx(expected, rel=1e-6)
    # the second: all scores below zero, the row writes nothing (no mass leaks to a hidden key)
    assert pattern[0, 1].abs().max().item() == 0.0


def test_the_paper_kinds_keep_their_weights_and_hooks() -> None:
    """The four kinds that existed draw the same initial weights as before: no new parameter."""
    for kind in ("softmax", "relu", "relu_prefix", "sigmoid"):
        model = ToyTransformer(ToyModelConfig(attention=kind))
        assert sorted(name for name, _ in model.named_parameters()) == [
            "blocks.0.attn.W_K",
            "blocks.0.attn.W_O",
            "blocks.0.attn.W_Q",
            "blocks.0.attn.W_V",
        ]
    assert set(MITIGATION_KINDS) <= set(ATTENTION_KINDS)


@pytest.mark.parametrize("kind", MITIGATION_KINDS)
def test_the_circuit_order_is_the_per_head_order(kind: str) -> None:
    """A kind that may run by circuits (no hook on q, k, v, z) gives what the per-head order
    gives (in float64: the two orders round differently in float32)."""
    torch.manual_seed(0)
    model = ToyTransformer(ToyModelConfig(n_layers=2, n_heads=2, attention=kind, init_std=0.3)).double()
    x = torch.randn(3, 16, 16, dtype=torch.float64)
    plain = model(x)
    listened = model.run_with_hooks(x, fwd_hooks=[("blocks.0.attn.hook_z", lambda z, hook: z)])
    torch.testing.assert_close(plain, listened, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize(
    ("build", "kind"), [(learned_sink_model, "learned_sink"), (kv_bias_zero_value_model, "kv_bias_zero_value")]
)
def test_null_constructions_solve_the_task_with_no_anchor_mass(build, kind: str) -> None:
    task = TaskConfig()
    batch = sample_batch(task, 256, torch.Generator().manual_seed(0), "single")
    errors, masses = [], []
    for scale in (5.0, 10.0, 20.0):
        model = build(task, scale)
        assert model.cfg.attention == kind
        out, cache = model.run_with_cache(batch.tokens)
        errors.append(float((out - batch.targets).pow(2).mean()))
        pattern, null = cache["blocks.0.attn.hook_pattern"], cache["blocks.0.attn.hook_null"]
        default = ~batch.trigger_query_mask()[:, 1:]  # the default queries after BOS
        masses.append(float(pattern[:, 0, 1:, 0][default].mean()))
        nulls = null[:, 0, 1:][default]
        if scale == 20.0:
            assert float(nulls.min()) > 0.99
    assert errors[0] > errors[1] > errors[2] and errors[2] < 1e-12
    assert masses[-1] < 1e-6
    # the softmax construction at the same scale parks its default rows on BOS instead
    softmax_pattern = softmax_scaled_model(task, 20.0).run_with_cache(batch.tokens)[1]["blocks.0.attn.hook_pattern"]
    assert float(softmax_pattern[:, 0, 2:, 0].mean()) > 0.5
