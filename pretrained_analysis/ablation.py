"""The audit's ablations of a causal model: next-token loss with nothing ablated, with the
anchor evicted from every head, and the default-state test of its sink heads (each
sink removed against the matched control, per head and all together)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F

from sinkscope.infra.bounds import NONNEGATIVE, Bound
from sinkscope.infra.heartbeat import heartbeat, progress_bar
from sinkscope.interp.hooked_model import HookedModel, PreparedBatch
from sinkscope.pretrained_analysis.prompts import (
    PromptError,
    TokenizedPrompts,
)
from sinkscope.probes.default_state import (
    DefaultStateConfig,
    DefaultStateResult,
    Estimate,
    bootstrap,
    default_state_test,
    upgrade_default_state_result_v1,
)
from sinkscope.probes.interventions import (
    Intervention,
    evict_anchor,
    intervention_hooks,
    remove_learned_sink,
    remove_sink,
)
from sinkscope.probes.probe import ProbeResult

if TYPE_CHECKING:
    pass


# which sink the default-state test removes: the anchor key, or a learned per-head sink logit (gpt-oss)
ABLATE_SINKS: tuple[str, ...] = ("anchor", "learned")


@dataclass(frozen=True)
class AblationSettings:
    """What the ablations run on: the first ``n_prompts`` prompts (None: all), in batches of
    ``batch_size``; at most ``max_single_heads`` sink heads tested alone; the bootstrap's
    resamples and seed. sink: which sink the default-state test removes, ``anchor``
    (``remove_sink`` on the heads with anchor mass >= ``sink_threshold``) or ``learned``
    (``remove_learned_sink`` on the heads whose learned sink takes >= ``sink_threshold``)."""

    n_prompts: int | None
    batch_size: int
    max_single_heads: int
    n_bootstrap: int
    seed: int
    sink: str = "anchor"
    sink_threshold: float = 0.9
    head_ablations: bool = True  # each tested set also zero- and mean-ablated (two more passes)


@dataclass(frozen=True)
class AblationResult:
    """Next-token loss under ablations (per prompt mean cross-entropy over its predicted
    tokens, averaged over prompts).

    default_state: the default-state test (per sink head and all together: ``remove_sink``
    vs the matched ``mask_random_key`` control, or ``remove_learned_sink`` where ``sink``
    is ``learned``); evict_anchor_loss: the loss with the anchor masked as a key in every
    head; evict_anchor_increase: the per-prompt increase this causes, with its bootstrap
    interval over prompts (None in audits written before it was recorded)."""

    BOUNDS: ClassVar[dict[str, Bound]] = {"base_loss": NONNEGATIVE, "evict_anchor_loss": NONNEGATIVE}

    base_loss: float
    evict_anchor_loss: float
    default_state: DefaultStateResult
    sink: str = "anchor"  # which sink default_state removed: "anchor" or "learned"
    evict_anchor_increase: Estimate | None = None

    @property
    def evict_anchor_delta(self) -> float:
        return self.evict_anchor_loss - self.base_loss


def upgrade_ablation_v1(ablation: dict[str, Any]) -> dict[str, Any]:
    """An ``AblationResult`` of schema version 1 in version 2's layout: its default-state
    test was ``sink_heads`` (now ``default_state``, with the all-sink-heads row named)."""
    upgraded = {key: value for key, value in ablation.items() if key != "sink_heads"}
    if "sink_heads" in ablation:
        upgraded["default_state"] = upgrade_default_state_result_v1(ablation["sink_heads"])
    return upgraded


def next_token_loss(logits: torch.Tensor, batch: PreparedBatch) -> torch.Tensor:
    """Per-prompt mean next-token cross-entropy ``[batch]`` from logits ``[batch, pos, vocab]``,
    over positions whose token and next token are both real."""
    tokens, mask = batch.model_input, batch.attention_mask
    valid = (mask[:, 1:] & mask[:, :-1]).to(torch.float64)
    losses = (
        F.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten().to(logits.device), reduction="none"
        )
        .view(valid.shape)
        .double()
    )
    return (losses * valid.to(losses.device)).sum(dim=1) / valid.sum(dim=1).to(losses.device)


def prompt_losses(
    hooked: HookedModel,
    prompts: TokenizedPrompts,
    n: int,
    intervention: Intervention | None,
    size: int,
    tick: Callable[[], None],
) -> torch.Tensor:
    """Next-token loss of each of the first ``n`` prompts ``[n]`` (float64)."""
    losses = []
    for start in range(0, n, size):
        batch = hooked.prepare(*prompts.batch(start, min(start + size, n)))
        hooks = [] if intervention is None else intervention_hooks(hooked, batch, intervention)
        with torch.no_grad():
            losses.append(next_token_loss(hooked.run_with_hooks(batch, hooks), batch).double())
        tick()
    return torch.cat(losses)


def ablate(
    hooked: HookedModel,
    prompts: TokenizedPrompts,
    probe: ProbeResult,
    settings: AblationSettings,
    label: str,
    progress: bool,
) -> AblationResult:
    """The ablations on the first ``settings.n_prompts`` prompts (all when None), the
    default-state test on the probe's sink heads, strongest first."""
    if prompts.summary.min_tokens < 2:
        raise PromptError(
            "the ablations need prompts of at least 2 tokens to have a next-token loss; drop one-token prompts",
            field="ablate",
        )
    spec = hooked.spec
    n = len(prompts) if settings.n_prompts is None else min(settings.n_prompts, len(prompts))
    sinks, removal = sinks_to_remove(probe, settings)
    n_chunks = math.ceil(n / settings.batch_size)
    n_sets = min(len(sinks), settings.max_single_heads) + (len(sinks) > 1)
    # removal and control per set, the zero- and mean-ablation and one pass for the heads' means too
    passes = 2 + ((1 + 4 * n_sets if settings.head_ablations else 2 * n_sets) if sinks else 0)
    bar = progress_bar(passes * n_chunks, f"ablating {label}", progress, unit="batch")
    # a batch of a large model on a busy machine can take longer than a reader waits in silence
    with bar, heartbeat(f"ablating {label}", enabled=progress) as said:

        def tick() -> None:
            bar.update(1)
            said()

        def loss_fn(logits: torch.Tensor, batch: PreparedBatch) -> torch.Tensor:
            tick()
            return next_token_loss(logits, batch)

        base = prompt_losses(hooked, prompts, n, None, settings.batch_size, tick)
        every_head = [(layer, head) for layer in spec.pattern_layers for head in range(spec.n_heads)]
        evicted = prompt_losses(hooked, prompts, n, evict_anchor(every_head), settings.batch_size, tick)
        sink_test = default_state_test(
            hooked,
            prompts.tokens[:n],
            sinks,
            loss_fn,
            attention_mask=prompts.attention_mask[:n],
            config=DefaultStateConfig(
                n_bootstrap=settings.n_bootstrap,
                seed=settings.seed,
                batch_size=settings.batch_size,
                max_single_heads=settings.max_single_heads,
                head_ablations=settings.head_ablations,
            ),
            removal=removal,
        )
    increase = bootstrap(evicted - base, settings.n_bootstrap, torch.Generator().manual_seed(settings.seed))
    return AblationResult(
        base_loss=float(base.mean()),
        evict_anchor_loss=float(evicted.mean()),
        default_state=sink_test,
        sink=settings.sink,
        evict_anchor_increase=increase,
    )


def sinks_to_remove(
    probe: ProbeResult, settings: AblationSettings
) -> tuple[list[tuple[int, int]], Callable[[Sequence[tuple[int, int]]], Intervention]]:
    """The heads whose sink the default-state test removes, strongest first (so that the
    cap on single-head tests keeps the clearest sinks), and how it removes them."""
    if settings.sink == "learned":  # NaN (a model without learned sinks) compares False
        learned = [row for row in probe.heads if row.null_mass >= settings.sink_threshold]
        strongest = sorted(learned, key=lambda row: -row.null_mass)
        return [(row.layer, row.head) for row in strongest], remove_learned_sink
    strongest = sorted((row for row in probe.heads if row.is_sink_head), key=lambda row: -row.anchor_mass)
    return [(row.layer, row.head) for row in strongest], remove_sink
