"""The audit's hooks into its sink experiments (``input_types``): the settings checked,
the statistics its probe pass keeps, and the experiments run after it. Without
``input_types``, ``eps_curve`` or ``lengths`` none of this runs and the probe keeps nothing more."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinkscope.infra.arguments import check_argument
from sinkscope.infra.errors import InputError
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.pretrained_analysis.input_types import (
    GU,
    GU_LENGTH,
    PROMPTS,
    SINKSCOPE,
    check_input_protocol,
    check_input_types,
    check_protocol_reachable,
    prompt_samples,
    sink_experiments,
)
from sinkscope.pretrained_analysis.loading import LoadedModel
from sinkscope.pretrained_analysis.prompts import TokenizedPrompts, ordinary_tokens
from sinkscope.probes.sink_curves import SinkCurves, check_curve_settings
from sinkscope.probes.sink_samples import SampleSums

if TYPE_CHECKING:
    from sinkscope.pretrained_analysis.audit_config import AuditConfig


def check_experiments(
    input_types: tuple[str, ...] | None,
    eps_curve: tuple[float, ...] | None,
    lengths: tuple[int, ...] | None,
    input_protocol: str = SINKSCOPE,
) -> None:
    """``AuditConfig``'s experiment settings: tuples (or None) of known input types, eps in
    [0, 1) and lengths >= 2, and a known input protocol, chosen only with an experiment; an
    ``InputError`` naming the setting otherwise."""
    for name, value, kind in (("input_types", input_types, str), ("eps_curve", eps_curve, (float, int))):
        check_argument(value, (tuple, type(None)), name, "a tuple or None")
        for item in value or ():
            check_argument(item, kind, name, "a tuple of input type names" if kind is str else "a tuple of numbers")
    check_argument(lengths, (tuple, type(None)), "lengths", "a tuple of integers or None")
    for item in lengths or ():
        check_argument(item, int, "lengths", "a tuple of integers")
    check_input_types(input_types or ())
    check_curve_settings(eps_curve or (), lengths or ())
    check_input_protocol(input_protocol)
    beyond = sorted({length for length in lengths or () if length > GU_LENGTH})
    if input_protocol == GU and beyond:
        raise InputError(
            f"input protocol gu has {GU_LENGTH} tokens per input, so T = {', '.join(map(str, beyond))} is never "
            f"reached; use lengths <= {GU_LENGTH} (--lengths), or input protocol sinkscope",
            field="lengths",
        )
    if input_protocol != SINKSCOPE and all(value is None for value in (input_types, eps_curve, lengths)):
        raise InputError(
            f"input_protocol {input_protocol!r} says how the sink experiments' inputs are built; ask for them with "
            "input_types (--input-types prompts,random,repeated)",
            field="input_protocol",
        )


def check_experiments_reachable(config: AuditConfig, prompts: TokenizedPrompts, n_ctx: int) -> None:
    """An ``InputError`` before probing for experiments these prompts cannot give: a length
    no input reaches, or Gu et al.'s protocol without room or text for its 64 tokens."""
    if config.input_protocol == SINKSCOPE:
        check_lengths_reached(config.lengths, prompts.summary.max_tokens)
    else:
        kinds = config.input_types or (PROMPTS,)
        check_protocol_reachable(config.input_protocol, kinds, prompts, n_ctx)


def check_lengths_reached(lengths: tuple[int, ...] | None, longest: int) -> None:
    """An ``InputError`` for a length T that no prompt reaches (``longest`` tokens, the
    anchor included): it could only give an empty point, so it is refused before probing."""
    beyond = sorted({length for length in lengths or () if length > longest})
    if beyond:
        raise InputError(
            f"no prompt reaches T = {', '.join(map(str, beyond))} (the longest has {longest} tokens); use lengths "
            f"<= {longest} (--lengths), or longer prompts (--max-len)",
            field="lengths",
        )


def experiment_samples(hooked: HookedModel, config: AuditConfig) -> SampleSums | None:
    """What the audit's probe pass keeps for the experiments; None (nothing kept, the
    default audit's cost unchanged) when none is asked for."""
    if not asked(config):
        return None
    return prompt_samples(hooked, config.probe_config(), tuple(sorted(set(config.lengths or ()))))


def asked(config: AuditConfig) -> bool:
    """Whether ``config`` asks for any sink experiment."""
    return any(value is not None for value in (config.input_types, config.eps_curve, config.lengths))


def audit_experiments(
    hooked: HookedModel,
    loaded: LoadedModel,
    prompts: TokenizedPrompts,
    config: AuditConfig,
    prompt_sums: SampleSums | None,
) -> SinkCurves | None:
    """The experiments ``config`` asks for (None when none), after the probe filled ``prompt_sums``."""
    if prompt_sums is None:
        return None
    return sink_experiments(
        hooked,
        prompts,
        config.probe_config(),
        prompt_sums,
        ordinary_tokens(loaded),
        config.input_types or (PROMPTS,),
        config.eps_curve or (),
        tuple(sorted(set(config.lengths or ()))),
        config.n_bootstrap,
        (prompts.summary.spec.seed, config.seed),
        config.input_protocol,
    )
