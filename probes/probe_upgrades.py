"""Upgrades of probe results written by older schema versions (``ProbeResult.UPGRADES``)."""

from __future__ import annotations

from typing import Any

from sinkscope.interp.model_spec import upgrade_model_spec_v1


def upgrade_layer_probe_v1(layer: dict[str, Any]) -> dict[str, Any]:
    """A ``LayerProbe``'s fields as files of schema version 1 hold them, in today's names
    (its count ``sink_heads`` became ``n_sink_heads``)."""
    return {("n_sink_heads" if key == "sink_heads" else key): value for key, value in layer.items()}


def upgrade_probe_v1(probe: dict[str, Any]) -> dict[str, Any]:
    """A probe result of schema version 1 (``probe.json``, or nested in an audit or a
    toy probe report) in version 2's names: its model spec's ``attention_kind`` is
    ``attention``, each layer row's ``sink_heads`` count is ``n_sink_heads``."""
    upgraded = dict(probe)
    if isinstance(upgraded.get("model"), dict):
        upgraded["model"] = upgrade_model_spec_v1(upgraded["model"])
    if isinstance(upgraded.get("layers"), list):
        upgraded["layers"] = [
            upgrade_layer_probe_v1(layer) if isinstance(layer, dict) else layer for layer in upgraded["layers"]
        ]
    return upgraded
