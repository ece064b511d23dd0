"""The audit's sink experiments (``sinkscope.probes.sink_curves``) on a pretrained model:
the given prompts, uniform random tokens and one token repeated, side by side, built by
one of two input protocols (``INPUT_PROTOCOLS``; recorded as ``SinkCurves.input_protocol``).

``sinkscope`` (the default): every input type has the prompts' own lengths, padding and anchor: where the anchor
convention puts a BOS (or [CLS]) first (``anchors.ANCHOR_PREFIXED``: kept by the tokenizer
or prepended by sinkscope), each row keeps it and only the tokens after it change; where
it does not (no BOS token, or ``prepend_bos`` off) every token changes and the first is
the anchor. Random tokens are drawn uniformly from the non-special tokens
(``prompts.ordinary_tokens``, as the ``random`` prompt source); a repeated row is one such
token, drawn per row, at every position. Draws use the prompt spec's seed.

``gu`` (Gu et al.'s Table 1): every input has ``GU_LENGTH`` = 64 tokens and no BOS is
prepended; only where the tokenizer's own call puts its BOS (or [CLS]) first (anchor
``tokenizer`` or ``cls``) is it kept first, before 63 tokens. ``prompts``: the prompts'
text tokens as the audit read them (each cut at ``max_len``, its anchor left out) joined
in prompt order and cut into consecutive windows, at most one per prompt; the tail shorter
than a window is left out, and text shorter than one window in all is refused
(``check_protocol_reachable``). ``random``: uniform draws from the non-special tokens, one
row per prompt; ``repeated``: one such token, drawn per row, at all 64 positions. Every
input type then needs its own pass, the prompts' windows included.

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
SINKSCOPE, GU = "sinkscope", "gu"
INPUT_PROTOCOLS: tuple[str, ...] = (SINKSCOPE, GU)
GU_LENGTH = 64  # tokens per input in Gu et al.'s protocol
# anchors the tokenizer's own call puts first: Gu et al.'s inputs keep them
TOKENIZER_ANCHORS: tuple[str, ...] = ("tokenizer", "cls")


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


def check_input_protocol(protocol: object) -> None:
    """An ``InputError`` naming the setting for an unknown input protocol."""
    if protocol not in INPUT_PROTOCOLS:
        raise InputError(
            f"unknown input protocol {protocol!r}; choose {' or '.join(INPUT_PROTOCOLS)}", field="input_protocol"
        )


def _text_stream(prompts: TokenizedPrompts) -> tuple[torch.Tensor, int | None]:
    """Every prompt's real tokens after the convention's anchor, joined in prompt order, and
    the anchor Gu et al.'s inputs keep: the tokenizer's own BOS or [CLS] (None: none)."""
    how = prompts.summary.anchor_how
    skip = int(how in ANCHOR_PREFIXED)
    lengths = prompts.attention_mask.sum(dim=1).tolist()
    stream = torch.cat([row[skip : int(n)] for row, n in zip(prompts.tokens, lengths)])
    return stream, int(prompts.tokens[0, 0]) if how in TOKENIZER_ANCHORS else None


def gu_windows(prompts: TokenizedPrompts) -> tuple[int, int, int]:
    """Gu et al.'s prompt windows: how many, the text tokens joined, and the tokens per
    window after a kept anchor."""
    stream, anchor = _text_stream(prompts)
    width = GU_LENGTH - (anchor is not None)
    return min(len(stream) // width, len(prompts)), len(stream), width


def gu_tokens(prompts: TokenizedPrompts, kind: str, candidates: torch.Tensor, seed: int) -> torch.Tensor:
    """``[n, GU_LENGTH]`` inputs of Gu et al.'s protocol, every position real: the prompts'
    text cut into windows (at most one per prompt), or one row of ``candidates`` per prompt,
    uniform (``random``) or one draw repeated (``repeated``); the tokenizer's own anchor
    first where it puts one."""
    stream, anchor = _text_stream(prompts)
    width = GU_LENGTH - (anchor is not None)
    if kind == PROMPTS:
        n = min(len(stream) // width, len(prompts))
        body = stream[: n * width].view(n, width)
    else:
        n = len(prompts)
        generator = torch.Generator().manual_seed(seed + INPUT_TYPES.index(kind))
        shape = (n, width) if kind == RANDOM else (n, 1)
        body = candidates[torch.randint(len(candidates), shape, generator=generator)].expand(n, width)
    if anchor is None:
        return body.contiguous()
    return torch.cat([torch.full((n, 1), anchor, dtype=torch.long), body], dim=1)


def gu_note(prompts: TokenizedPrompts, kinds: tuple[str, ...]) -> str:
    """The report's words for how Gu et al.'s inputs were built from these prompts."""
    n, joined, width = gu_windows(prompts)
    anchor = (
        f"the tokenizer's own {prompts.summary.anchor_token} first, then {width} tokens"
        if width < GU_LENGTH
        else "no BOS"
    )
    note = f"input protocol gu: {GU_LENGTH} tokens per input, {anchor}"
    if PROMPTS in kinds:
        left = joined - n * width
        note += (
            f"; prompts: {n} windows of {width} tokens cut from the prompts' {joined} text tokens joined in order "
            f"(each prompt as read, cut at max_len; {left} left over, left out)"
        )
    return note + f"; random and repeated: one row per prompt ({len(prompts)})"


def check_protocol_reachable(protocol: str, kinds: tuple[str, ...], prompts: TokenizedPrompts, n_ctx: int) -> None:
    """An ``InputError`` before probing where Gu et al.'s protocol cannot run: the model's
    context below its 64 tokens, or too little text for one prompt window (lengths beyond
    64 are refused with the settings, ``audit_experiments.check_experiments``)."""
    if protocol != GU:
        return
    fix = "or use --input-protocol sinkscope"
    if n_ctx < GU_LENGTH:
        raise InputError(
            f"input protocol gu needs {GU_LENGTH}-token inputs and the model's context is {n_ctx} tokens; {fix}",
            field="input_protocol",
        )
    n, joined, width = gu_windows(prompts)
    if PROMPTS in kinds and n == 0:
        raise InputError(
            f"input protocol gu cuts the prompts into windows of {width} text tokens and they hold {joined} in all; "
            f"give more or longer prompts (--n-prompts, --max-len), leave prompts out of --input-types, {fix}",
            field="input_protocol",
        )


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
    protocol: str = SINKSCOPE,
) -> SinkCurves:
    """The experiments on ``kinds`` of input, built by ``protocol``: ``prompt_sums`` was
    filled by the audit's probe pass over ``prompts`` (``prompt_samples``; Gu et al.'s
    protocol passes its own prompt windows instead); ``candidates`` the tokens random inputs
    draw from; seeds: (the token draws', the bootstrap's)."""
    check_input_protocol(protocol)
    causal, gu = hooked.spec.causal, protocol == GU
    prefixed = prompts.summary.anchor_how in ANCHOR_PREFIXED
    samples, n_forwards = [], 0
    for kind in (PROMPTS, *(kind for kind in kinds if kind != PROMPTS)):  # the probe's own pass first
        if gu and kind not in kinds:
            continue
        own = kind == PROMPTS and not gu  # read from the audit's probe pass
        sums = prompt_sums if own else prompt_samples(hooked, config, lengths)
        if gu:
            tokens = gu_tokens(prompts, kind, candidates, seeds[0])
            mask = torch.ones_like(tokens, dtype=torch.bool)
        else:
            tokens = input_type_tokens(prompts.tokens, prompts.attention_mask, kind, candidates, prefixed, seeds[0])
            mask = prompts.attention_mask
        if not own:
            _pass(hooked, tokens, mask, config, sums)
            n_forwards += 1
        alpha, mass = sums.alpha(), sums.mass()
        if lengths and not causal and kind in kinds:
            alphas, masses = _encoder_lengths(hooked, tokens, mask, config, lengths)
            alpha, mass = _padded(alpha[:, 0], alphas), _padded(mass[:, 0], masses)
            n_forwards += len(lengths)
        if kind in kinds:
            samples.append(Samples(kind, alpha, mass, lengths))
    how = "read from the same passes (causal: a cut prompt's pattern is the top-left block of the full one)"
    notes = (f"lengths {how}",) if lengths and causal else ()
    notes = (gu_note(prompts, kinds), *notes) if gu else notes
    return summarise(samples, eps_curve, config.alpha_k, n_bootstrap, seeds[1], n_forwards, notes, protocol)
