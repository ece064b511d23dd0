"""Memory on long prompts (issue 24, item 6): the probe runner keeps no layer's
``[batch, head, query, key]`` attention pattern beyond that layer, and the attention examples
keep only the heads they show. Checked structurally, without RSS or wall-clock figures: a
tracking hook after each layer's probe hooks lists every live tensor shaped like a pattern
(``gc``) and requires that none of those alive at the previous layer's pattern hook still is.
The mutation checks keep the patterns (the runner's hook appends each layer's pattern to a
list; the examples' hook keeps a whole layer) and the same checks must fail.
On a tiny Llama (grouped-query attention) with 640-token prompts, the probe's anchor mass and
row entropy also equal transformers' eager attention there."""

from __future__ import annotations

import gc
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from sinkscope.interp.hook_names import attn_hook
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.pretrained_analysis import examples
from sinkscope.probes.probe import ProbeConfig
from sinkscope.probes.runner import ProbeAccumulator, probe_model
from tiny_models import load_bridge, load_hf_model, train_byte_level_tokenizer

torch.set_num_threads(1)

N_LAYERS, N_HEADS, N_KV_HEADS, TOKENS, N_PROMPTS = 3, 4, 2, 640, 2


def build_long_context_llama(directory) -> None:
    """A random 3-layer Llama (4 query heads sharing 2 key/value heads) with 1,024 positions."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = train_byte_level_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS,
        num_key_value_heads=N_KV_HEADS,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).eval().save_pretrained(directory)
    tokenizer.save_pretrained(directory)


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    directory = tmp_path_factory.mktemp("long_llama")
    build_long_context_llama(directory)
    bridge = load_bridge(directory)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, len(bridge.tokenizer), (N_PROMPTS, TOKENS), generator=generator)
    tokens[:, 0] = bridge.tokenizer.bos_token_id
    return directory, bridge, tokens


def _pattern_shaped(tensor: torch.Tensor, n_heads: int) -> bool:
    """A whole layer's pattern, of a batch or of one prompt: ``[batch, head, q, k]`` or
    ``[head, q, k]`` with q = k = TOKENS (one head's ``[q, k]`` copy is what an example keeps)."""
    return tensor.ndim >= 3 and tensor.shape[-3:] == (n_heads, TOKENS, TOKENS)


def _live_patterns(n_heads: int) -> list[torch.Tensor]:
    """Every live tensor shaped like a pattern (reference counting frees the rest at once)."""
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance on some deprecated torch objects warns
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor) and _pattern_shaped(obj, n_heads):
                found.append(obj)
    return found


class PatternTracker:
    """At each layer's pattern hook (attached after the probe's own), the storages of the
    pattern-shaped tensors alive at the previous layer's hook (the hook's pattern included)
    that are still alive; and at the end of a pass, those of the last layer. Storages, not
    tensor objects: a view or a numpy array over a pattern keeps its whole storage."""

    def __init__(self, n_heads: int) -> None:
        self.n_heads = n_heads
        self.previous: list[int] = []  # storage weak references (torch's own, as multiprocessing uses)
        self.kept: list[str] = []
        self.layers_seen: list[int] = []

    def _check(self, where: str) -> None:
        alive = sum(not torch.UntypedStorage._expired(handle) for handle in self.previous)
        for handle in self.previous:
            torch.UntypedStorage._free_weak_ref(handle)
        self.previous = []
        if alive:
            self.kept.append(f"{alive} pattern storage(s) from the previous layer alive at {where}")

    def hook(self, layer: int):
        def track(pattern: torch.Tensor, hook: Any) -> None:
            self._check(f"layer {layer}")
            self.layers_seen.append(layer)
            storages = {
                tensor.untyped_storage().data_ptr(): tensor for tensor in [pattern, *_live_patterns(self.n_heads)]
            }
            self.previous = [tensor.untyped_storage()._weak_ref() for tensor in storages.values()]

        return track

    def finish(self) -> None:
        self._check("the end of the pass")


@contextmanager
def tracking_probe_hooks(monkeypatch, tracker: PatternTracker) -> Iterator[None]:
    """``ProbeAccumulator.hooks`` with the tracker's hook after each layer's pattern hooks."""
    original = ProbeAccumulator.hooks

    def hooks(self: ProbeAccumulator) -> list[tuple[str, Any]]:
        return original(self) + [(attn_hook(layer, "pattern"), tracker.hook(layer)) for layer in self.layers]

    monkeypatch.setattr(ProbeAccumulator, "hooks", hooks)
    yield


def _probe_tracked(monkeypatch, bridge, tokens) -> PatternTracker:
    tracker = PatternTracker(N_HEADS)
    with tracking_probe_hooks(monkeypatch, tracker):
        for row in tokens:  # one prompt a pass, so each pass is one batch
            probe_model(HookedModel(bridge), row.unsqueeze(0), config=ProbeConfig(batch_size=1))
            tracker.finish()
    return tracker


def test_probe_runner_releases_each_layers_pattern_before_the_next(long_model, monkeypatch):
    _, bridge, tokens = long_model
    tracker = _probe_tracked(monkeypatch, bridge, tokens)
    assert tracker.layers_seen == list(range(N_LAYERS)) * N_PROMPTS  # the tracker saw every layer
    assert tracker.kept == []


def test_mutation_keeping_the_patterns_fails_the_check(long_model, monkeypatch):
    """The check can fail: a runner that keeps each layer's pattern is caught."""
    _, bridge, tokens = long_model
    kept: list[torch.Tensor] = []
    original = ProbeAccumulator._make_pattern_hook

    def keeping(self: ProbeAccumulator, layer: int):
        probe_hook = original(self, layer)

        def keep(pattern: torch.Tensor, hook: Any) -> None:
            kept.append(pattern.clone())
            probe_hook(pattern, hook)

        return keep

    monkeypatch.setattr(ProbeAccumulator, "_make_pattern_hook", keeping)
    tracker = _probe_tracked(monkeypatch, bridge, tokens[:1])
    assert len(kept) == N_LAYERS
    assert tracker.kept and "layer 1" in tracker.kept[0]


def test_attention_examples_keep_only_the_shown_heads(long_model, monkeypatch):
    """``examples._patterns`` on a long prompt: at each later layer's pattern hook, no earlier
    layer's pattern (whole, or one prompt's ``[head, q, k]``) is alive; and the mutation that
    keeps a whole layer is caught. The rows returned are the shown heads' patterns."""
    _, bridge, tokens = long_model
    hooked = HookedModel(bridge)
    batch = hooked.prepare(tokens[:1], torch.ones_like(tokens[:1], dtype=torch.bool))
    heads = ((0, 1), (2, 3), (2, 0))

    def run_tracked() -> tuple[PatternTracker, Any]:
        tracker = PatternTracker(N_HEADS)
        original = hooked.run_with_hooks

        def run_with_hooks(prepared, hooks, **kwargs):
            extra = [(attn_hook(layer, "pattern"), tracker.hook(layer)) for layer in range(N_LAYERS)]
            return original(prepared, list(hooks) + extra, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(hooked, "run_with_hooks", run_with_hooks)
            patterns = examples._patterns(hooked, batch, heads)
        return tracker, patterns

    tracker, patterns = run_tracked()
    assert tracker.kept == [] and patterns.shape == (len(heads), TOKENS, TOKENS)
    with torch.no_grad():
        eager = load_hf_model(long_model[0])(tokens[:1], output_attentions=True).attentions
    for index, (layer, head) in enumerate(heads):
        torch.testing.assert_close(torch.from_numpy(patterns[index]), eager[layer][0, head], atol=1e-5, rtol=0)

    def keep_layer(layer: int):  # the mutation, as the examples once kept it: numpy over a whole layer
        def hook(pattern: torch.Tensor, hook: Any) -> None:
            kept[layer] = pattern[0].float().cpu().numpy()

        return hook

    kept: dict[int, Any] = {}
    with monkeypatch.context() as patch:
        original_hook = hooked.run_with_hooks

        def run_keeping(prepared, hooks, **kwargs):
            keeping = [(attn_hook(layer, "pattern"), keep_layer(layer)) for layer in range(N_LAYERS)]
            return original_hook(prepared, keeping + list(hooks), **kwargs)

        patch.setattr(hooked, "run_with_hooks", run_keeping)
        mutated, _ = run_tracked()
    assert mutated.kept and len(kept) == N_LAYERS


def test_long_prompt_metrics_equal_eager_attention(long_model):
    """Anchor mass and row entropy over every query after BOS of both 640-token prompts equal
    transformers' eager attention (1e-5)."""
    directory, bridge, tokens = long_model
    result = probe_model(HookedModel(bridge), tokens, config=ProbeConfig(batch_size=N_PROMPTS))
    with torch.no_grad():
        attentions = load_hf_model(directory)(tokens, output_attentions=True).attentions
    log_visible = torch.log(torch.arange(1, TOKENS + 1, dtype=torch.float64).clamp_min(2))
    for row in result.heads:
        pattern = attentions[row.layer][:, row.head].double()  # [prompt, query, key]
        queries = pattern[:, 1:]  # every query after the anchor, both prompts pooled
        assert row.anchor_mass == pytest.approx(float(queries[..., 0].mean()), abs=1e-5)
        entropy = -torch.special.xlogy(queries, queries).sum(dim=-1) / log_visible[1:]
        assert row.row_entropy == pytest.approx(float(entropy.mean()), abs=1e-5)
        assert not math.isnan(row.row_entropy)
