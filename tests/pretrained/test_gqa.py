"""Grouped- and multi-query attention (Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma2, Gemma3, OLMo2 shapes):
every probe metric, every intervention and activation patching against transformers' eager
attention and a direct computation from the Hugging Face weights, on tiny checkpoints
built here (4 query heads sharing 2 key/value heads, or 1 for Gemma's multi-query); and a
one-line refusal of a model the bridge boots but that has no attention (Mamba)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from hf_reference import edited_eager_attention
from sinkscope.infra.codec import encode
from sinkscope.interp.hook_names import attn_hook
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.pretrained_analysis.audit import read_audit
from sinkscope.probes.default_state import DefaultStateConfig, default_state_test
from sinkscope.probes.head_ablations import head_means
from sinkscope.probes.interventions import (
    evict_anchor,
    mask_random_key,
    mean_ablate_head,
    redirect_to_sink,
    remove_sink,
    run_with_intervention,
    zero_head,
)
from sinkscope.probes.patch_hooks import hook_reaches_output
from sinkscope.probes.patching import activation_patching
from sinkscope.probes.probe import ProbeConfig
from sinkscope.probes.runner import probe_model
from tiny_models import GQA_FAMILIES, TINY_GPT2_PROMPTS, build_tiny_gqa, load_bridge, load_hf_model

torch.set_num_threads(1)

SINK = (1, 3)  # planted in the Llama model: query head 3 reads kv head 1, shared with head 2
PROMPTS = TINY_GPT2_PROMPTS + ["Softmax rows sum to one."]


@pytest.fixture(scope="module", params=list(GQA_FAMILIES))
def family_models(request, tmp_path_factory):
    directory = build_tiny_gqa(tmp_path_factory.mktemp(request.param), request.param)
    return request.param, load_bridge(directory), load_hf_model(directory)


@pytest.fixture(scope="module")
def llama_sink(tmp_path_factory):
    directory = build_tiny_gqa(tmp_path_factory.mktemp("llama_sink"), "llama", bos_sink_head=SINK)
    return directory, load_bridge(directory), load_hf_model(directory)


def attention_inputs(hf, tokens: torch.Tensor, mask: torch.Tensor):
    """transformers' eager forward with output_attentions, plus each layer's attention input
    (the normed hidden states) and the input of o_proj (transformers' own z, flattened)."""
    hidden, z = {}, {}
    handles = []
    for index, layer in enumerate(hf.model.layers):
        attn = layer.self_attn
        handles.append(
            attn.register_forward_pre_hook(
                lambda module, args, kwargs, i=index: hidden.__setitem__(
                    i, kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
                ),
                with_kwargs=True,
            )
        )
        handles.append(attn.o_proj.register_forward_pre_hook(lambda module, args, i=index: z.__setitem__(i, args[0])))
    try:
        with torch.no_grad():
            out = hf(tokens, attention_mask=mask.long(), output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
    return out, hidden, z


@torch.no_grad()
def direct_head_metrics(hf, tokens: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every per-head metric ``[layer, head]`` (and per-layer norms ``[layer]``) written out
    plainly from transformers' attentions and weights: values from v_proj, query head h
    reading kv head h // (heads / kv heads), per-head outputs through o_proj's columns."""
    out, hidden, z_hf = attention_inputs(hf, tokens, mask)
    config = hf.config
    n_layers, n_heads, n_kv = config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads
    d_head = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    group = n_heads // n_kv
    batch, n_pos = tokens.shape
    names = ("anchor_mass", "alpha", "row_entropy", "value_weighted_anchor_share", "anchor_value_norm", "head_out_norm")
    metrics = {name: torch.zeros(n_layers, n_heads, dtype=torch.float64) for name in names}
    layer_norm, head_norm_sum = torch.zeros(n_layers, dtype=torch.float64), torch.zeros(n_layers, dtype=torch.float64)
    for layer in range(n_layers):
        attn = hf.model.layers[layer].self_attn
        pattern = out.attentions[layer].detach().double()  # [batch, head, query, key]
        with torch.no_grad():
            v = attn.v_proj(hidden[layer]).double().view(batch, n_pos, n_kv, d_head)
        W_O = attn.o_proj.weight.double()  # [d_model, head * d_head]
        per_head_v = torch.stack([v[:, :, head // group] for head in range(n_heads)], dim=2)  # [b, p, head, d]
        z = torch.einsum("bhqk,bkhd->bqhd", pattern, per_head_v)
        torch.testing.assert_close(z.reshape(batch, n_pos, -1), z_hf[layer].double(), atol=1e-5, rtol=0)
        for head in range(n_heads):
            columns = W_O[:, head * d_head : (head + 1) * d_head]
            value_out = (per_head_v[:, :, head] @ columns.T).norm(dim=-1)  # [batch, key]
            head_out = (z[:, :, head] @ columns.T).norm(dim=-1)  # [batch, query]
            totals = {name: 0.0 for name in names}
            count, alpha_sum = 0, 0.0
            for row in range(batch):
                real = [i for i in range(n_pos) if mask[row, i]]
                anchor = real[0]
                totals["anchor_value_norm"] += float(v[row, anchor, head // group].norm())
                alpha_sum += sum(float(pattern[row, head, i, anchor]) for i in real) / len(real)
                for i in (i for i in real if i > anchor):
                    count += 1
                    a = pattern[row, head, i]
                    totals["anchor_mass"] += float(a[anchor])
                    visible = [j for j in real if j <= i]
                    p = a[visible] / a[visible].sum()
                    totals["row_entropy"] += float(-(p * p.log()).sum() / torch.log(torch.tensor(float(len(visible)))))
                    weighted = a[visible] * value_out[row, visible]
                    totals["value_weighted_anchor_share"] += float(
                        a[anchor] * value_out[row, anchor] / weighted.sum().detach()
                    )
                    totals["head_out_norm"] += float(head_out[row, i])
            for name in names:
                metrics[name][layer, head] = totals[name] / (batch if name == "anchor_value_norm" else count)
            metrics["alpha"][layer, head] = alpha_sum / batch
        real_after = [
            (row, i)
            for row in range(batch)
            for i in range(n_pos)
            if mask[row, i] and i > int(mask[row].long().argmax())
        ]
        with torch.no_grad():
            layer_out = attn.o_proj(z_hf[layer]).double()
        heads_out = torch.stack(
            [(z[:, :, head] @ W_O[:, head * d_head : (head + 1) * d_head].T).norm(dim=-1) for head in range(n_heads)],
            dim=-1,
        ).sum(dim=-1)
        layer_norm[layer] = sum(float(layer_out[row, i].norm()) for row, i in real_after) / len(real_after)
        head_norm_sum[layer] = sum(float(heads_out[row, i]) for row, i in real_after) / len(real_after)
    metrics["attn_out_norm"], metrics["head_out_norm_sum"] = layer_norm, head_norm_sum
    return metrics


def test_every_probe_metric_matches_transformers_per_query_head(family_models):
    family, bridge, hf = family_models
    hooked = HookedModel(bridge)
    spec = hooked.spec
    expected_kv = GQA_FAMILIES[family][2]["num_key_value_heads"]
    assert (spec.n_heads, spec.n_kv_heads, spec.kv_group) == (4, expected_kv, 4 // expected_kv)
    batch = hooked.prepare(PROMPTS, padding_side="right")
    assert not bool(batch.attention_mask.all())  # padded rows are part of the check
    expected = direct_head_metrics(hf, batch.model_input, batch.attention_mask)
    result = probe_model(
        hooked, batch.model_input, attention_mask=batch.attention_mask, config=ProbeConfig(batch_size=2)
    )
    for name in (
        "anchor_mass",
        "alpha",
        "row_entropy",
        "value_weighted_anchor_share",
        "anchor_value_norm",
        "head_out_norm",
    ):
        torch.testing.assert_close(result.matrix(name), expected[name], atol=1e-5, rtol=1e-5, msg=f"{family} {name}")
    for name in ("attn_out_norm", "head_out_norm_sum"):
        measured = torch.tensor([getattr(layer, name) for layer in result.layers], dtype=torch.float64)
        torch.testing.assert_close(measured, expected[name], atol=1e-5, rtol=1e-5, msg=f"{family} {name}")
    assert result.model.n_kv_heads == expected_kv and encode(result)["model"]["n_kv_heads"] == expected_kv


def test_every_attention_hook_is_editable(family_models):
    """What the README's family table promises: edits at every attention hook reach the
    output, so pattern interventions act at hook_pattern and patching works everywhere."""
    _, bridge, _ = family_models
    hooked = HookedModel(bridge)
    assert hooked.spec.pattern_writable
    one = hooked.prepare(PROMPTS[0])
    for name in ("q", "k", "v", "z", "attn_scores", "pattern"):
        assert hook_reaches_output(hooked, one, attn_hook(1, name)), name


# interventions against transformers' eager attention with the same edit ------------------
def drop_key(heads, key_rows):
    """Zero A[b, h, i, anchor] for rows ``key_rows(i, anchor)`` of ``heads`` and renormalise."""

    def edit(weights):
        edited = weights.clone()
        n = weights.shape[-1]
        for head in heads:
            for i in range(n):
                if key_rows(i):
                    edited[:, head, i, 0] = 0.0
                    total = edited[:, head, i].sum(dim=-1, keepdim=True)
                    edited[:, head, i] = torch.where(
                        total > 0, edited[:, head, i] / torch.where(total > 0, total, 1.0), 0.0
                    )
        return edited

    return edit


def one_hot_on_anchor(heads):
    def edit(weights):
        edited = weights.clone()
        for head in heads:
            edited[:, head] = 0.0
            edited[:, head, :, 0] = 1.0
        return edited

    return edit


@contextmanager
def replaced_head_inputs(hf, layer, replacement):
    """o_proj's input (transformers' z, heads side by side) rewritten by ``replacement(z)``."""
    handle = hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(
        lambda module, args: (replacement(args[0]),)
    )
    try:
        yield
    finally:
        handle.remove()


def hf_logits(hf, tokens):
    with torch.no_grad():
        return hf(tokens).logits


@pytest.fixture(scope="module")
def sink_batch(llama_sink):
    _, bridge, hf = llama_sink
    hooked = HookedModel(bridge)
    tokens = hooked.prepare(TINY_GPT2_PROMPTS[0]).model_input  # one unpadded prompt, BOS first
    return hooked, hf, tokens


def test_planted_sink_is_found_per_query_head_not_per_kv_head(llama_sink):
    _, bridge, _ = llama_sink
    result = probe_model(bridge, TINY_GPT2_PROMPTS)
    assert result.sink_heads() == [SINK]
    # head 2 shares kv head 1 with the sink but has its own query: no sink
    assert result.matrix("anchor_mass")[1, 2] < 0.5
    # the value metrics of heads 2 and 3 read the same kv head: same anchor value norm
    assert result.matrix("anchor_value_norm")[1, 2] == pytest.approx(float(result.matrix("anchor_value_norm")[1, 3]))


@pytest.mark.parametrize(
    "name, build, edit",
    [
        (
            "remove_sink",
            lambda: remove_sink([SINK, (0, 0)]),
            {1: drop_key([3], lambda i: i > 0), 0: drop_key([0], lambda i: i > 0)},
        ),
        ("evict_anchor", lambda: evict_anchor([(1, h) for h in range(4)]), {1: drop_key(range(4), lambda i: True)}),
        ("redirect_to_sink", lambda: redirect_to_sink([(1, 2)]), {1: one_hot_on_anchor([2])}),
    ],
)
def test_pattern_interventions_match_transformers_with_the_same_edit(sink_batch, name, build, edit):
    hooked, hf, tokens = sink_batch
    plain = hf_logits(hf, tokens)
    with edited_eager_attention(hf, edit):
        expected = hf_logits(hf, tokens)
    assert (expected - plain).abs().max() > 1e-3  # the edit matters
    torch.testing.assert_close(run_with_intervention(hooked, tokens, build()), expected, atol=1e-5, rtol=1e-5)


def test_head_output_interventions_match_transformers(sink_batch):
    hooked, hf, tokens = sink_batch
    d_head = hooked.spec.d_head

    def zero_slice(z):
        z = z.clone()
        z[..., 2 * d_head : 3 * d_head] = 0.0
        return z

    with replaced_head_inputs(hf, 1, zero_slice):
        expected = hf_logits(hf, tokens)
    torch.testing.assert_close(
        run_with_intervention(hooked, tokens, zero_head([(1, 2)])), expected, atol=1e-5, rtol=1e-5
    )

    reference = hooked.prepare(PROMPTS)
    _, _, z_hf = attention_inputs(hf, reference.model_input, reference.attention_mask)
    real = reference.attention_mask.double().unsqueeze(-1)
    mean_z = (z_hf[0].double() * real).sum(dim=0) / real.sum(dim=0).clamp_min(1)  # [pos, head * d_head]

    def mean_slice(z):
        z = z.clone()
        z[..., :d_head] = mean_z[: z.shape[1], :d_head].to(z.dtype)
        return z

    with replaced_head_inputs(hf, 0, mean_slice):
        expected = hf_logits(hf, tokens)
    means = head_means(hooked, reference.model_input, reference.attention_mask)
    assert means.z.shape == (2, reference.n_pos, 4, d_head)
    got = run_with_intervention(hooked, tokens, mean_ablate_head([(0, 0)], means))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_matched_control_and_default_state_test_on_gqa(sink_batch):
    hooked, _, tokens = sink_batch
    # the control masks one non-anchor key of the sink head only: its kv-sharing neighbour is untouched
    control = run_with_intervention(hooked, tokens, mask_random_key([SINK], seed=1))
    assert control.shape == run_with_intervention(hooked, tokens, remove_sink([SINK])).shape
    batch = hooked.prepare(PROMPTS)

    def loss(logits, prepared):
        return (
            torch.nn.functional.cross_entropy(
                logits[:, :-1].flatten(0, 1), prepared.model_input[:, 1:].flatten(), reduction="none"
            )
            .view(prepared.batch_size, -1)
            .mean(dim=1)
        )

    result = default_state_test(
        hooked,
        batch.model_input,
        [SINK, (0, 1)],
        loss,
        attention_mask=batch.attention_mask,
        config=DefaultStateConfig(n_bootstrap=50, max_single_heads=1),
    )
    assert [row.label for row in result.rows] == ["L1H3"]
    assert result.all_sink_heads is not None and result.all_sink_heads.label == "all_sink_heads"
    assert result.all_sink_heads.head_set == (SINK, (0, 1))
    assert "1 of 2 sink heads tested one by one" in result.note
    assert result.rows[0].remove_increase.mean != 0.0


# activation patching: q and z per query head, k and v per kv head -------------------------
def test_patching_k_and_v_per_kv_head_matches_transformers(sink_batch):
    hooked, hf, _ = sink_batch
    source = hooked.prepare(["Attention sinks park mass on the first token."]).model_input
    target = source.clone()
    target[0, 3:6] = torch.tensor([5, 6, 7])

    def last_logit_mean(logits, context):
        return logits[:, -1].mean(dim=-1)

    for hook, projection in (("v", "v_proj"), ("k", "k_proj")):
        result = activation_patching(hooked, source, target, hook, last_logit_mean, per=("layer", "head"))
        assert result.matrix("patched").shape == (2, 2)  # kv heads, not query heads
        captured = {}
        module = getattr(hf.model.layers[1].self_attn, projection)
        handle = module.register_forward_hook(lambda m, args, output: captured.__setitem__("source", output.clone()))  # noqa: B023 (used within this iteration)
        hf_logits(hf, source)
        handle.remove()
        d_head = hooked.spec.d_head

        def patch(m, args, output):
            output = output.clone()
            output[..., d_head : 2 * d_head] = captured["source"][..., d_head : 2 * d_head]  # noqa: B023 (used within this iteration)
            return output

        handle = module.register_forward_hook(patch)
        expected = float(hf_logits(hf, target)[:, -1].mean())
        handle.remove()
        row = next(row for row in result.rows if (row.layer, row.head) == (1, 1))
        assert row.patched == pytest.approx(expected, abs=1e-5)
    for hook in ("q", "z"):
        result = activation_patching(hooked, source, target, hook, last_logit_mean, per=("layer", "head"))
        assert result.matrix("patched").shape == (2, 4)
    with pytest.raises(ValueError, match=r"0\.\.1"):
        activation_patching(hooked, source, target, "v", last_logit_mean, heads=[3])


def test_audit_of_a_gqa_checkpoint_with_ablations(llama_sink, tmp_path):
    from sinkscope.cli import main

    directory, _, _ = llama_sink
    out = tmp_path / "audit"
    code = main(
        [
            "audit",
            str(directory),
            "--prompts",
            "default",
            "--n-prompts",
            "6",
            "--max-len",
            "24",
            "--ablate",
            "--examples",
            "1",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    result = read_audit(out)
    assert result.model.n_kv_heads == 2 and result.model.n_heads == 4
    assert result.sink_heads() == [SINK]
    assert result.ablation is not None
    labels = [row.label for row in result.ablation.default_state.rows]
    assert labels == ["L1H3"] and result.ablation.default_state.all_sink_heads == result.ablation.default_state.rows[0]


def test_a_model_without_attention_is_refused_in_one_line(tmp_path, capsys):
    import transformers

    from sinkscope.cli import main
    from tiny_models import train_byte_level_tokenizer

    tokenizer = train_byte_level_tokenizer()
    config = transformers.MambaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, state_size=4)
    transformers.MambaForCausalLM(config).save_pretrained(tmp_path / "mamba")
    tokenizer.save_pretrained(tmp_path / "mamba")
    capsys.readouterr()  # save_pretrained's own progress bar is not the refusal
    assert main(["audit", str(tmp_path / "mamba"), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "MambaForCausalLM has no attention hooks" in err
    assert not (tmp_path / "out").exists()
