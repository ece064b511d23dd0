"""Activation patching on a sliding-window model: a tiny Mistral-style checkpoint (every layer
sees the last 4 tokens) and a Gemma-2-style one (local and global layers alternate, window 6),
loaded through sinkscope's ``load_model``, patched on a prompt several windows long, every
(layer, head) site compared with the same patch made inside transformers' eager forward, to
1e-5: the values, keys and queries at the projections, the head outputs at ``o_proj``'s input,
and the attention pattern in transformers' own eager attention (``hf_reference``)."""

from __future__ import annotations

import pytest
import torch

from hf_reference import edited_eager_attention
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.pretrained_analysis.loading import LoadSpec, load_model
from sinkscope.probes.patching import activation_patching
from tiny_models import load_hf_model
from windowed_models import PROMPTS, WINDOWED, build_windowed

torch.set_num_threads(1)


@pytest.fixture(scope="module", params=["mistral", "gemma2"])
def windowed_pair(request, tmp_path_factory):
    """The model both ways, and a source / target pair several windows long that differ in
    three tokens early on (which a window-4 model's last query cannot reach through two
    layers) and in two inside the last window."""
    directory = build_windowed(tmp_path_factory.mktemp(request.param), request.param)
    hooked = HookedModel(load_model(LoadSpec(str(directory)), progress=False).bridge)
    source = hooked.prepare(PROMPTS[0]).model_input
    target = source.clone()
    target[0, 2:5] = source[0, 7:10]
    target[0, -4:-2] = source[0, 3:5]
    window = max(WINDOWED[request.param][3])
    assert source.shape[1] > 3 * window
    return request.param, hooked, load_hf_model(directory), source, target


def last_logit_mean(logits, context):
    return logits[:, -1].mean(dim=-1)


@torch.no_grad()
def hf_metric(hf, tokens: torch.Tensor) -> float:
    return float(hf(tokens).logits[:, -1].mean())


def head_slice(module, head: int, d_head: int, pre: bool):
    """Forward hooks that capture, then overwrite, one head's slice of a module's output
    (or, with ``pre``, of its input) with what the source run gave it."""
    captured: dict[str, torch.Tensor] = {}
    cut = slice(head * d_head, (head + 1) * d_head)

    def capture(m, args, output=None):
        captured["source"] = (args[0] if pre else output).clone()

    def patch(m, args, output=None):
        edited = (args[0] if pre else output).clone()
        edited[..., cut] = captured["source"][..., cut]
        return (edited,) if pre else edited

    register = module.register_forward_pre_hook if pre else module.register_forward_hook
    return capture, patch, register


def patched_in_hf(hf, source, target, module, head: int, d_head: int, pre: bool = False) -> float:
    capture, patch, register = head_slice(module, head, d_head, pre)
    handle = register(capture)
    hf_metric(hf, source)
    handle.remove()
    handle = register(patch)
    try:
        return hf_metric(hf, target)
    finally:
        handle.remove()


def patched_pattern_in_hf(hf, source, target, layer: int, head: int) -> float:
    """The source run's attention row weights for one head, put into the target run inside
    transformers' own eager attention."""
    captured = {}

    def keep(weights):
        captured["source"] = weights[:, head].clone()
        return weights

    def replace(weights):
        edited = weights.clone()
        edited[:, head] = captured["source"]
        return edited

    with edited_eager_attention(hf, {layer: keep}):
        hf_metric(hf, source)
    with edited_eager_attention(hf, {layer: replace}):
        return hf_metric(hf, target)


SITES = {  # hook -> (attention submodule, input rather than output, heads are kv heads)
    "v": ("v_proj", False, True),
    "k": ("k_proj", False, True),
    "q": ("q_proj", False, False),
    "z": ("o_proj", True, False),
}


@pytest.mark.parametrize("hook", [*SITES, "pattern"])
def test_every_patched_site_matches_the_same_patch_in_transformers(windowed_pair, hook):
    family, hooked, hf, source, target = windowed_pair
    result = activation_patching(hooked, source, target, hook, last_logit_mean, per=("layer", "head"))
    d_head = hooked.spec.d_head
    assert result.source_metric == pytest.approx(hf_metric(hf, source), abs=1e-5)
    assert result.target_metric == pytest.approx(hf_metric(hf, target), abs=1e-5)
    effects = []
    for row in result.rows:
        attention = hf.model.layers[row.layer].self_attn
        if hook == "pattern":
            expected = patched_pattern_in_hf(hf, source, target, row.layer, row.head)
        else:
            name, pre, _ = SITES[hook]
            expected = patched_in_hf(hf, source, target, getattr(attention, name), row.head, d_head, pre)
        assert row.patched == pytest.approx(expected, abs=1e-5), f"{family} {hook} {row.layer}.{row.head}"
        effects.append(abs(row.effect))
    n_heads = hooked.spec.n_kv_heads if hook in SITES and SITES[hook][2] else hooked.spec.n_heads
    assert len(result.rows) == hooked.spec.n_layers * n_heads
    assert max(effects) > 1e-3  # the patches move the metric: the comparison has teeth


def patched_residual_in_hf(hf, source, target, layer: int, position: int) -> float:
    """The source run's residual stream entering ``layer`` at one position, put into the
    target run (transformers passes it as the decoder layer's first argument or as
    ``hidden_states``)."""
    captured = {}

    def hidden(args, kwargs):
        return args[0] if args else kwargs["hidden_states"]

    def capture(m, args, kwargs):
        captured["source"] = hidden(args, kwargs).clone()

    def patch(m, args, kwargs):
        edited = hidden(args, kwargs).clone()
        edited[:, position] = captured["source"][:, position]
        return ((edited, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": edited})

    module = hf.model.layers[layer]
    for hook in (capture, patch):
        handle = module.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            value = hf_metric(hf, source if hook is capture else target)
        finally:
            handle.remove()
    return value


def test_residual_patching_per_position_follows_the_window(windowed_pair):
    """Per (layer, position): each equals transformers under the same patch; on the
    Mistral-style model (every layer local, window 4) a changed position further back than
    the window's reach over the remaining layers moves the last logit by exactly nothing,
    one inside it does."""
    family, hooked, hf, source, target = windowed_pair
    n_pos = source.shape[1]
    positions = [2, 3, n_pos - 4, n_pos - 3]
    result = activation_patching(
        hooked, source, target, "resid_pre", last_logit_mean, per=("layer", "position"), positions=positions
    )
    by_site = {(row.layer, row.position): row for row in result.rows}
    for (layer, position), row in by_site.items():
        expected = patched_residual_in_hf(hf, source, target, layer, position)
        assert row.patched == pytest.approx(expected, abs=1e-5), f"{family} resid_pre {layer}@{position}"
    if family == "mistral":
        window, n_layers = WINDOWED[family][3][0], hooked.spec.n_layers
        for (layer, position), row in by_site.items():
            reach = (n_layers - layer) * (window - 1)  # how far back the last query's inputs go
            if n_pos - 1 - position > reach:
                assert row.effect == 0.0
        assert abs(by_site[(0, n_pos - 4)].effect) > 1e-3
