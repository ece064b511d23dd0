"""sinkscope: where a transformer parks its attention, and why.

The public API, importable from here (each name loads its module on first use, so
``import sinkscope`` and the command line stay fast)::

    import sinkscope

    result = sinkscope.audit(sinkscope.LoadSpec("gpt2"), sinkscope.PromptSpec())
    sinkscope.write_audit(result, "out/gpt2")
    sinkscope.report("out/gpt2")
"""

from __future__ import annotations

from importlib import import_module, metadata
from typing import Any

try:
    __version__ = metadata.version("sinkscope")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    # pretrained models
    "audit": "pretrained_analysis.audit",
    "write_audit": "pretrained_analysis.audit",
    "read_audit": "pretrained_analysis.audit",
    "AuditConfig": "pretrained_analysis.audit",
    "AuditResult": "pretrained_analysis.audit",
    "compare_audits": "pretrained_analysis.compare",
    "compare_directories": "pretrained_analysis.suite",
    "audit_suite": "pretrained_analysis.suite",
    "AuditSuite": "pretrained_analysis.suite",
    "wrap_model": "pretrained_analysis.loading",
    "prompt_set": "pretrained_analysis.prompts",
    "write_comparison": "pretrained_analysis.compare",
    "read_comparison": "pretrained_analysis.compare",
    # toy models and pretrained models side by side
    "compare_mechanism": "sinkscope.mechanism",
    "write_mechanism": "sinkscope.mechanism",
    "read_mechanism": "probes.mechanism",
    "MechanismComparison": "probes.mechanism",
    "MechanismSource": "probes.mechanism",
    "LoadSpec": "pretrained_analysis.loading",
    "load_model": "pretrained_analysis.loading",
    "PromptSpec": "pretrained_analysis.prompts",
    # probes and interventions, on any hooked model
    "probe_model": "probes.probe",
    "ProbeConfig": "probes.probe",
    "ProbeResult": "probes.probe",
    "run_with_intervention": "probes.interventions",
    "remove_sink": "probes.interventions",
    "evict_anchor": "probes.interventions",
    "mask_random_key": "probes.interventions",
    "zero_head": "probes.interventions",
    "default_state_test": "probes.default_state",
    "activation_patching": "probes.patching",
    # toy models
    "train": "toy.train",
    "train_seeds": "toy.train",
    "RunConfig": "toy.run_dir",
    "TrainConfig": "toy.run_dir",
    "ToyModelConfig": "toy.model",
    "TaskConfig": "toy.task",
    "evaluate_run": "toy.evaluate",
    "reproduce": "toy.reproduce",
    "ReproduceConfig": "toy.reproduce",
    "sweep": "toy.sweep",
    "SweepConfig": "toy.sweep",
    "TrackingConfig": "toy.tracking",
    # results on disk and reports
    "read_result": "interp.codec",
    "write_result": "interp.codec",
    "report": "sinkscope.reporting",
    # errors
    "SinkscopeError": "interp.errors",
    "InputError": "interp.errors",
    "RunFailed": "interp.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sinkscope' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
