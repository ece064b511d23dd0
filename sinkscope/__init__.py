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
from typing import TYPE_CHECKING, Any

try:
    __version__ = metadata.version("sinkscope")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

# What type checkers and IDEs see (names in __all__ are re-exported); at run time
# __getattr__ loads each name's module on first use, so importing sinkscope stays cheap.
if TYPE_CHECKING:
    from sinkscope.infra.codec import read_result, write_result
    from sinkscope.infra.errors import (
        InputError,
        RunFailed,
        SinkscopeError,
    )
    from sinkscope.mechanism import compare_mechanism, write_mechanism
    from sinkscope.pretrained_analysis.audit import (
        AuditResult,
        audit,
        read_audit,
        write_audit,
    )
    from sinkscope.pretrained_analysis.audit_config import AuditConfig
    from sinkscope.pretrained_analysis.circuit import circuit
    from sinkscope.pretrained_analysis.compare import (
        compare_audits,
        read_comparison,
        write_comparison,
    )
    from sinkscope.pretrained_analysis.loading import (
        LoadSpec,
        load_model,
        wrap_model,
    )
    from sinkscope.pretrained_analysis.prompts import PromptSpec, prompt_set
    from sinkscope.pretrained_analysis.suite import (
        AuditSuite,
        audit_suite,
        compare_directories,
    )
    from sinkscope.pretrained_analysis.window_test import window_test
    from sinkscope.probes.circuit_battery import run_circuit_battery
    from sinkscope.probes.circuit_result import CircuitConfig, CircuitRun
    from sinkscope.probes.default_state import default_state_test
    from sinkscope.probes.geometry_result import key_geometry
    from sinkscope.probes.interventions import (
        evict_anchor,
        mask_random_key,
        open_gate,
        remove_learned_sink,
        remove_null,
        remove_sink,
        run_with_intervention,
        zero_head,
    )
    from sinkscope.probes.mechanism import (
        MechanismComparison,
        MechanismSource,
        read_mechanism,
    )
    from sinkscope.probes.patching import activation_patching
    from sinkscope.probes.probe import ProbeConfig, ProbeResult
    from sinkscope.probes.runner import probe_model
    from sinkscope.probes.secondary_result import secondary_sinks
    from sinkscope.probes.sink_curves import sink_curves
    from sinkscope.probes.window_test import WindowTestResult
    from sinkscope.reporting import report
    from sinkscope.toy.circuit_run import toy_circuit
    from sinkscope.toy.evaluate import evaluate_run
    from sinkscope.toy.model import ToyModelConfig
    from sinkscope.toy.reproduce import ReproduceConfig, reproduce
    from sinkscope.toy.run_dir import RunConfig, TrainConfig
    from sinkscope.toy.sweep import SweepConfig, sweep
    from sinkscope.toy.task import TaskConfig, toy_input_tokens
    from sinkscope.toy.tracking import TrackingConfig
    from sinkscope.toy.train import train, train_seeds
    from sinkscope.toy.window_test import toy_window_test

# public name -> the module that defines it (tests/package/test_public_api.py checks that
# the two lists agree)
_EXPORTS: dict[str, str] = {
    # pretrained models
    "audit": "sinkscope.pretrained_analysis.audit",
    "write_audit": "sinkscope.pretrained_analysis.audit",
    "read_audit": "sinkscope.pretrained_analysis.audit",
    "AuditConfig": "sinkscope.pretrained_analysis.audit_config",
    "AuditResult": "sinkscope.pretrained_analysis.audit",
    "compare_audits": "sinkscope.pretrained_analysis.compare",
    "compare_directories": "sinkscope.pretrained_analysis.suite",
    "audit_suite": "sinkscope.pretrained_analysis.suite",
    "AuditSuite": "sinkscope.pretrained_analysis.suite",
    "wrap_model": "sinkscope.pretrained_analysis.loading",
    "prompt_set": "sinkscope.pretrained_analysis.prompts",
    "write_comparison": "sinkscope.pretrained_analysis.compare",
    "read_comparison": "sinkscope.pretrained_analysis.compare",
    # toy models and pretrained models side by side
    "compare_mechanism": "sinkscope.mechanism",
    "write_mechanism": "sinkscope.mechanism",
    "read_mechanism": "sinkscope.probes.mechanism",
    "MechanismComparison": "sinkscope.probes.mechanism",
    "MechanismSource": "sinkscope.probes.mechanism",
    "LoadSpec": "sinkscope.pretrained_analysis.loading",
    "load_model": "sinkscope.pretrained_analysis.loading",
    "PromptSpec": "sinkscope.pretrained_analysis.prompts",
    # probes and interventions, on any hooked model
    "probe_model": "sinkscope.probes.runner",
    "ProbeConfig": "sinkscope.probes.probe",
    "ProbeResult": "sinkscope.probes.probe",
    "run_with_intervention": "sinkscope.probes.interventions",
    "remove_sink": "sinkscope.probes.interventions",
    "remove_learned_sink": "sinkscope.probes.interventions",
    "remove_null": "sinkscope.probes.interventions",
    "open_gate": "sinkscope.probes.interventions",
    "evict_anchor": "sinkscope.probes.interventions",
    "mask_random_key": "sinkscope.probes.interventions",
    "zero_head": "sinkscope.probes.interventions",
    "default_state_test": "sinkscope.probes.default_state",
    "activation_patching": "sinkscope.probes.patching",
    "key_geometry": "sinkscope.probes.geometry_result",
    "secondary_sinks": "sinkscope.probes.secondary_result",
    "sink_curves": "sinkscope.probes.sink_curves",
    # the streaming window test (StreamingLLM's), on pretrained and toy models
    "window_test": "sinkscope.pretrained_analysis.window_test",
    "toy_window_test": "sinkscope.toy.window_test",
    "WindowTestResult": "sinkscope.probes.window_test",
    # the sink-circuit battery: which part builds the sink, each edit beside its control
    "circuit": "sinkscope.pretrained_analysis.circuit",
    "toy_circuit": "sinkscope.toy.circuit_run",
    "run_circuit_battery": "sinkscope.probes.circuit_battery",
    "CircuitConfig": "sinkscope.probes.circuit_result",
    "CircuitRun": "sinkscope.probes.circuit_result",
    # toy models
    "train": "sinkscope.toy.train",
    "train_seeds": "sinkscope.toy.train",
    "RunConfig": "sinkscope.toy.run_dir",
    "TrainConfig": "sinkscope.toy.run_dir",
    "ToyModelConfig": "sinkscope.toy.model",
    "TaskConfig": "sinkscope.toy.task",
    "toy_input_tokens": "sinkscope.toy.task",
    "evaluate_run": "sinkscope.toy.evaluate",
    "reproduce": "sinkscope.toy.reproduce",
    "ReproduceConfig": "sinkscope.toy.reproduce",
    "sweep": "sinkscope.toy.sweep",
    "SweepConfig": "sinkscope.toy.sweep",
    "TrackingConfig": "sinkscope.toy.tracking",
    # results on disk and reports
    "read_result": "sinkscope.infra.codec",
    "write_result": "sinkscope.infra.codec",
    "report": "sinkscope.reporting",
    # errors
    "SinkscopeError": "sinkscope.infra.errors",
    "InputError": "sinkscope.infra.errors",
    "RunFailed": "sinkscope.infra.errors",
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
