"""The toy model's TransformerLens contract: hook names, shapes, caching, editing."""

from __future__ import annotations

import pytest
import torch
from transformer_lens import ActivationCache

from sinkscope.interp.hook_names import attn_hook, block_hook, pattern_hook
from sinkscope.toy.model import ToyModelConfig, ToyTransformer
from sinkscope.toy.task import TaskConfig, sample_batch

D, P, BATCH = 8, 6, 4


def _tokens(seed: int = 0) -> torch.Tensor:
    task = TaskConfig(d_model=D, seq_len=P, eval_trigger_position=P - 1)
    return sample_batch(task, BATCH, torch.Generator().manual_seed(seed), "single").tokens


def _model(**kwargs) -> ToyTransformer:
    torch.manual_seed(0)
    return ToyTransformer(ToyModelConfig(d_model=D, seq_len=P, **kwargs))


def test_hook_name_helpers():
    assert attn_hook(2, "pattern") == pattern_hook(2) == "blocks.2.attn.hook_pattern"
    assert block_hook(0, "resid_post") == "blocks.0.hook_resid_post"
    with pytest.raises(ValueError, match="unknown attention hook"):
        attn_hook(0, "result")
    with pytest.raises(ValueError, match="unknown block hook"):
        block_hook(0, "resid")


@pytest.mark.parametrize("n_layers, n_heads, d_head", [(1, 1, None), (2, 3, 4)])
def test_cache_has_documented_names_and_shapes(n_layers, n_heads, d_head):
    model = _model(n_layers=n_layers, n_heads=n_heads, d_head=d_head)
    width = D if d_head is None else d_head
    tokens = _tokens()
    output, raw = model.run_with_cache(tokens)
    # HookedRootModule returns the plain name -> tensor dict; ActivationCache wraps it
    assert isinstance(raw, dict)
    cache = ActivationCache(raw, model)
    assert output.shape == (BATCH, P, D)
    for layer in range(n_layers):
        for name in ("q", "k", "v", "z"):
            assert cache[attn_hook(layer, name)].shape == (BATCH, P, n_heads, width)
        for name in ("attn_scores", "pattern"):
            assert cache[attn_hook(layer, name)].shape == (BATCH, n_heads, P, P)
        for name in ("resid_pre", "attn_out", "resid_post"):
            assert cache[block_hook(layer, name)].shape == (BATCH, P, D)
        # ActivationCache's own accessors resolve the same tensors
        assert torch.equal(cache["pattern", layer], cache[pattern_hook(layer)])
        assert torch.equal(cache["resid_post", layer], cache[block_hook(layer, "resid_post")])
    assert torch.equal(cache["pattern", -1], cache[pattern_hook(n_layers - 1)])  # uses cfg.n_layers
    stacked = cache.stack_activation("pattern")
    assert stacked.shape == (n_layers, BATCH, n_heads, P, P)
    first = ActivationCache({k: v[:1] for k, v in raw.items()}, model)
    first.remove_batch_dim()
    assert first[pattern_hook(0)].shape == (n_heads, P, P)
    assert torch.equal(cache[block_hook(n_layers - 1, "resid_post")], output)
    assert torch.equal(cache[block_hook(0, "resid_pre")], tokens)
    # hooks are not left behind
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())


def test_cached_tensors_are_consistent():
    model = _model(n_layers=2, n_heads=2)
    tokens = _tokens(1)
    _, cache = model.run_with_cache(tokens)
    for layer in range(2):
        attn = model.blocks[layer].attn
        x = cache[block_hook(layer, "resid_pre")]
        q = torch.einsum("bpd,hde->bphe", x, attn.W_Q)
        k = torch.einsum("bpd,hde->bphe", x, attn.W_K)
        torch.testing.assert_close(cache[attn_hook(layer, "q")], q)
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k)
        cached = cache[attn_hook(layer, "attn_scores")]
        upper = torch.triu(torch.ones(P, P, dtype=torch.bool), diagonal=1)
        assert torch.all(cached[..., upper] == float("-inf"))
        torch.testing.assert_close(cached[..., ~upper], scores[..., ~upper])
        z = torch.einsum("bhqk,bkhe->bqhe", cache[pattern_hook(layer)], cache[attn_hook(layer, "v")])
        torch.testing.assert_close(cache[attn_hook(layer, "z")], z)
        out = torch.einsum("bqhe,hed->bqd", z, attn.W_O)
        torch.testing.assert_close(cache[block_hook(layer, "attn_out")], out)
        # several layers: residual stream by default
        torch.testing.assert_close(cache[block_hook(layer, "resid_post")], x + out)


def test_names_filter_caches_only_what_is_asked():
    model = _model(n_layers=2)
    _, cache = model.run_with_cache(_tokens(), names_filter=lambda name: name.endswith("hook_pattern"))
    assert sorted(cache.keys()) == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]


def test_pattern_edit_one_hot_on_bos_gives_v_bos_times_w_o():
    model = _model(n_layers=1, n_heads=1)
    tokens = _tokens(2)

    def to_bos(pattern, hook):
        edited = torch.zeros_like(pattern)
        edited[..., 0] = 1.0
        return edited

    clean = model(tokens)
    edited = model.run_with_hooks(tokens, fwd_hooks=[(pattern_hook(0), to_bos)])
    assert not torch.allclose(clean, edited)
    attn = model.blocks[0].attn
    # by hand: v at BOS = x_0 W_V, written out through W_O, the same at every position
    with torch.no_grad():
        for b in range(BATCH):
            v_bos = tokens[b, 0] @ attn.W_V[0]
            expected = v_bos @ attn.W_O[0]
            for i in range(P):
                torch.testing.assert_close(edited[b, i], expected, atol=1e-7, rtol=1e-5)
    # the hook was removed afterwards: a plain run is clean again
    assert torch.equal(model(tokens), clean)


def test_zeroing_hook_z_of_one_head_removes_exactly_its_contribution():
    model = _model(n_layers=1, n_heads=2)
    tokens = _tokens(3)
    _, cache = model.run_with_cache(tokens)
    attn = model.blocks[0].attn

    def zero_head_1(z, hook):
        z = z.clone()
        z[:, :, 1] = 0
        return z

    edited = model.run_with_hooks(tokens, fwd_hooks=[(attn_hook(0, "z"), zero_head_1)])
    head_0 = cache[attn_hook(0, "z")][:, :, 0] @ attn.W_O[0]
    torch.testing.assert_close(edited, head_0)


def test_one_layer_default_has_no_residual():
    model = _model(n_layers=1)
    assert model.cfg.has_residual is False and model.cfg.target == "single"
    tokens = _tokens()
    output, cache = model.run_with_cache(tokens)
    assert torch.equal(output, cache[block_hook(0, "attn_out")])
    assert not torch.allclose(output, tokens + cache[block_hook(0, "attn_out")])
    # opting in to a residual adds the input back
    with_residual = _model(n_layers=1, residual=True)
    with_residual.load_state_dict(model.state_dict())
    assert with_residual.cfg.target == "residual"
    torch.testing.assert_close(with_residual(tokens), tokens + output)
    # and several layers can opt out
    plain = _model(n_layers=2, residual=False)
    out, cache = plain.run_with_cache(tokens)
    assert torch.equal(cache[block_hook(0, "resid_post")], cache[block_hook(0, "attn_out")])
    assert torch.equal(out, cache[block_hook(1, "attn_out")])


@pytest.mark.parametrize(
    "options, extra_hooks",
    [
        (dict(layer_norm=True), ["blocks.{l}.ln1.hook_normalized", "blocks.{l}.ln1.hook_scale"]),
        (
            dict(mlp=True),
            [
                "blocks.{l}.mlp.hook_pre",
                "blocks.{l}.mlp.hook_post",
                "blocks.{l}.hook_resid_mid",
                "blocks.{l}.hook_mlp_out",
            ],
        ),
        (
            dict(mlp=True, layer_norm=True, d_mlp=12),
            ["blocks.{l}.ln2.hook_normalized", "blocks.{l}.mlp.hook_post"],
        ),
        (dict(positional_embedding=True), ["hook_pos_embed"]),
        (dict(scale_scores=True), []),
    ],
)
def test_options_run_and_expose_their_hooks(options, extra_hooks):
    model = _model(n_layers=2, n_heads=2, **options)
    tokens = _tokens()
    output, cache = model.run_with_cache(tokens)
    assert output.shape == (BATCH, P, D) and torch.isfinite(output).all()
    for layer in range(2):
        for template in extra_hooks:
            assert template.format(l=layer) in cache.keys(), template
    if "d_mlp" in options:
        assert cache["blocks.0.mlp.hook_pre"].shape == (BATCH, P, 12)
    if options.get("layer_norm"):
        normalized = cache["blocks.0.ln1.hook_normalized"]
        torch.testing.assert_close(normalized.mean(-1), torch.zeros(BATCH, P), atol=1e-5, rtol=0)
    if options.get("positional_embedding"):
        torch.testing.assert_close(cache["hook_pos_embed"], model.W_pos)
        torch.testing.assert_close(cache["blocks.0.hook_resid_pre"], tokens + model.W_pos)
    if options.get("scale_scores"):
        q, k = cache[attn_hook(0, "q")], cache[attn_hook(0, "k")]
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / D**0.5
        lower = torch.tril(torch.ones(P, P, dtype=torch.bool))
        torch.testing.assert_close(cache[attn_hook(0, "attn_scores")][..., lower], scores[..., lower])
    # the options are off by default: no extra hook points exist on the paper's model
    assert not any(".ln1." in name or ".mlp." in name for name in _model(n_layers=2).hook_dict)


def test_wrong_token_shape_is_refused():
    model = _model()
    with pytest.raises(ValueError, match=r"expected tokens of shape \[batch, pos, 8\]"):
        model(torch.zeros(2, P, D + 1))
    positional = _model(positional_embedding=True)
    with pytest.raises(ValueError, match="seq_len >= 7"):
        positional(torch.zeros(1, P + 1, D))
