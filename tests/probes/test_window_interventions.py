"""Interventions under sliding-window attention, against transformers' eager attention with the
same edit: ``remove_sink`` and ``redirect_to_sink`` touch only the queries whose window lets
them see the anchor, and the matched control ``mask_random_key`` masks, for those queries
only, a key their window shows them (a key with weight > 0 in transformers' own pattern)."""

from __future__ import annotations

import pytest
import torch

from hf_reference import edited_eager_attention
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.pretrained_analysis.loading import LoadSpec, load_model
from sinkscope.probes.interventions import (
    _keys_for,
    mask_random_key,
    redirect_to_sink,
    remove_sink,
    run_with_intervention,
)
from tiny_models import load_hf_model
from windowed_models import PROMPTS, WINDOWED, build_windowed

torch.set_num_threads(1)


@pytest.fixture(scope="module", params=["mistral", "gemma2"])
def windowed_batch(request, tmp_path_factory):
    directory = build_windowed(tmp_path_factory.mktemp(request.param), request.param)
    hooked = HookedModel(load_model(LoadSpec(str(directory)), progress=False).bridge)
    tokens = hooked.prepare(PROMPTS[0]).model_input  # one unpadded prompt, several windows long
    return request.param, hooked, load_hf_model(directory), tokens


def drop_anchor_where_seen(head):
    """Queries after the anchor (0) that see it lose it; their rows are renormalised."""

    def edit(weights):
        edited = weights.clone()
        rows = edited[:, head, 1:]
        seen = rows[..., 0] > 0
        rows[..., 0] = 0.0
        rows[seen] = rows[seen] / rows[seen].sum(dim=-1, keepdim=True)
        return edited

    return edit


def one_hot_where_seen(head):
    """Queries that see the anchor (0) put all their weight on it; the others are left alone."""

    def edit(weights):
        edited = weights.clone()
        seen = edited[:, head, :, 0] > 0
        one_hot = torch.zeros_like(edited[:, head])
        one_hot[..., 0] = 1.0
        edited[:, head] = torch.where(seen.unsqueeze(-1), one_hot, edited[:, head])
        return edited

    return edit


@pytest.mark.parametrize(
    ("build", "edit"),
    [(remove_sink, drop_anchor_where_seen), (redirect_to_sink, one_hot_where_seen)],
    ids=["remove_sink", "redirect_to_sink"],
)
def test_pattern_edits_touch_only_queries_that_see_the_anchor(windowed_batch, build, edit):
    family, hooked, hf, tokens = windowed_batch
    layer = 0  # a local layer in every family here
    assert WINDOWED[family][3][layer] > 0 and tokens.shape[1] > 3 * WINDOWED[family][3][layer]
    with torch.no_grad():
        plain = hf(tokens).logits
        with edited_eager_attention(hf, {layer: edit(1)}):
            expected = hf(tokens).logits
    assert (expected - plain).abs().max() > 1e-3  # the edit matters
    actual = run_with_intervention(hooked, tokens, build([(layer, 1)]))
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_the_control_masks_a_key_the_window_shows(windowed_batch):
    family, hooked, hf, tokens = windowed_batch
    batch = hooked.prepare(tokens)
    with torch.no_grad():
        attentions = hf(tokens, output_attentions=True).attentions
    for layer, pattern in enumerate(attentions):
        keys = _keys_for(hooked, batch, mask_random_key([(layer, 0)], seed=3), layer)[0]
        visible = pattern[0, 0] > 0  # transformers' own visibility, window included
        for query in range(1, tokens.shape[1]):
            if not visible[query, 0]:  # the window hides the anchor: nothing to match, nothing masked
                assert keys[query] == -1, (family, layer, query)
            else:
                assert keys[query] != 0 and visible[query, keys[query]], (family, layer, query)
        assert (keys == -1).sum() > 1 if WINDOWED[family][3][layer] else (keys[1:] >= 0).all()
