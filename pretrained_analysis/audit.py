"""The audit of one pretrained model: probes over a prompt set, optional ablations, figures.

``audit(model, prompts, config)`` loads the model (or takes a loaded one), tokenizes the
prompts, streams them through ``sinkscope.probes.runner.probe_batches`` in batches grouped by
length (only the hooks the probes read, one layer at a time, nothing cached, no logits),
and returns an ``AuditResult``.
``write_audit(result, directory)`` writes ``audit.json``, ``heads.csv`` and the figures,
each file atomically.

The anchor is each prompt's first real token: the BOS token when it is prepended, [CLS]
for BERT-family encoders. ``--ablate`` (causal models only) measures the next-token loss
(per prompt: mean cross-entropy over its predicted tokens; then averaged over prompts):
for each sink head and all of them together, with ``remove_sink`` and its matched
control ``mask_random_key`` (``sinkscope.probes.default_state``, bootstrap intervals over prompts),
and with the anchor evicted from every head (``evict_anchor``: the eviction StreamingLLM avoids by keeping the first tokens).
"""

from __future__ import annotations

import functools
import math
import platform
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from sinkscope.infra.arguments import check_argument, check_path
from sinkscope.infra.bounds import (
    NONNEGATIVE,
    Bound,
    Problem,
    head_ref_problems,
    relative_path_problems,
)
from sinkscope.infra.codec import Upgrade, read_result, write_result
from sinkscope.infra.errors import InputError, RunFailed
from sinkscope.infra.heartbeat import heartbeat, progress_bar
from sinkscope.infra.output_files import OutputFiles
from sinkscope.infra.provenance import package_version
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.interp.learned_sinks import has_learned_sinks
from sinkscope.pretrained_analysis.ablation import (
    AblationResult,
    AblationSettings,
    ablate,
    upgrade_ablation_v1,
)
from sinkscope.pretrained_analysis.anchors import anchor_words
from sinkscope.pretrained_analysis.audit_config import AuditConfig
from sinkscope.pretrained_analysis.audit_experiments import (
    audit_experiments,
    check_experiments_reachable,
    experiment_samples,
)
from sinkscope.pretrained_analysis.audit_figures import (
    AUDIT_FIGURES,
    EXAMPLE_FIGURE,
    GEOMETRY_FIGURE,
    LAYER_FIGURE,
    MAP_FIGURE,
    draw_audit_figures,
)
from sinkscope.pretrained_analysis.examples import (
    EXAMPLE_TEXT_CHARS,
    AttentionExample,
    attention_examples,
    with_token_texts,
)
from sinkscope.pretrained_analysis.loading import LoadedModel, LoadSpec, ModelInfo, load_model, wrap_model
from sinkscope.pretrained_analysis.prompts import (
    PromptError,
    PromptSet,
    PromptSpec,
    PromptSummary,
    TokenizedPrompts,
    load_prompt_set,
    prompt_texts,
    tokenize_prompts,
)
from sinkscope.pretrained_analysis.prompts import (
    prompt_set as make_prompt_set,
)
from sinkscope.probes.probe import HEADS_CSV, ProbeResult, SinkRate, upgrade_probe_v1
from sinkscope.probes.runner import iterate_batches, probe_batches
from sinkscope.probes.sink_curves import SinkCurves
from sinkscope.reports.formatting import plural
from sinkscope.reports.frames import dataframe, row_of, without_unmeasured

if TYPE_CHECKING:
    import pandas

AUDIT_FILE = "audit.json"
# every entry write_audit may put into an audit's directory: what a check that a directory
# holds only an audit's files reads (sinkscope demo); tests/pretrained/test_audit_outputs.py
# fails when an audit writes anything this does not declare
AUDIT_OUTPUTS = OutputFiles((AUDIT_FILE, HEADS_CSV)) | AUDIT_FIGURES
VERSION_PACKAGES: tuple[str, ...] = ("sinkscope", "torch", "transformer-lens", "transformers", "datasets")


class AuditFailed(RunFailed):
    """The audit ran but its numbers cannot be trusted (e.g. non-finite attention)."""


def upgrade_audit_v1(audit: dict[str, Any]) -> dict[str, Any]:
    """``audit.json`` of schema version 1 in version 2's layout: its probe result and its
    ablation upgraded (``upgrade_probe_v1``, ``upgrade_ablation_v1``)."""
    upgraded = dict(audit)
    if isinstance(upgraded.get("probe"), dict):
        upgraded["probe"] = upgrade_probe_v1(upgraded["probe"])
    if isinstance(upgraded.get("ablation"), dict):
        upgraded["ablation"] = upgrade_ablation_v1(upgraded["ablation"])
    return upgraded


@dataclass(frozen=True)
class AuditResult:
    """Everything one audit measured; persisted as ``audit.json`` (``sinkscope.infra.codec``).

    figures: the PNG files ``write_audit`` draws; examples: the attention patterns drawn
    as heatmaps, kept in memory only (an audit read back from disk has none);
    example_prompts: the text of each example's prompt (its first ``EXAMPLE_TEXT_CHARS``
    characters), for the heatmaps' captions."""

    BOUNDS: ClassVar[dict[str, Bound]] = {"seconds": NONNEGATIVE}

    SCHEMA: ClassVar[str] = "audit"
    SCHEMA_VERSION: ClassVar[int] = 2  # 2: the probe's version 2, ablation.default_state
    UPGRADES: ClassVar[dict[int, Upgrade]] = {1: upgrade_audit_v1}

    model: ModelInfo
    prompts: PromptSummary
    config: AuditConfig
    probe: ProbeResult
    ablation: AblationResult | None
    notes: tuple[str, ...]
    versions: tuple[tuple[str, str], ...]
    seconds: float
    figures: tuple[str, ...]
    examples: tuple[AttentionExample, ...] = field(default=(), metadata={"persist": False})
    example_prompts: tuple[str, ...] = ()
    experiments: SinkCurves | None = None  # input types, eps and T curves, when asked for

    def inconsistencies(self) -> Iterator[Problem]:
        """The model's size as its probe saw it; figure names inside the audit directory."""
        for name in ("n_layers", "n_heads"):
            probed = getattr(self.probe.model, name)
            if getattr(self.model, name) != probed:
                yield f"model.{name}", getattr(self.model, name), f"the probe's probe.model.{name} ({probed})"
        yield from relative_path_problems(self.figures)
        if self.ablation is not None:
            tested = self.ablation.default_state.sink_heads
            yield from head_ref_problems(
                tested, self.model.n_layers, self.model.n_heads, "ablation.default_state.sink_heads"
            )

    @property
    def anchor(self) -> str:
        """Which token is the anchor and how it got there, in words (``interp.anchors.ANCHOR_HOWS``):
        the BOS token the tokenizer adds itself or sinkscope prepends (named, e.g.
        ``<|im_start|>``), each prompt's first token (no BOS token, or none prepended), or an
        encoder's first token, [CLS]. Audits written before the how was recorded read it
        from the BOS convention."""
        token, how = self.prompts.anchor_token, self.prompts.anchor_how
        if not how:
            how = "cls" if not self.model.causal else "prepended" if self.prompts.spec.prepend_bos else "off"
        return anchor_words(how, token)

    @property
    def sink_rates(self) -> tuple[SinkRate, ...]:
        """Gu et al.'s Sink_1^eps per eps, in percent."""
        return self.probe.sink_rates

    def sink_heads(self) -> list[tuple[int, int]]:
        """``(layer, head)`` of every sink head, as ``ProbeResult.sink_heads()``."""
        return self.probe.sink_heads()

    def to_dataframe(self) -> pandas.DataFrame:
        """One row per (model, revision, layer, head), every ``HeadProbe`` metric measured a
        column (the columns of ``heads.csv``); audits of several models or revisions stack
        with ``pandas.concat``."""
        rows = (row_of(row, model=self.model.model_name, revision=self.model.revision) for row in self.probe.heads)
        return without_unmeasured(dataframe(rows), context=("model", "revision"))

    def _repr_html_(self) -> str:
        """Inline display in a notebook: findings, sink map, per-head table, ablations."""
        from sinkscope.pretrained_analysis.display import audit_html  # loads the report phrases only when shown

        return audit_html(self)


def figure_names(n_examples: int, key_geometry: bool = False) -> tuple[str, ...]:
    """The figures an audit with ``n_examples`` attention examples (and its key geometry) draws."""
    examples = tuple(EXAMPLE_FIGURE.format(index=k) for k in range(n_examples))
    return (MAP_FIGURE, LAYER_FIGURE, *((GEOMETRY_FIGURE,) if key_geometry else ()), *examples)


def read_audit(directory: str | Path) -> AuditResult:
    """``directory/audit.json`` read back (without the attention examples)."""
    check_path(directory, "directory")
    return read_result(Path(directory) / AUDIT_FILE, AuditResult, "regenerate it with sinkscope audit")


@functools.cache  # reading every package's metadata takes tens of ms; a process's packages stay put
def _versions() -> tuple[tuple[str, str], ...]:
    return (
        ("python", platform.python_version()),
        *((package, package_version(package)) for package in VERSION_PACKAGES),
    )


def _probe(
    hooked: HookedModel, prompts: TokenizedPrompts, config: AuditConfig, label: str, progress: bool, samples=None
) -> ProbeResult:
    bar = progress_bar(len(prompts), f"probing {label}", progress, unit="prompt")
    # a batch of a large model on a busy machine can take minutes: the heartbeat says it is still going
    with bar, heartbeat(f"probing {label}", enabled=progress) as said:

        def batches():
            # grouped by length; the probe's numbers do not depend on the grouping
            for batch in iterate_batches(prompts.tokens, prompts.attention_mask, None, config.batch_size):
                yield batch
                bar.update(len(batch.inputs))
                said()

        return probe_batches(hooked, batches(), config.probe_config(), samples)


def _check_finite(probe: ProbeResult, model: ModelInfo) -> None:
    if probe.n_queries == 0:
        raise PromptError(
            "every prompt has a single token, so no query attends to an anchor; pass longer prompts or turn prepend_bos on",
            field="prepend_bos",
        )
    bad = [f"L{row.layer}H{row.head}" for row in probe.heads if not math.isfinite(row.anchor_mass)]
    if bad:
        fix = (
            "the weights themselves hold NaN or inf: check the checkpoint"
            if str(model.dtype).removeprefix("torch.") == "float32"
            else "rerun with dtype float32"
        )
        raise AuditFailed(
            f"{model.label} produced non-finite attention in {len(bad)} heads (first: {bad[0]}) in {model.dtype}; {fix}",
            field="dtype",
        )


def _notes(model: ModelInfo, prompts: PromptSummary, probe: ProbeResult, config: AuditConfig) -> tuple[str, ...]:
    notes = list(probe.notes)
    if not model.causal:
        notes.append("bidirectional encoder: the anchor is the first token ([CLS]); every real query after it counts")
        # said whether or not --ablate was given: a reader asks why an encoder's report has no ablations
        done = "were skipped" if config.ablate else "do not apply"
        notes.append(
            f"encoder: no next-token loss, so the loss-based ablations {done} (sink removal, anchor eviction and "
            "head ablations need one)"
        )
    if model.quantization is not None:
        notes.append(
            f"weights dequantised to {model.dtype} from the {model.quantization} GGUF file {Path(str(model.source_file)).name}"
        )
    if config.ablate and model.causal:
        n_ablated = (
            prompts.n_prompts if config.ablate_prompts is None else min(config.ablate_prompts, prompts.n_prompts)
        )
        if n_ablated < prompts.n_prompts:
            notes.append(f"the ablations ran on the first {n_ablated} of {prompts.n_prompts} prompts (ablate_prompts)")
        n_sinks = sum(row.is_sink_head for row in probe.heads)
        if n_sinks > config.ablate_heads and n_sinks > 1:
            notes.append(
                f"{config.ablate_heads} of {n_sinks} sink heads, those with the largest anchor mass, were ablated one by one "
                "(ablate_heads); all were ablated together"
            )
    if prompts.n_truncated:
        notes.append(
            f"{prompts.n_truncated} of {prompts.n_prompts} prompts were truncated to {prompts.spec.max_len} tokens"
        )
    if prompts.n_prompts < prompts.spec.n_prompts:
        notes.append(f"the source holds only {plural(prompts.n_prompts, 'prompt')}; all were used")
    return tuple(notes)


def _ablation_settings(config: AuditConfig) -> AblationSettings:
    return AblationSettings(
        n_prompts=config.ablate_prompts,
        batch_size=config.batch_size,
        max_single_heads=config.ablate_heads,
        n_bootstrap=config.n_bootstrap,
        seed=config.seed,
        sink=config.ablate_sink,
        sink_threshold=1.0 - config.sink_eps,
        head_ablations=config.head_ablations,
    )


def _check_sink_to_ablate(config: AuditConfig, hooked: HookedModel, label: str) -> None:
    """Before any probe runs: a learned sink to remove needs a model that has one."""
    if config.ablate and config.ablate_sink == "learned" and not has_learned_sinks(hooked):
        raise InputError(
            f"{label} has no learned sink logits to remove (gpt-oss has them); use ablate_sink 'anchor'",
            field="ablate_sink",
        )


def _as_prompt_set(prompts: PromptSpec | PromptSet | list[str]) -> PromptSet:
    if isinstance(prompts, PromptSet):
        return prompts
    return load_prompt_set(prompts) if isinstance(prompts, PromptSpec) else make_prompt_set(prompts)


def audit(
    model: LoadSpec | LoadedModel | Any,
    prompts: PromptSpec | PromptSet | Sequence[str],
    config: AuditConfig = AuditConfig(),
    progress: bool = True,
    tokenizer: Any = None,
) -> AuditResult:
    """Audit ``model`` (a ``LoadSpec`` to load, a ``LoadedModel``, or a model already in memory:
    a ``TransformerBridge``, or a Hugging Face ``PreTrainedModel`` with its ``tokenizer``; see
    ``loading.wrap_model``) on ``prompts`` (a ``PromptSpec`` to read, a ``PromptSet``, or a
    list of strings, all used, at most ``PromptSpec``'s default length each; special-token
    text in them is text: ``prompt_set(texts, parse_special_tokens=True)`` parses it).
    An argument of the wrong type is an ``InputError`` naming it."""
    start = time.perf_counter()
    check_argument(config, AuditConfig, "config", "an AuditConfig")
    check_argument(progress, bool, "progress", "True or False")
    if not isinstance(prompts, (PromptSet, PromptSpec)):
        prompts = prompt_texts(prompts)  # before the model loads: a bad list fails at once
    loaded = load_model(model, progress=progress) if isinstance(model, LoadSpec) else wrap_model(model, tokenizer)
    config.probe_config().check_layers(loaded.info.n_layers, loaded.info.label)
    prompt_set = _as_prompt_set(prompts)
    tokenized = tokenize_prompts(prompt_set, loaded)
    check_experiments_reachable(config, tokenized, loaded.info.n_ctx)
    info = loaded.info
    hooked = HookedModel(loaded.bridge, prepend_bos=prompt_set.spec.prepend_bos)
    _check_sink_to_ablate(config, hooked, info.label)
    try:
        prompt_sums = experiment_samples(hooked, config)
        probe = _probe(hooked, tokenized, config, info.label, progress, prompt_sums)
        _check_finite(probe, info)
        probe = with_token_texts(probe, loaded.bridge.tokenizer)
        experiments = audit_experiments(hooked, loaded, tokenized, config, prompt_sums)
        ablation = (
            ablate(hooked, tokenized, probe, _ablation_settings(config), info.label, progress)
            if config.ablate and info.causal
            else None
        )
        examples = attention_examples(hooked, loaded, tokenized, config.n_examples, probe)
    except torch.OutOfMemoryError as error:
        raise AuditFailed(
            f"{info.label} ran out of memory on {info.device} at batch_size {config.batch_size}; "
            "lower batch_size, or load the model with dtype bfloat16 or device_map auto",
            field="batch_size",
        ) from error
    return AuditResult(
        model=info,
        prompts=tokenized.summary,
        config=config,
        probe=probe,
        ablation=ablation,
        examples=examples,
        notes=tokenized.notes + _notes(info, tokenized.summary, probe, config),
        versions=_versions(),
        seconds=time.perf_counter() - start,
        figures=figure_names(len(examples), config.key_geometry),
        example_prompts=tuple(tokenized.texts[example.prompt_index][:EXAMPLE_TEXT_CHARS] for example in examples),
        experiments=experiments,
    )


def write_audit(result: AuditResult, directory: str | Path) -> Path:
    """Write ``audit.json``, ``heads.csv`` and the PNG figures into ``directory``; returns it.
    ``audit.json`` is written last, so its presence means the directory is complete. What
    this may write is declared in ``AUDIT_OUTPUTS``: a new file here is a name there."""
    check_argument(result, AuditResult, "result", "an AuditResult (what audit returns)")
    check_path(directory, "directory")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    draw_audit_figures(result, directory)
    result.probe.write_heads_csv(str(directory / HEADS_CSV), result.model.model_name, result.model.revision)
    write_result(directory / AUDIT_FILE, result)
    return directory
