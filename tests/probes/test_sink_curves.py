"""The sink experiments' one-pass statistics (``sink_samples``, ``sink_curves``) against
transformers' eager attention on the same weights, computed here: each prompt's alpha and
anchor mass at several lengths T from one pass equal those of the prompts cut to T; the
sink rate at every eps equals the probe's pooled rate; the toy model runs the same probes."""

from __future__ import annotations

import math

import pytest
import torch

from sinkscope.infra.errors import InputError
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.probes.probe import ProbeConfig
from sinkscope.probes.runner import iterate_batches, probe_batches, probe_model
from sinkscope.probes.sink_curves import prompt_sink_rates, sample_mean, sink_curves
from sinkscope.probes.sink_samples import SampleSums, cut_tokens
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2, load_bridge, load_hf_model, toy_sink_model

LENGTHS = (3, 6, 10)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    directory = build_tiny_gpt2(tmp_path_factory.mktemp("gpt2"), n_layer=2, n_head=2, bos_sink_head=(0, 1))
    bridge = load_bridge(directory)
    hooked = HookedModel(bridge)
    rows = [bridge.to_tokens(text)[0] for text in TINY_GPT2_PROMPTS]  # BOS first
    width = min(len(row) for row in rows)
    tokens = torch.stack([row[:width] for row in rows]).cpu()
    return directory, hooked, tokens


def eager_alpha_mass(directory, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[prompt, layer, head]`` alpha_0 (queries i >= 0) and anchor mass (queries i >= 1)
    from Hugging Face's eager attention on ``tokens`` (no padding)."""
    with torch.no_grad():
        attentions = load_hf_model(directory).eval()(tokens, output_attentions=True).attentions
    to_first = torch.stack([pattern[..., 0].double() for pattern in attentions], dim=1)  # [prompt, layer, head, query]
    return to_first.mean(dim=-1), to_first[..., 1:].mean(dim=-1)


def test_each_length_read_from_one_pass_equals_the_prompts_cut_to_it_under_eager_attention(tiny):
    directory, hooked, tokens = tiny
    spec = hooked.spec
    sums = SampleSums(spec.n_layers, spec.n_heads, 0, LENGTHS)
    probe_batches(hooked, iterate_batches(tokens, None, None, 8), ProbeConfig(), sums)
    alpha, mass = sums.alpha(), sums.mass()  # [prompt, point, layer, head]; rows in the given order
    full_alpha, full_mass = eager_alpha_mass(directory, tokens)
    torch.testing.assert_close(alpha[:, 0], full_alpha, atol=1e-5, rtol=0)
    torch.testing.assert_close(mass[:, 0], full_mass, atol=1e-5, rtol=0)
    for index, length in enumerate(LENGTHS):
        cut_alpha, cut_mass = eager_alpha_mass(directory, tokens[:, :length])
        torch.testing.assert_close(alpha[:, 1 + index], cut_alpha, atol=1e-5, rtol=0)
        torch.testing.assert_close(mass[:, 1 + index], cut_mass, atol=1e-5, rtol=0)
    # the planted BOS sink (layer 0, head 1) holds at every length
    assert bool((alpha[:, :, 0, 1] > 0.9).all())


def test_a_prompt_shorter_than_t_is_left_out_at_t_and_counted_below_it(tiny):
    _, hooked, tokens = tiny
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[0, 5:] = False  # the first prompt holds 5 tokens
    curves = sink_curves(hooked, tokens, mask, eps_curve=(0.3,), lengths=(4, 8))
    n = {point.length: point.sink_rate.n for point in curves.length_curve}
    assert n == {4: len(tokens), 8: len(tokens) - 1}


def test_the_sink_rate_at_every_eps_of_one_pass_equals_the_probe_s_pooled_rate(tiny):
    _, hooked, tokens = tiny
    epsilons = (0.05, 0.3, 0.5, 0.8)
    curves = sink_curves(hooked, tokens, eps_curve=epsilons)
    pooled = probe_model(hooked, tokens, config=ProbeConfig(sink_rate_eps=epsilons)).sink_rates
    assert [point.eps for point in curves.eps_curve] == list(epsilons)
    for point, rate in zip(curves.eps_curve, pooled, strict=True):
        assert point.sink_rate.mean == pytest.approx(rate.percent, abs=1e-9)
        assert point.sink_rate.n == len(tokens)
    rates = [point.sink_rate.mean for point in curves.eps_curve]
    assert rates == sorted(rates, reverse=True)  # a higher threshold counts fewer heads


def test_the_toy_model_runs_the_same_probes_and_its_planted_head_is_a_sink_at_every_length():
    model = toy_sink_model()
    torch.manual_seed(1)
    inputs = torch.randn(6, 8, 8)
    inputs[:, 0] = 0.0
    inputs[:, 0, 0] = 1.0  # the BOS flag the planted head's key reads
    inputs[:, 1:, 0] = 0.0
    inputs[:, 1:, 7] = 1.0  # the content tokens' bias coordinate its query reads
    curves = sink_curves(model, inputs, eps_curve=(0.3, 0.5), lengths=(4, 8))
    # head (0, 0) of 4 heads (alpha about 0.9) is a sink at any eps well below it: a quarter of the heads at least
    assert all(point.sink_rate.mean >= 25.0 for point in (*curves.eps_curve, *curves.length_curve))
    assert {point.length for point in curves.length_curve} == {4, 8}
    frame = curves.to_dataframe()
    assert set(frame["experiment"]) == {"input_type", "eps", "length"}
    assert "Sink rate against" in curves._repr_html_()


def test_prompt_sink_rates_count_only_measured_heads():
    alpha = torch.tensor([[[0.9, 0.1], [math.nan, 0.5]], [[math.nan, math.nan], [math.nan, math.nan]]])
    rates = prompt_sink_rates(alpha, 0.3)
    assert rates[0].item() == pytest.approx(100.0 * 2 / 3)
    assert math.isnan(rates[1].item())


def test_no_interval_from_under_five_prompts_and_an_interval_around_the_mean_from_five():
    """The small-n rule (docs/metrics.md): no interval from fewer than 5 units."""
    one = sample_mean(torch.tensor([0.4]))
    assert one.n == 1 and one.mean == pytest.approx(0.4) and math.isnan(one.ci_low) and math.isnan(one.ci_high)
    four = sample_mean(torch.tensor([0.1, 0.2, 0.3, 0.4, math.nan]), n_bootstrap=500, seed=3)
    assert four.n == 4 and four.mean == pytest.approx(0.25) and math.isnan(four.ci_low) and math.isnan(four.ci_high)
    several = sample_mean(torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, math.nan]), n_bootstrap=500, seed=3)
    assert several.n == 5 and several.ci_low <= several.mean <= several.ci_high
    assert several.ci_low < several.ci_high


def test_cut_tokens_keeps_only_prompts_long_enough():
    tokens = torch.arange(12).view(3, 4)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    cut, cut_mask = cut_tokens(tokens, mask, 3)
    assert cut.tolist() == [[0, 1, 2], [8, 9, 10]] and bool(cut_mask.all())


def test_bad_settings_name_their_fix(tiny):
    _, hooked, tokens = tiny
    with pytest.raises(InputError, match="eps curve"):
        sink_curves(hooked, tokens, eps_curve=(1.2,))
    with pytest.raises(InputError, match="length"):
        sink_curves(hooked, tokens, lengths=(1,))


def _direct_sink_rate(model, tokens: torch.Tensor, eps: float) -> float:
    """Sink_1^eps in percent, mean over prompts, from the weights: each layer's softmax of
    x W_Q (x W_K)^T under the causal mask, alpha the mean over every query of A[i, 0]."""
    hits, resid = [], tokens
    for layer, block in enumerate(model.blocks):
        attention = model.attention(layer)
        q = torch.einsum("npd,hde->nhpe", resid, attention.W_Q)
        k = torch.einsum("npd,hde->nhpe", resid, attention.W_K)
        scores = (q @ k.transpose(-1, -2)) * attention.scale
        causal = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool).tril()
        pattern = scores.masked_fill(~causal, -math.inf).softmax(dim=-1)
        hits.append(pattern[..., 0].mean(dim=-1) > eps)  # [prompt, head]
        resid = block(resid)
    return 100.0 * float(torch.cat(hits, dim=1).double().mean(dim=1).mean())


def test_toy_input_types_side_by_side_match_the_weights_and_keep_the_planted_bos_sink():
    """Every toy input type keeps BOS first with content tokens after it, so the planted
    head (BOS-flag key, content-bias query) sinks on all three; each type's sink rate
    equals the one computed from the weights."""
    from sinkscope.toy.task import TOY_INPUT_TYPES, TaskConfig, toy_input_tokens

    task = TaskConfig(d_model=8, seq_len=8)
    inputs = {kind: toy_input_tokens(task, kind, 12, seed=3) for kind in TOY_INPUT_TYPES}
    repeated = inputs["repeated"]
    assert torch.equal(repeated[:, 1:], repeated[:, 1:2].expand_as(repeated[:, 1:]))  # one token after BOS
    assert bool((inputs["random"][:, :, 1] == 0).all())  # no trigger
    assert bool((inputs["task"][:, task.eval_trigger_position, 1] == 1).all())
    model = toy_sink_model()
    curves = sink_curves(model, inputs, eps_curve=(0.3,))
    assert [row.input_type for row in curves.input_types] == list(TOY_INPUT_TYPES)
    with torch.no_grad():
        for row in curves.input_types:
            assert row.sink_rate.n == 12 and row.sink_rate.mean >= 25.0  # the planted head of 4, at least
            assert row.sink_rate.mean == pytest.approx(_direct_sink_rate(model, inputs[row.input_type], 0.3))
    with pytest.raises(InputError, match="toy input type"):
        toy_input_tokens(task, "prompts", 4)
    with pytest.raises(InputError, match="mapping of input type"):
        sink_curves(model, {})


def test_inputs_no_sink_rate_can_be_read_from_are_refused_in_one_line():
    model = toy_sink_model()
    bad = {
        "NaN": torch.full((4, 6, 8), math.nan),
        "2 positions": torch.randn(4, 1, 8),
        "token ids": torch.randn(4, 6, 8).long(),
    }
    for words, tokens in zip(("NaN or infinite", "at least one input of 2 positions", "toy tokens"), bad.values()):
        with pytest.raises(InputError, match=words):
            sink_curves(model, tokens)


def test_sink_curves_arguments_are_typed_as_documented():
    model, tokens = toy_sink_model(), torch.randn(4, 6, 8)
    for bad, words in (
        ({"eps_curve": 0.3}, "eps_curve must be a tuple"),
        ({"eps_curve": ("0.3",)}, "eps_curve must be a tuple"),
        ({"lengths": (4.5,)}, "lengths must be a tuple"),
        ({"n_bootstrap": 0}, "n_bootstrap must be >= 20"),
        ({"seed": -1}, "seed must be >= 0"),
        ({"config": "default"}, "config must be a ProbeConfig"),
    ):
        with pytest.raises(InputError, match=words):
            sink_curves(model, tokens, **bad)
