"""Sliding-window attention (Mistral, Gemma 2's alternation, Gemma 3's ``sliding_window_pattern``):
tiny checkpoints with windows of 4-6 tokens, loaded through sinkscope's ``load_model``, probed on
prompts several windows long, every per-head anchor metric compared with one written out plainly
from transformers' eager ``output_attentions`` (which keys a query sees is read there too: the
keys with weight > 0), to 1e-5; and the mutation check: a probe that ignores the window fails
that comparison."""

from __future__ import annotations

import pytest
import torch

from sinkscope.interp.hooked_model import HookedModel
from sinkscope.pretrained_analysis.loading import LoadSpec, load_model
from sinkscope.probes.probe import ProbeConfig
from sinkscope.probes.runner import probe_model
from tiny_models import load_hf_model
from windowed_models import PROMPTS, WINDOWED, build_windowed

torch.set_num_threads(1)


@pytest.fixture(scope="module", params=list(WINDOWED))
def windowed(request, tmp_path_factory):
    directory = build_windowed(tmp_path_factory.mktemp(request.param), request.param)
    loaded = load_model(LoadSpec(str(directory)), progress=False)
    return request.param, loaded.bridge, load_hf_model(directory)


@torch.no_grad()
def eager_attentions_and_value_norms(hf, tokens: torch.Tensor, mask: torch.Tensor):
    """transformers' eager forward with output_attentions, and per layer ||v_j W_O[h]||
    ``[batch, head, key]`` from v_proj on the attention's input and o_proj's columns (query
    head h reads kv head h // group)."""
    inputs, handles = {}, []
    for index, layer in enumerate(hf.model.layers):
        handles.append(
            layer.self_attn.register_forward_pre_hook(
                lambda module, args, kwargs, i=index: inputs.__setitem__(
                    i, kwargs.get("hidden_states", args and args[0])
                ),
                with_kwargs=True,
            )
        )
    try:
        out = hf(tokens, attention_mask=mask.long(), output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
    config = hf.config
    n_heads, n_kv, d_head = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    value_out = []
    for index, layer in enumerate(hf.model.layers):
        attn = layer.self_attn
        v = attn.v_proj(inputs[index]).double().view(*tokens.shape, n_kv, d_head)
        W_O = attn.o_proj.weight.double()
        value_out.append(
            torch.stack(
                [
                    (v[:, :, head // (n_heads // n_kv)] @ W_O[:, head * d_head : (head + 1) * d_head].T).norm(dim=-1)
                    for head in range(n_heads)
                ],
                dim=1,
            )
        )
    return out, value_out


@torch.no_grad()
def expected_metrics(hf, tokens: torch.Tensor, mask: torch.Tensor, eps: tuple[float, ...]) -> dict:
    """Anchor metrics from transformers' eager attentions: a query sees key j when j is real
    and its weight on j is > 0 (transformers' own mask, window included)."""
    out, value_out = eager_attentions_and_value_norms(hf, tokens, mask)
    batch, n_pos = tokens.shape
    per_head: dict[str, list] = {"anchor_mass": [], "anchor_mass_all_queries": [], "alpha": [], "alpha_all": []}
    per_head["row_entropy"], per_head["value_weighted_anchor_share"] = [], []
    hidden_share, hits, hits_all, n_alpha = [], [0] * len(eps), [0] * len(eps), 0
    for layer, pattern in enumerate(out.attentions):
        pattern = pattern.double()
        layer_rows = {name: [] for name in per_head}
        hidden = total = 0
        for head in range(pattern.shape[1]):
            sums = dict.fromkeys(per_head, 0.0)
            counts = dict.fromkeys(per_head, 0)
            for row in range(batch):
                real = [i for i in range(n_pos) if mask[row, i]]
                anchor = real[0]
                a = pattern[row, head]
                seen = [i for i in real if a[i, anchor] > 0]
                alpha_seen = sum(float(a[i, anchor]) for i in seen) / len(seen)
                alpha_all = sum(float(a[i, anchor]) for i in real) / len(real)
                sums["alpha"] += alpha_seen
                sums["alpha_all"] += alpha_all
                counts["alpha"] += 1
                counts["alpha_all"] += 1
                for index, threshold in enumerate(eps):
                    hits[index] += alpha_seen > threshold
                    hits_all[index] += alpha_all > threshold
                n_alpha += 1
                for i in real[1:]:
                    visible = [j for j in real if a[i, j] > 0]
                    sums["anchor_mass_all_queries"] += float(a[i, anchor])
                    counts["anchor_mass_all_queries"] += 1
                    if head == 0:
                        total += 1
                        hidden += anchor not in visible
                    if anchor in visible:
                        sums["anchor_mass"] += float(a[i, anchor])
                        counts["anchor_mass"] += 1
                        norms = value_out[layer][row, head]  # [key]
                        weighted = a[i, visible] * norms[visible]
                        sums["value_weighted_anchor_share"] += float(a[i, anchor] * norms[anchor] / weighted.sum())
                        counts["value_weighted_anchor_share"] += 1
                    if len(visible) >= 2:
                        p = a[i, visible] / a[i, visible].sum()
                        entropy = -(p * p.log()).sum() / torch.log(torch.tensor(float(len(visible)), dtype=p.dtype))
                        sums["row_entropy"] += float(entropy)
                        counts["row_entropy"] += 1
            for name in per_head:
                layer_rows[name].append(sums[name] / counts[name])
        for name in per_head:
            per_head[name].append(layer_rows[name])
        hidden_share.append(hidden / total)
    expected = {name: torch.tensor(values, dtype=torch.float64) for name, values in per_head.items()}
    expected["hidden_share"] = torch.tensor(hidden_share, dtype=torch.float64)
    expected["sink_rate"] = torch.tensor([100.0 * h / n_alpha for h in hits], dtype=torch.float64)
    expected["sink_rate_all"] = torch.tensor([100.0 * h / n_alpha for h in hits_all], dtype=torch.float64)
    return expected


def probe_and_truth(bridge, hf, padding_side: str):
    hooked = HookedModel(bridge)
    batch = hooked.prepare(PROMPTS, padding_side=padding_side)
    # thresholds around these random heads' alphas, so that the sink rates are not all 0 or 100
    config = ProbeConfig(batch_size=len(PROMPTS), sink_rate_eps=(0.05, 0.1, 0.2))
    result = probe_model(hooked, batch.model_input, attention_mask=batch.attention_mask, config=config)
    truth = expected_metrics(hf, batch.model_input.cpu(), batch.attention_mask.cpu(), config.sink_rate_eps)
    return hooked, result, truth


def assert_matches(result, truth) -> None:
    """Every anchor metric of ``result`` equals ``truth`` to 1e-5; the over-all-queries values
    are reported in the layers where some query cannot see the anchor, and only there."""
    close = lambda actual, expected: torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0, equal_nan=True)  # noqa: E731
    close(result.matrix("anchor_mass"), truth["anchor_mass"])
    close(result.matrix("alpha"), truth["alpha"])
    close(result.matrix("row_entropy"), truth["row_entropy"])
    close(result.matrix("value_weighted_anchor_share"), truth["value_weighted_anchor_share"])
    hidden = torch.tensor([layer.anchor_hidden_share for layer in result.layers], dtype=torch.float64)
    close(hidden, truth["hidden_share"])
    narrowed = (truth["hidden_share"] > 0).unsqueeze(1).expand_as(truth["anchor_mass"])
    all_mass = truth["anchor_mass_all_queries"].where(narrowed, torch.nan)
    close(result.matrix("anchor_mass_all_queries"), all_mass)
    close(result.matrix("alpha_all_queries"), truth["alpha_all"].where(narrowed, torch.nan))
    layer_all = torch.tensor([layer.anchor_mass_all_queries for layer in result.layers], dtype=torch.float64)
    close(layer_all, all_mass.mean(dim=1))
    close(torch.tensor([rate.percent for rate in result.sink_rates], dtype=torch.float64), truth["sink_rate"])
    rates_all = torch.tensor([rate.percent_all_queries for rate in result.sink_rates], dtype=torch.float64)
    close(rates_all, truth["sink_rate_all"])


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_every_anchor_metric_equals_transformers_under_the_window(windowed, padding_side):
    family, bridge, hf = windowed
    hooked, result, truth = probe_and_truth(bridge, hf, padding_side)
    windows = WINDOWED[family][3]
    assert hooked.spec.sliding_windows == windows
    # the prompts are several windows long: every local layer hides the anchor from some queries
    assert [share > 0.3 for share in truth["hidden_share"].tolist()] == [window > 0 for window in windows]
    assert not torch.equal(truth["sink_rate"], truth["sink_rate_all"])  # the two definitions differ here
    assert_matches(result, truth)


def test_ignoring_the_window_fails_the_comparison(windowed, monkeypatch):
    """Mutation check: a spec that forgets the window (every layer fully causal) no longer
    matches transformers."""
    _, bridge, hf = windowed
    monkeypatch.setattr(
        "sinkscope.interp.hooked_model.bridge_reach",
        lambda model, n_layers: {"sliding_windows": (), "attention_chunks": ()},
    )
    _, result, truth = probe_and_truth(bridge, hf, "right")
    with pytest.raises(AssertionError):
        assert_matches(result, truth)
