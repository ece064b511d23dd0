"""`sinkscope audit`'s flags for the sink experiments: input types and the protocol that
builds them, the eps curve and the length sweep (``sinkscope.pretrained_analysis.input_types``)."""

from __future__ import annotations

import argparse

from sinkscope.cli.args import fraction, int_list, list_items, str_list
from sinkscope.infra.bounds import TOKENS


def fraction_list(text: str) -> tuple[float, ...]:
    """Comma-separated numbers in [0, 1), e.g. 0.1,0.3,0.5."""
    return tuple(fraction(part) for part in list_items(text))


fraction_list.bound = fraction.bound  # type: ignore[attr-defined]  # read by tests


def input_type_list(text: str) -> tuple[str, ...]:
    """Comma-separated input types, checked while parsing (before any model loads)."""
    from sinkscope.infra.errors import InputError
    from sinkscope.pretrained_analysis.input_types import check_input_types

    kinds = str_list(text)
    try:
        check_input_types(kinds)
    except InputError as error:
        raise argparse.ArgumentTypeError(str(error).split(" (")[0]) from error
    return kinds


def add_experiment_flags(audit: argparse.ArgumentParser) -> None:
    """--input-types, --input-protocol, --eps-curve, --lengths; any of them but the protocol
    runs the experiments."""
    audit.add_argument(
        "--input-types",
        type=input_type_list,
        default=None,
        help="also probe these inputs: prompts,random,repeated (uniform random tokens; one token repeated); the "
        "sink rate and anchor mass per type side by side (Gu et al., Table 1), built by --input-protocol",
    )
    audit.add_argument(
        "--input-protocol",
        choices=("sinkscope", "gu"),
        default="sinkscope",
        help="how the input types are built: sinkscope (default; each prompt's own length, its BOS kept first, "
        "only the tokens after it change) or gu (Gu et al.'s: 64 tokens per input, no BOS prepended; prompts cut "
        "into 64-token windows)",
    )
    audit.add_argument(
        "--eps-curve",
        type=fraction_list,
        default=None,
        help="the sink rate at each of these eps, e.g. 0.1,0.3,0.5,0.7,0.9, drawn as a curve (from the same pass)",
    )
    audit.add_argument(
        "--lengths",
        type=length_list,
        default=None,
        help="the sink rate and anchor mass of the prompts cut to each T, e.g. 16,32,64 (anchor included; "
        "no extra forward on a causal model)",
    )


def length_list(text: str) -> tuple[int, ...]:
    """``--lengths``: token counts T >= 2 (the anchor and one query), refused while parsing."""
    return int_list(text, TOKENS, "16,32,64")


length_list.bound = TOKENS  # type: ignore[attr-defined]  # read by tests


def experiment_settings(args: argparse.Namespace) -> dict:
    """The ``AuditConfig`` fields of the flags."""
    return {
        "input_types": args.input_types,
        "eps_curve": args.eps_curve,
        "lengths": args.lengths,
        "input_protocol": args.input_protocol,
    }
