"""Every attention variant a family's config switches on, against transformers' eager attention.

Each variant is a tiny random checkpoint built with transformers' own config class (QK-norm,
attention-logit softcapping, ``query_pre_attn_scalar``, per-layer RoPE bases, partial
rotary, q/k/v biases, parallel attention and MLP, tied and untied embeddings), saved and
loaded through sinkscope's ``load_model``. Every probe metric and every intervention's
output must equal transformers' eager attention on the same weights, under the same edit,
to 1e-5. The variant is made to matter (its weights moved off the identity, the softcap
below the logits), and each test shows it does: with the variant undone in transformers
(``Variant.undo``), the same comparison would miss by far more than the tolerance.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
import torch
import transformers

from sinkscope.interp.hooked_model import HookedModel
from sinkscope.pretrained_analysis.loading import LoadSpec, load_model
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
from sinkscope.probes.probe import ProbeConfig
from sinkscope.probes.runner import probe_model
from tiny_models import TINY_GPT2_PROMPTS, train_byte_level_tokenizer

torch.set_num_threads(1)

PROMPTS = TINY_GPT2_PROMPTS + ["Softmax rows sum to one."]
TOLERANCE = 1e-5
HEADS = [(0, 0), (1, 1)]  # the heads every intervention edits
SINK_RATE_EPS = ProbeConfig().sink_rate_eps


def attention_modules(hf) -> list[torch.nn.Module]:
    """Each layer's attention module, in layer order."""
    found = [m for m in hf.modules() if type(m).__name__.endswith("Attention") and hasattr(m, "layer_idx")]
    return sorted(found, key=lambda m: m.layer_idx)


def output_projection(attn: torch.nn.Module) -> torch.nn.Linear:
    return attn.o_proj if hasattr(attn, "o_proj") else attn.dense


def decoder_layers(hf) -> list[torch.nn.Module]:
    base = getattr(hf, "gpt_neox", None) or hf.model
    return list(base.layers)


# how a variant is made to matter, and undone ---------------------------------------------
def _jitter(name: str, scale: float = 0.5) -> Callable:
    """Move every ``name`` weight of the attention modules (a norm's gain) off its init."""

    def tweak(hf) -> None:
        with torch.no_grad():
            for attn in attention_modules(hf):
                weight = getattr(attn, name).weight
                weight.add_(scale * torch.randn_like(weight))

    return tweak


def _jitter_all(name: str) -> Callable:
    """Move every parameter of each attention module's ``name`` (a per-head LayerNorm) off its init."""

    def tweak(hf) -> None:
        with torch.no_grad():
            for attn in attention_modules(hf):
                for parameter in getattr(attn, name).parameters():
                    parameter.add_(0.5 * torch.randn_like(parameter))

    return tweak


def _no_qk_layernorm(hf) -> None:
    for attn in attention_modules(hf):
        attn.q_layernorm, attn.k_layernorm = torch.nn.Identity(), torch.nn.Identity()


def _biases(hf) -> None:
    with torch.no_grad():
        for attn in attention_modules(hf):
            for projection in (attn.q_proj, attn.k_proj, attn.v_proj):
                projection.bias.normal_(0.0, 1.0)


def _sharpen(hf) -> None:
    """Queries 8x larger, so logits pass a small softcap."""
    with torch.no_grad():
        for attn in attention_modules(hf):
            attn.q_proj.weight.mul_(8.0)


def _no_qk_norm(hf) -> None:
    for attn in attention_modules(hf):
        attn.q_norm, attn.k_norm = torch.nn.Identity(), torch.nn.Identity()


def _no_softcap(hf) -> None:
    for attn in attention_modules(hf):
        attn.attn_logit_softcapping = None


def _head_dim_scaling(hf) -> None:
    for attn in attention_modules(hf):
        attn.scaling = attn.head_dim**-0.5


def _global_rope_everywhere(hf) -> None:
    rotary = hf.model.rotary_emb
    rotary.sliding_attention_inv_freq = rotary.full_attention_inv_freq.clone()


def _no_biases(hf) -> None:
    with torch.no_grad():
        for attn in attention_modules(hf):
            for projection in (attn.q_proj, attn.k_proj, attn.v_proj):
                projection.bias.zero_()


def _untie(hf) -> None:
    hf.lm_head.weight = torch.nn.Parameter(hf.lm_head.weight.detach().clone() * 0.5)


def _tie(hf) -> None:
    hf.lm_head.weight = hf.get_input_embeddings().weight


@dataclass(frozen=True)
class Variant:
    """A family with one variant switched on. ``tweak`` makes it matter on random weights;
    ``undo`` (applied to a second copy of transformers' model, or ``undo_config`` to its
    config before loading) switches it off again."""

    name: str
    family: str
    config_class: str
    model_class: str
    config: dict
    tweak: Callable | None = None
    undo: Callable | None = None
    undo_config: dict = field(default_factory=dict)


ROPE_BASES = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 20.0},
    "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
}
GEMMA = {"num_key_value_heads": 2, "head_dim": 8, "sliding_window": 64}
VARIANTS = [
    Variant(
        "qk_norm",
        "qwen3",
        "Qwen3Config",
        "Qwen3ForCausalLM",
        {"num_key_value_heads": 2, "head_dim": 8},
        _jitter("q_norm"),
        _no_qk_norm,
    ),
    Variant(
        "qk_norm",
        "olmo2",
        "Olmo2Config",
        "Olmo2ForCausalLM",
        {"num_key_value_heads": 2},
        _jitter("q_norm"),
        _no_qk_norm,
    ),
    Variant("qk_norm", "gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", GEMMA, _jitter("q_norm"), _no_qk_norm),
    Variant(
        "qk_norm",
        "stablelm",
        "StableLmConfig",
        "StableLmForCausalLM",
        {"qk_layernorm": True, "num_key_value_heads": 2},
        _jitter_all("q_layernorm"),
        _no_qk_layernorm,
    ),
    Variant(
        "attn_logit_softcapping",
        "gemma2",
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {**GEMMA, "attn_logit_softcapping": 1.0},
        _sharpen,
        _no_softcap,
    ),
    Variant(
        "query_pre_attn_scalar",
        "gemma2",
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {**GEMMA, "query_pre_attn_scalar": 2},
        _sharpen,
        _head_dim_scaling,
    ),
    Variant(
        "query_pre_attn_scalar",
        "gemma3",
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {**GEMMA, "query_pre_attn_scalar": 2},
        _sharpen,
        _head_dim_scaling,
    ),
    Variant(
        "per_layer_rope_bases",
        "gemma3",
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {**GEMMA, "layer_types": ["sliding_attention", "full_attention"], "rope_parameters": ROPE_BASES},
        _sharpen,
        _global_rope_everywhere,
    ),
    Variant(
        "partial_rotary",
        "phi",
        "PhiConfig",
        "PhiForCausalLM",
        {"partial_rotary_factor": 0.5},
        _sharpen,
        undo_config={"partial_rotary_factor": 1.0},
    ),
    Variant(
        "partial_rotary",
        "stablelm",
        "StableLmConfig",
        "StableLmForCausalLM",
        {"partial_rotary_factor": 0.25, "num_key_value_heads": 2},
        _sharpen,
        undo_config={"partial_rotary_factor": 1.0},
    ),
    Variant(
        "partial_rotary",
        "gpt_neox",
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        {"rotary_pct": 0.25, "use_parallel_residual": False},
        None,
        undo_config={"partial_rotary_factor": 1.0},
    ),
    Variant(
        "parallel_attn_mlp",
        "gpt_neox",
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        {"rotary_pct": 0.25, "use_parallel_residual": True},
        None,
        undo_config={"use_parallel_residual": False},
    ),
    Variant(
        "parallel_attn_mlp",
        "stablelm",
        "StableLmConfig",
        "StableLmForCausalLM",
        {"use_parallel_residual": True, "num_key_value_heads": 2},
        None,
        undo_config={"use_parallel_residual": False},
    ),
    Variant("qkv_bias", "qwen2", "Qwen2Config", "Qwen2ForCausalLM", {"num_key_value_heads": 2}, _biases, _no_biases),
    Variant(
        "qkv_bias",
        "stablelm",
        "StableLmConfig",
        "StableLmForCausalLM",
        {"use_qkv_bias": True, "num_key_value_heads": 2},
        _biases,
        _no_biases,
    ),
    Variant(
        "tied_embeddings",
        "llama",
        "LlamaConfig",
        "LlamaForCausalLM",
        {"num_key_value_heads": 2, "tie_word_embeddings": True},
        None,
        _untie,
    ),
    Variant(
        "untied_embeddings",
        "llama",
        "LlamaConfig",
        "LlamaForCausalLM",
        {"num_key_value_heads": 2, "tie_word_embeddings": False},
        None,
        _tie,
    ),
]


def build(variant: Variant, directory) -> None:
    """Save the variant's tiny random checkpoint (2 layers, 4 heads, width 32) and tokenizer."""
    tokenizer = train_byte_level_tokenizer()
    config = getattr(transformers, variant.config_class)(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=None,  # a padding_idx row starts at zero, and the pad would be the anchor
        initializer_range=0.2,  # logits large enough for softcaps and scalings to matter
        attn_implementation="eager",
        **variant.config,
    )
    torch.manual_seed(0)
    model = getattr(transformers, variant.model_class)(config).eval()
    if variant.tweak is not None:
        variant.tweak(model)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def load_eager(directory, undo_config: dict | None = None):
    """transformers' model with eager attention; ``undo_config`` overrides config fields
    (a rope parameter when it names one) before loading the same weights."""
    config = transformers.AutoConfig.from_pretrained(str(directory))
    for name, value in (undo_config or {}).items():
        if name in (config.rope_parameters or {}):
            config.rope_parameters[name] = value
        else:
            setattr(config, name, value)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(directory), config=config, attn_implementation="eager"
    )
    return model.eval()


def variant_id(variant: Variant) -> str:
    return f"{variant.family}-{variant.name}"


@pytest.fixture(scope="module", params=VARIANTS, ids=variant_id)
def models(request, tmp_path_factory):
    variant = request.param
    directory = tmp_path_factory.mktemp(variant_id(variant))
    build(variant, directory)
    hooked = HookedModel(load_model(LoadSpec(str(directory), device="cpu"), progress=False).bridge)
    undone = load_eager(directory, variant.undo_config)
    if variant.undo is not None:
        variant.undo(undone)
    return variant, hooked, load_eager(directory), undone


# transformers' eager attention, captured and edited ----------------------------------------
def repeat_kv(value: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[batch, kv head, pos, d] -> one value per query head."""
    return value.repeat_interleave(n_heads // value.shape[1], dim=1)


@contextmanager
def eager_attention(hf, edits: dict | None = None):
    """Run transformers' own eager attention (softcap, scaling, masks as the family does),
    record each layer's weights, values, head outputs (z) and o-projection output, and
    replace the weights of the layers in ``edits`` ({layer: fn(weights [b, head, q, k])}),
    recomputing the attention output from them as transformers does."""
    module = sys.modules[type(attention_modules(hf)[0]).__module__]
    original = module.eager_attention_forward
    record: dict[str, dict[int, torch.Tensor]] = {"weights": {}, "value": {}, "z": {}, "out": {}, "resid": {}}

    def eager(attn, query, key, value, attention_mask, *args, **kwargs):
        output, weights = original(attn, query, key, value, attention_mask, *args, **kwargs)
        if edits and attn.layer_idx in edits:
            weights = edits[attn.layer_idx](weights)
            output = torch.matmul(weights, repeat_kv(value, weights.shape[1])).transpose(1, 2).contiguous()
        record["weights"][attn.layer_idx], record["value"][attn.layer_idx] = weights, value
        return output, weights

    handles = []
    for index, attn in enumerate(attention_modules(hf)):
        o_proj = output_projection(attn)
        handles.append(o_proj.register_forward_pre_hook(lambda m, args, i=index: record["z"].__setitem__(i, args[0])))
        handles.append(o_proj.register_forward_hook(lambda m, a, out, i=index: record["out"].__setitem__(i, out)))
    for index, layer in enumerate(decoder_layers(hf)):
        handles.append(
            layer.register_forward_hook(
                lambda m, a, out, i=index: record["resid"].__setitem__(i, out[0] if isinstance(out, tuple) else out)
            )
        )
    module.eager_attention_forward = eager
    try:
        yield record
    finally:
        module.eager_attention_forward = original
        for handle in handles:
            handle.remove()


def eager_logits(hf, tokens, mask=None, edits=None, z_edit=None):
    """transformers' logits, with pattern ``edits`` and ``z_edit`` ({layer: fn(z)}) in place."""
    handles = []
    for layer, replacement in (z_edit or {}).items():
        o_proj = output_projection(attention_modules(hf)[layer])
        handles.append(o_proj.register_forward_pre_hook(lambda m, args, f=replacement: (f(args[0]),)))
    try:
        with torch.no_grad(), eager_attention(hf, edits):
            return hf(tokens, attention_mask=None if mask is None else mask.long()).logits
    finally:
        for handle in handles:
            handle.remove()


# every probe metric, written out plainly from transformers' tensors ------------------------
@torch.no_grad()
def reference_metrics(hf, tokens: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-head metrics ``[layer, head]``, per-layer ``[layer]`` and model-wide scalars, as
    docs/metrics.md defines them, from transformers' weights, values, z and outputs. The
    prompts are right-padded, so each prompt's anchor is position 0."""
    assert bool(mask[:, 0].all())
    with eager_attention(hf) as record:
        hf(tokens, attention_mask=mask.long())
    n_pos = tokens.shape[1]
    positions = torch.arange(n_pos)
    selected = mask & (positions > 0).unsqueeze(0)  # [b, q]: real queries after the anchor
    visible = mask.unsqueeze(1) & (positions.view(1, 1, -1) <= positions.view(1, -1, 1))  # [b, q, k]
    count = selected.sum()
    per_head: dict[str, list] = {name: [] for name in HEAD_METRICS}
    per_layer: dict[str, list] = {name: [] for name in LAYER_METRICS}
    outs, alphas = [], []
    for layer, attn in enumerate(attention_modules(hf)):
        weights = record["weights"][layer].double()  # [b, head, q, k]
        n_heads = weights.shape[1]
        value = repeat_kv(record["value"][layer].double(), n_heads)  # [b, head, k, d]
        d_head = value.shape[-1]
        w_o = output_projection(attn).weight.double().view(-1, n_heads, d_head)  # [d_model, head, d]
        z = record["z"][layer].double().view(*tokens.shape, n_heads, d_head)  # [b, q, head, d]
        value_out = torch.einsum("bhkd,mhd->bhkm", value, w_o).norm(dim=-1)  # [b, head, k]
        head_out = torch.einsum("bqhd,mhd->bhqm", z, w_o).norm(dim=-1)  # [b, head, q]
        on_anchor = weights[..., 0]  # [b, head, q]
        sel = selected.unsqueeze(1)
        per_head["anchor_mass"].append((on_anchor * sel).sum(dim=(0, 2)) / count)
        per_head["row_mass"].append((weights.sum(dim=-1) * sel).sum(dim=(0, 2)) / count)
        real = mask.unsqueeze(1)
        alpha = (on_anchor * real).sum(dim=2) / real.sum(dim=2)  # [b, head]: per prompt
        per_head["alpha"].append(alpha.mean(dim=0))
        alphas.append(alpha)
        p = torch.where(visible.unsqueeze(1), weights, 0.0)
        p = p / p.sum(dim=-1, keepdim=True)
        entropy = -torch.xlogy(p, p).sum(dim=-1) / visible.sum(dim=-1).double().log().clamp_min(1e-300).unsqueeze(1)
        per_head["row_entropy"].append((torch.where(sel, entropy, 0.0)).sum(dim=(0, 2)) / count)
        weighted = torch.where(visible.unsqueeze(1), weights * value_out.unsqueeze(2), 0.0)  # [b, head, q, k]
        share = weighted[..., 0] / weighted.sum(dim=-1)
        per_head["value_weighted_anchor_share"].append(torch.where(sel, share, 0.0).sum(dim=(0, 2)) / count)
        per_head["anchor_value_norm"].append(value[:, :, 0].norm(dim=-1).mean(dim=0))
        per_head["head_out_norm"].append((head_out * sel).sum(dim=(0, 2)) / count)
        out = record["out"][layer].double()  # [b, q, d_model]
        outs.append(out)
        per_layer["attn_out_norm"].append((out.norm(dim=-1) * selected).sum() / count)
        per_layer["head_out_norm_sum"].append((head_out.sum(dim=1) * selected).sum() / count)
        resid = record["resid"][layer].double()
        per_layer["anchor_resid_norm"].append(resid[:, 0].norm(dim=-1).mean())
        per_layer["max_abs_resid"].append(resid.abs().amax(dim=-1)[mask].max())
    metrics = {name: torch.stack(rows) for name, rows in (per_head | per_layer).items()}
    norm_of_sum = torch.stack(outs).sum(dim=0).norm(dim=-1)
    sum_of_norms = torch.stack(outs).norm(dim=-1).sum(dim=0)
    metrics["attn_out_norm_of_sum"] = (norm_of_sum * selected).sum() / count
    metrics["attn_out_sum_of_norms"] = (sum_of_norms * selected).sum() / count
    for eps in SINK_RATE_EPS:  # Gu et al.'s Sink_1^eps: percent of (prompt, layer, head) entries
        metrics[f"sink_rate_{eps}"] = 100.0 * (torch.stack(alphas) > eps).double().mean()
    return metrics


HEAD_METRICS = (
    "anchor_mass",
    "row_mass",
    "alpha",
    "row_entropy",
    "value_weighted_anchor_share",
    "anchor_value_norm",
    "head_out_norm",
)
LAYER_METRICS = ("attn_out_norm", "head_out_norm_sum", "anchor_resid_norm", "max_abs_resid")


def measured(result, name: str) -> torch.Tensor:
    if name.startswith("sink_rate_"):
        eps = float(name.removeprefix("sink_rate_"))
        return torch.tensor(next(rate.percent for rate in result.sink_rates if rate.eps == eps), dtype=torch.float64)
    if name in HEAD_METRICS:
        return result.matrix(name).double()
    if name in LAYER_METRICS:
        return torch.tensor([getattr(row, name) for row in result.layers], dtype=torch.float64)
    return torch.tensor(getattr(result, name), dtype=torch.float64)


def largest_gap(first: dict, second: dict) -> float:
    return max(float((first[name] - second[name]).abs().max()) for name in first)


def test_every_probe_metric_matches_transformers(models):
    variant, hooked, hf, undone = models
    batch = hooked.prepare(PROMPTS, padding_side="right")
    assert not bool(batch.attention_mask.all())  # padded rows are part of the check
    expected = reference_metrics(hf, batch.model_input, batch.attention_mask)
    result = probe_model(
        hooked, batch.model_input, attention_mask=batch.attention_mask, config=ProbeConfig(batch_size=2)
    )
    for name, value in expected.items():
        torch.testing.assert_close(
            measured(result, name), value, atol=TOLERANCE, rtol=TOLERANCE, msg=f"{variant_id(variant)} {name}"
        )
    if not variant.name.endswith("embeddings"):  # embeddings change only the logits
        # the variant matters: with it undone the same metrics move far past the tolerance
        assert largest_gap(reference_metrics(undone, batch.model_input, batch.attention_mask), expected) > 1e-3


# every intervention, and the same edit in transformers -------------------------------------
def renormalised(rows: torch.Tensor) -> torch.Tensor:
    """Rows divided by their sums; a row left with no mass stays zero (the head writes nothing)."""
    total = rows.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, rows / torch.where(total > 0, total, 1.0), 0.0)


def drop_keys(mask: torch.Tensor, heads, key_of: Callable) -> Callable:
    """An edit: for each listed head, zero A[b, h, i, key_of(b, i)] (None: row untouched), renormalised."""

    def edit(weights):
        edited = weights.clone()
        for b, i in mask.nonzero().tolist():
            key = key_of(b, i)
            if key is None:
                continue
            for head in heads:
                edited[b, head, i, key] = 0.0
                edited[b, head, i] = renormalised(edited[b, head, i])
        return edited

    return edit


def one_hot_on_anchor(mask: torch.Tensor, heads) -> Callable:
    def edit(weights):
        edited = weights.clone()
        for b, i in mask.nonzero().tolist():
            for head in heads:
                edited[b, head, i] = 0.0
                edited[b, head, i, 0] = 1.0
        return edited

    return edit


def random_keys(mask: torch.Tensor, seed: int) -> Callable:
    """The matched control's key for query i: one visible non-anchor key, uniform, drawn
    from one generator seeded with ``seed`` over the [batch, query, key] grid."""
    n_pos = mask.shape[1]
    positions = torch.arange(n_pos)
    visible = mask.unsqueeze(1) & (positions.view(1, 1, -1) <= positions.view(1, -1, 1))
    candidates = visible & (positions.view(1, 1, -1) != 0)
    draws = torch.rand(candidates.shape, generator=torch.Generator().manual_seed(seed)).masked_fill(~candidates, -1.0)
    choice = draws.argmax(dim=-1)
    return lambda b, i: int(choice[b, i]) if i > 0 and bool(candidates[b, i].any()) else None


def per_layer(heads, make_edit: Callable) -> dict:
    layers = sorted({layer for layer, _ in heads})
    return {layer: make_edit([head for head_layer, head in heads if head_layer == layer]) for layer in layers}


def pattern_edits(kind: str, mask: torch.Tensor) -> dict:
    if kind == "remove_sink":
        return per_layer(HEADS, lambda heads: drop_keys(mask, heads, lambda b, i: 0 if i > 0 else None))
    if kind == "evict_anchor":
        return per_layer(HEADS, lambda heads: drop_keys(mask, heads, lambda b, i: 0))
    if kind == "redirect_to_sink":
        return per_layer(HEADS, lambda heads: one_hot_on_anchor(mask, heads))
    return per_layer(HEADS, lambda heads: drop_keys(mask, heads, random_keys(mask, seed=3)))


def z_edits(replacement: Callable) -> dict:
    """{layer: fn(z)} writing ``replacement(z_head, layer, head)`` into each listed head's slice."""

    def make(layer: int) -> Callable:
        def edit(z):
            z = z.clone().view(*z.shape[:2], -1, D_HEAD)
            for head_layer, head in HEADS:
                if head_layer == layer:
                    z[:, :, head] = replacement(z[:, :, head], layer, head)
            return z.flatten(2)

        return edit

    return {layer: make(layer) for layer in sorted({layer for layer, _ in HEADS})}


D_HEAD = 8  # every variant's head width (hidden 32 over 4 heads, or head_dim 8)
PATTERN_KINDS = {
    "remove_sink": remove_sink,
    "evict_anchor": evict_anchor,
    "redirect_to_sink": redirect_to_sink,
    "mask_random_key": lambda heads: mask_random_key(heads, seed=3),
}


def assert_same_logits(ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor, what: str) -> None:
    """Equal at every real position (padded positions' logits are nobody's measurement)."""
    torch.testing.assert_close(ours[mask], theirs[mask], atol=TOLERANCE, rtol=TOLERANCE, msg=what)


@pytest.mark.parametrize("kind", list(PATTERN_KINDS))
def test_pattern_interventions_match_transformers_with_the_same_edit(models, kind):
    variant, hooked, hf, undone = models
    batch = hooked.prepare(PROMPTS, padding_side="right")
    tokens, mask = batch.model_input, batch.attention_mask
    expected = eager_logits(hf, tokens, mask, edits=pattern_edits(kind, mask))
    assert (expected - eager_logits(hf, tokens, mask))[mask].abs().max() > 1e-3  # the edit matters
    ours = run_with_intervention(hooked, tokens, PATTERN_KINDS[kind](HEADS), attention_mask=mask)
    assert_same_logits(ours, expected, mask, f"{variant_id(variant)} {kind}")
    # the variant matters to the edited output too
    assert (eager_logits(undone, tokens, mask, edits=pattern_edits(kind, mask)) - expected)[mask].abs().max() > 1e-3


def test_head_output_interventions_match_transformers(models):
    variant, hooked, hf, _ = models
    batch = hooked.prepare(PROMPTS, padding_side="right")
    tokens, mask = batch.model_input, batch.attention_mask
    expected = eager_logits(hf, tokens, mask, z_edit=z_edits(lambda z, layer, head: torch.zeros_like(z)))
    ours = run_with_intervention(hooked, tokens, zero_head(HEADS), attention_mask=mask)
    assert_same_logits(ours, expected, mask, f"{variant_id(variant)} zero_head")
    # mean ablation: each head's z averaged over the prompts' real tokens at each position
    with torch.no_grad(), eager_attention(hf) as record:
        hf(tokens, attention_mask=mask.long())
    real = mask.double().view(*mask.shape, 1, 1)
    mean_z = {
        layer: (record["z"][layer].double().view(*mask.shape, -1, D_HEAD) * real).sum(dim=0) / real.sum(dim=0)
        for layer in record["z"]
    }
    expected = eager_logits(
        hf, tokens, mask, z_edit=z_edits(lambda z, layer, head: mean_z[layer][:, head].to(z.dtype).expand_as(z))
    )
    means = head_means(hooked, tokens, attention_mask=mask)
    ours = run_with_intervention(hooked, tokens, mean_ablate_head(HEADS, means), attention_mask=mask)
    assert_same_logits(ours, expected, mask, f"{variant_id(variant)} mean_ablate_head")


def test_plain_logits_match_transformers(models):
    """What tied and untied embeddings change: the logits; undone, they would differ."""
    variant, hooked, hf, undone = models
    batch = hooked.prepare(PROMPTS, padding_side="right")
    tokens, mask = batch.model_input, batch.attention_mask
    expected = eager_logits(hf, tokens, mask)
    assert_same_logits(hooked.forward(batch), expected, mask, f"{variant_id(variant)} logits")
    assert (eager_logits(undone, tokens, mask) - expected)[mask].abs().max() > 1e-3


def test_a_qk_norm_transformer_lens_cannot_hook_is_one_line(tmp_path, capsys):
    """Phi with qk_layernorm (no released Phi checkpoint sets it): TransformerLens 4.3's Phi
    adapter declares no QK-norm and refuses to boot it; the audit says so in one line
    instead of a traceback."""
    from sinkscope.cli import main

    phi = Variant("qk_norm", "phi", "PhiConfig", "PhiForCausalLM", {"qk_layernorm": True}, _jitter_all("q_layernorm"))
    build(phi, tmp_path / "model")
    assert main(["audit", str(tmp_path / "model"), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot hook the QK-norm of" in err
    assert not (tmp_path / "out").exists()
