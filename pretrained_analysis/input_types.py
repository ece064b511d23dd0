"""The audit's sink experiments (``sinkscope.probes.sink_curves``) on a pretrained model:
the given prompts, uniform random tokens and one token repeated, side by side.

Every input type has the prompts' own lengths, padding and anchor: where the anchor
convention puts a BOS (or [CLS]) first (``anchors.ANCHOR_PREFIXED``: kept by the tokenizer
or prepended by sinkscope), each row keeps it and only the tokens after it change; where
it does not (no BOS token, or ``prepend_bos`` off) every token changes and the first is
the anchor. Random tokens are drawn uniformly from the non-special tokens
(``prompts.ordinary_tokens``, as the ``random`` prompt source); a repeated row is one such
token, drawn per row, at every position. Draws use the prompt spec's seed.

Forward passes: the prompts' statistics come from the probe's own pass; each other input
type adds one pass over the prompt set (patterns only: no value or residual hooks). On a
causal model every length T is read from those same passes (``sink_samples``); an
encoder adds one pass per T and input type.
"""

from __future__ import annotations

import torch

from sinkscope.infra.errors import InputError
from sinkscope.interp.anchors import ANCHOR_PREFIXED
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.pretrained_analysis.prompts import TokenizedPrompts
from sinkscope.probes.probe import ProbeConfig
from sinkscope.probes.runner import iterate_batches, probe_batches
from sinkscope.probes.sink_curves import Samples, SinkCurves, summarise
from sinkscope.probes.sink_samples import SampleSums, cut_tokens

PROMPTS, RANDOM, REPEATED = "prompts", "random", "repeated"
INPUT_TYPES: tuple[str, ...] = (PROMPTS, RANDOM, REPEATED)


def check_input_types(kinds: tuple[str, ...]) -> None:
    """An ``InputError`` naming the flag for an unknown or repeated input type."""
    for kind in kinds:
        if kind not in INPUT_TYPES:
            raise InputError(f"unknown input type {kind!r}; choose from {', '.join(INPUT_TYPES)}", field="input_types")
    if len(set(kinds)) != len(kinds):
        raise InputError(f"input types must not repeat, got {', '.join(kinds)}", field="input_types")


def input_type_tokens(
    tokens: torch.Tensor, attention_mask: torch.Tensor, kind: str, candidates: torch.Tensor, prefixed: bool, seed: int
) -> torch.Tensor:
    """``tokens [n, pos]`` (right-padded) with every real token after the kept anchor
    replaced: uniform draws from ``candidates`` (``random``) or one draw per row repeated
    (``repeated``); ``prompts`` returns them unchanged. ``prefixed``: position 0 is a BOS
    or [CLS] the convention puts there, which stays."""
    if kind == PROMPTS:
        return tokens
    generator = torch.Generator().manual_seed(seed + INPUT_TYPES.index(kind))
    n, width = tokens.shape
    if kind == RANDOM:
        drawn = candidates[torch.randint(len(candidates), (n, width), generator=generator)]
    else:
        drawn = candidates[torch.randint(len(candidates), (n, 1), generator=generator)].expand(n, width)
    body = attention_mask.bool().clone()
    if prefixed:
        body[:, 0] = False
    return torch.where(body, drawn, tokens)


def _light(config: ProbeConfig) -> ProbeConfig:
    """The probe reduced to the patterns: the other input types need alpha and anchor mass only."""
    return ProbeConfig(
        sink_eps=config.sink_eps,
        alpha_k=config.alpha_k,
        batch_size=config.batch_size,
        with_values=False,
        with_residual=False,
        layers=config.layers,
    )


def _pass(hooked: HookedModel, tokens: torch.Tensor, mask: torch.Tensor, config: ProbeConfig, sums: SampleSums) -> None:
    probe_batches(hooked, iterate_batches(tokens, mask, None, config.batch_size), _light(config), sums)


def _encoder_lengths(
    hooked: HookedModel, tokens: torch.Tensor, mask: torch.Tensor, config: ProbeConfig, lengths: tuple[int, ...]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """An encoder's per-prompt alpha and mass at each length: one pass of prompts cut to T each."""
    spec, alphas, masses = hooked.spec, [], []
    for length in lengths:
        cut, cut_mask = cut_tokens(tokens, mask, length)
        sums = SampleSums(spec.n_layers, spec.n_heads, config.alpha_k)
        if len(cut):
            _pass(hooked, cut, cut_mask, config, sums)
        alphas.append(sums.alpha()[:, 0])
        masses.append(sums.mass()[:, 0])
    return alphas, masses


def _padded(full: torch.Tensor, points: list[torch.Tensor]) -> torch.Tensor:
    """``[n, 1 + len(points), layer, head]``: the full-length values, then each length's
    (fewer prompts at a length some are shorter than: NaN rows; prompt order is irrelevant
    to the means over prompts)."""
    out = torch.full((full.shape[0], 1 + len(points), *full.shape[1:]), torch.nan, dtype=torch.float64)
    out[:, 0] = full
    for index, values in enumerate(points):
        out[: values.shape[0], 1 + index] = values
    return out


def prompt_samples(hooked: HookedModel, config: ProbeConfig, lengths: tuple[int, ...]) -> SampleSums:
    """The statistics the audit's own probe pass keeps for the experiments (lengths only on
    a causal model, where they come from the same pass)."""
    spec = hooked.spec
    return SampleSums(spec.n_layers, spec.n_heads, config.alpha_k, lengths if spec.causal else ())


def sink_experiments(
    hooked: HookedModel,
    prompts: TokenizedPrompts,
    config: ProbeConfig,
    prompt_sums: SampleSums,
    candidates: torch.Tensor,
    kinds: tuple[str, ...],
    eps_curve: tuple[float, ...] = (),
    lengths: tuple[int, ...] = (),
    n_bootstrap: int = 1000,
    seeds: tuple[int, int] = (0, 0),
) -> SinkCurves:
    """The experiments on ``kinds`` of input: ``prompt_sums`` was filled by the audit's probe
    pass over ``prompts`` (``prompt_samples``); ``candidates`` the tokens random inputs draw
    from; seeds: (the token draws', the bootstrap's)."""
    causal = hooked.spec.causal
    prefixed = prompts.summary.anchor_how in ANCHOR_PREFIXED
    samples, n_forwards = [], 0
    for kind in (PROMPTS, *(kind for kind in kinds if kind != PROMPTS)):  # the probe's own pass first
        sums = prompt_sums if kind == PROMPTS else prompt_samples(hooked, config, lengths)
        tokens = input_type_tokens(prompts.tokens, prompts.attention_mask, kind, candidates, prefixed, seeds[0])
        if kind != PROMPTS:
            _pass(hooked, tokens, prompts.attention_mask, config, sums)
            n_forwards += 1
        alpha, mass = sums.alpha(), sums.mass()
        if lengths and not causal and kind in kinds:
            alphas, masses = _encoder_lengths(hooked, tokens, prompts.attention_mask, config, lengths)
            alpha, mass = _padded(alpha[:, 0], alphas), _padded(mass[:, 0], masses)
            n_forwards += len(lengths)
        if kind in kinds:
            samples.append(Samples(kind, alpha, mass, lengths))
    how = "read from the same passes (causal: a cut prompt's pattern is the top-left block of the full one)"
    notes = (f"lengths {how}",) if lengths and causal else ()
    return summarise(samples, eps_curve, config.alpha_k, n_bootstrap, seeds[1], n_forwards, notes)
