"""The sink-circuit battery on a pretrained model: the prompts tokenized as an audit
tokenizes them, the sink heads found by the audit's probe and rule, then every circuit
edit and its control (``sinkscope.probes.circuit_battery``), read out as the share of
anchor mass left and the change in next-token loss."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sinkscope.infra.arguments import check_argument
from sinkscope.infra.errors import InputError
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.pretrained_analysis.ablation import next_token_loss
from sinkscope.pretrained_analysis.boot import LoadedModel
from sinkscope.pretrained_analysis.loading import LoadSpec, load_model, loading_announced, wrap_model
from sinkscope.pretrained_analysis.prompts import (
    PromptSet,
    PromptSpec,
    load_prompt_set,
    prompt_texts,
    tokenize_prompts,
)
from sinkscope.pretrained_analysis.prompts import prompt_set as make_prompt_set
from sinkscope.probes.circuit_battery import run_circuit_battery
from sinkscope.probes.circuit_result import CircuitConfig, CircuitRun
from sinkscope.probes.probe import ProbeConfig
from sinkscope.probes.runner import iterate_batches, probe_batches
from sinkscope.probes.sink_metrics import SINK_EPS

LOSS_NAME = "next-token loss (nats)"


def _prompt_set(prompts: PromptSpec | PromptSet | Sequence[str]) -> PromptSet:
    if isinstance(prompts, PromptSet):
        return prompts
    if isinstance(prompts, PromptSpec):
        return load_prompt_set(prompts)
    return make_prompt_set(prompt_texts(prompts))


def _causal_model(model: LoadSpec | LoadedModel | Any, tokenizer: Any, progress: bool) -> LoadedModel:
    """``model`` loaded (a ``LoadSpec``) or wrapped, refused unless it is a causal LM."""
    if isinstance(model, LoadSpec):
        with loading_announced(model.label, progress):
            loaded = load_model(model, progress=progress)
    else:
        loaded = wrap_model(model, tokenizer)
    if not loaded.info.causal:
        raise InputError(
            f"{loaded.info.label} is not a causal LM; the battery reads next-token loss from causal models"
        )
    return loaded


def circuit(
    model: LoadSpec | LoadedModel | Any,
    prompts: PromptSpec | PromptSet | Sequence[str] | None = None,
    config: CircuitConfig | None = None,
    sink_eps: float = SINK_EPS,
    progress: bool = True,
    tokenizer: Any = None,
) -> CircuitRun:
    """The battery on ``model`` (a ``LoadSpec`` to load, a ``LoadedModel``, or a model in
    memory: a ``TransformerBridge``, or a Hugging Face model with its ``tokenizer``) over
    ``prompts`` (a ``PromptSpec``, a ``PromptSet`` or a list of strings; None: the default
    ``PromptSpec``). Its sink heads are those whose anchor mass over the prompts is at least
    ``1 - sink_eps``."""
    start = time.perf_counter()
    config = CircuitConfig() if config is None else config
    check_argument(config, CircuitConfig, "config", "a CircuitConfig")
    check_argument(progress, bool, "progress", "True or False")
    probe_config = ProbeConfig(sink_eps=sink_eps, batch_size=config.batch_size)
    prompt_set = _prompt_set(PromptSpec() if prompts is None else prompts)
    loaded = _causal_model(model, tokenizer, progress)
    tokenized = tokenize_prompts(prompt_set, loaded)
    hooked = HookedModel(loaded.bridge, prepend_bos=prompt_set.spec.prepend_bos)
    batches = iterate_batches(tokenized.tokens, tokenized.attention_mask, None, config.batch_size)
    probe = probe_batches(hooked, batches, probe_config)
    heads = probe.sink_heads()
    if not heads:
        strongest = max(probe.heads, key=lambda row: row.anchor_mass)
        raise InputError(
            f"no head of {loaded.info.label} has anchor mass >= {1 - sink_eps:g} on these prompts (the strongest, "
            f"L{strongest.layer}H{strongest.head}, has {strongest.anchor_mass:.3f}); raise --sink-eps to test weaker sinks",
            field="sink_eps",
        )
    battery = run_circuit_battery(
        hooked,
        tokenized.tokens,
        heads,
        config,
        attention_mask=tokenized.attention_mask,
        error_fn=next_token_loss,
        sink_eps=sink_eps,
    )
    summary = tokenized.summary
    return CircuitRun(
        model=loaded.info.label,
        inputs=(
            f"{summary.n_prompts} prompts ({summary.spec.source}), {summary.min_tokens}-{summary.max_tokens} "
            f"tokens, anchor {summary.anchor_token!r}"
        ),
        error_name=LOSS_NAME,
        sink_rule=f"anchor mass >= 1 - eps = {1 - sink_eps:g} over the prompts",
        battery=battery,
        seconds=time.perf_counter() - start,
    )
