"""``sinkscope audit``'s ``AuditConfig`` from its flags, and the flags of the measurements
the audit's probe pass adds on request (key geometry, secondary sinks)."""

from __future__ import annotations

import argparse


def add_measurement_flags(audit: argparse.ArgumentParser) -> None:
    """Measurements the probe pass makes by default, each with a flag to leave it out."""
    audit.add_argument(
        "--no-key-geometry",
        dest="key_geometry",
        action="store_false",
        help="skip the key geometry per head (query-key cosines before/after RoPE, anchor key/value norm ratios)",
    )
    audit.add_argument(
        "--no-secondary-sinks",
        dest="secondary_sinks",
        action="store_false",
        help="skip the secondary sinks (keys other than the anchor drawing >= 0.3 of later queries' attention) "
        "and their massive activations",
    )


def audit_config(args: argparse.Namespace):
    from sinkscope.cli.audit_experiment_flags import experiment_settings
    from sinkscope.pretrained_analysis.audit import AuditConfig

    return AuditConfig(
        batch_size=args.batch_size,
        sink_eps=args.sink_eps,
        ablate=args.ablate,
        ablate_heads=args.ablate_heads,
        ablate_prompts=args.ablate_prompts,
        ablate_sink=args.ablate_sink,
        head_ablations=args.head_ablations,
        n_examples=args.n_examples,
        seed=args.seed,
        layers=args.layers,
        key_geometry=args.key_geometry,
        secondary_sinks=args.secondary_sinks,
        **experiment_settings(args),
    )
