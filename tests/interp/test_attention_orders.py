"""HookedAttention's two evaluation orders (per head, by QK/OV circuits) are one model.

The circuit order is what training runs (nothing listens to q/k/v/z there); the per-head
order is what a hook on q/k/v/z gets. Outputs, gradients, the patterns hooks see and
the effect of pattern edits must agree between them. In float64, so that "agree" can mean
1e-9: in float32 the two orders round differently at about 1e-7 of the output.
"""

from __future__ import annotations

import pytest
import torch

from sinkscope.interp.attention_kinds import ATTENTION_KINDS
from sinkscope.interp.hook_names import attn_hook, pattern_hook
from sinkscope.toy.attention import PER_HEAD_ONLY_KINDS, HookedAttention
from sinkscope.toy.model import ToyModelConfig, ToyTransformer
from sinkscope.toy.task import TaskConfig, sample_batch

D, P, BATCH = 8, 7, 5
CIRCUIT_KINDS = tuple(kind for kind in ATTENTION_KINDS if kind not in PER_HEAD_ONLY_KINDS)


def _tokens(seed: int = 0) -> torch.Tensor:
    task = TaskConfig(d_model=D, seq_len=P, eval_trigger_position=P - 1)
    return sample_batch(task, BATCH, torch.Generator().manual_seed(seed), "residual").tokens.double()


def _model(**kwargs) -> ToyTransformer:
    torch.manual_seed(0)
    # init_std large enough that patterns are far from uniform and kinds differ
    return ToyTransformer(ToyModelConfig(d_model=D, seq_len=P, init_std=0.5, **kwargs)).double()


def _listen_to_z(model: ToyTransformer) -> list[tuple[str, object]]:
    """Read-only hooks on every hook_z: they force the per-head order."""
    return [(attn_hook(layer, "z"), lambda z, hook: None) for layer in range(model.cfg.n_layers)]


@pytest.mark.parametrize("attention", CIRCUIT_KINDS)
@pytest.mark.parametrize(
    "shape",
    [
        {"n_layers": 1, "n_heads": 1},
        {"n_layers": 2, "n_heads": 3},
        {"n_layers": 2, "n_heads": 2, "scale_scores": True, "layer_norm": True, "mlp": True},
    ],
)
def test_both_orders_give_the_same_output_and_gradients(attention, shape):
    model = _model(attention=attention, **shape)
    tokens = _tokens()
    assert all(block.attn._circuits_apply() for block in model.blocks)

    def loss_and_grads(fwd_hooks):
        model.zero_grad(set_to_none=True)
        output = model.run_with_hooks(tokens, fwd_hooks=fwd_hooks)
        output.pow(2).sum().backward()
        return output.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}

    circuit_out, circuit_grads = loss_and_grads([])
    per_head_out, per_head_grads = loss_and_grads(_listen_to_z(model))
    assert not torch.equal(circuit_out, torch.zeros_like(circuit_out))
    torch.testing.assert_close(circuit_out, per_head_out, rtol=1e-9, atol=1e-10)
    for name, grad in circuit_grads.items():
        torch.testing.assert_close(grad, per_head_grads[name], rtol=1e-9, atol=1e-10, msg=name)


@pytest.mark.parametrize("attention", PER_HEAD_ONLY_KINDS)
def test_a_kind_that_gates_inside_the_head_always_runs_per_head(attention):
    model = _model(attention=attention, n_layers=2, n_heads=1)  # d_head == d_model: circuits would fit
    assert not any(block.attn._circuits_apply() for block in model.blocks)
    assert torch.isfinite(model(_tokens())).all()


def test_a_hook_on_q_k_v_or_z_switches_to_the_per_head_order_and_sees_real_activations():
    model = _model(n_layers=2, n_heads=2)
    attn = model.blocks[1].attn
    seen: dict[str, torch.Tensor] = {}
    for name in ("q", "k", "v", "z"):
        hook_point = getattr(attn, f"hook_{name}")
        handle = hook_point.register_forward_hook(
            lambda module, args, output, name=name: seen.__setitem__(name, output)
        )
        assert not attn._circuits_apply()
        model(_tokens())
        handle.remove()
        assert attn._circuits_apply()
    assert set(seen) == {"q", "k", "v", "z"}
    assert seen["z"].shape == (BATCH, P, 2, D)
    # nothing else listening: the first block still runs by circuits
    assert model.blocks[0].attn._circuits_apply()


def test_narrow_heads_always_run_per_head():
    narrow = HookedAttention(d_model=8, n_heads=4, d_head=2)
    assert not narrow._circuits_apply()


def test_pattern_and_scores_hooks_see_the_same_values_in_both_orders():
    model = _model(n_layers=2, n_heads=3)
    names = [pattern_hook(layer) for layer in range(2)] + [attn_hook(layer, "attn_scores") for layer in range(2)]
    tokens = _tokens(1)
    _, circuit_cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    with model.hooks(fwd_hooks=_listen_to_z(model)):
        _, per_head_cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    for name in names:
        assert circuit_cache[name].shape == (BATCH, 3, P, P)
        torch.testing.assert_close(circuit_cache[name], per_head_cache[name], rtol=1e-9, atol=1e-10)
    # the causal mask is exact in both: hidden scores are -inf, hidden weights are 0
    hidden = ~torch.tril(torch.ones(P, P, dtype=torch.bool))
    assert torch.isneginf(circuit_cache[attn_hook(0, "attn_scores")][..., hidden]).all()
    assert (circuit_cache[pattern_hook(0)][..., hidden] == 0).all()


def test_a_pattern_edit_has_the_same_effect_in_both_orders():
    """Moving all attention to BOS must give each head's BOS value times its OV circuit."""
    model = _model(n_layers=1, n_heads=2)
    tokens = _tokens(2)

    def all_on_bos(pattern: torch.Tensor, hook) -> torch.Tensor:
        edited = torch.zeros_like(pattern)
        edited[..., 0] = 1.0
        return edited

    edit = [(pattern_hook(0), all_on_bos)]
    circuit_out = model.run_with_hooks(tokens, fwd_hooks=edit)
    per_head_out = model.run_with_hooks(tokens, fwd_hooks=edit + _listen_to_z(model))
    attn = model.blocks[0].attn
    with torch.no_grad():
        w_ov = (attn.W_V @ attn.W_O).sum(0)  # [d_model, d_model], summed over heads
        expected = (tokens[:, :1] @ w_ov).expand(-1, P, -1)  # no residual in a one-layer model
    torch.testing.assert_close(circuit_out.detach(), expected, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(per_head_out.detach(), expected, rtol=1e-9, atol=1e-10)
