"""Round trips of result files: every schema'd JSON file in a directory read back into its
class and encoded again equals the file. The tests that write real result directories
(reproduce, sweep, toy probe and patch, audit, comparison) call
``assert_json_files_round_trip``; ``tests/infra/test_codec.py`` tests the codec itself."""

from __future__ import annotations

import json
from pathlib import Path

from sinkscope.infra.codec import encode, read_result
from sinkscope.infra.provenance import Provenance
from sinkscope.pretrained_analysis.audit import AuditResult
from sinkscope.pretrained_analysis.compare import Comparison
from sinkscope.pretrained_analysis.suite import AuditSuite
from sinkscope.probes.patching import PatchingResult
from sinkscope.probes.probe import ProbeResult
from sinkscope.probes.window_test import WindowTestResult
from sinkscope.toy.evaluate import ToyDefaultState
from sinkscope.toy.experiment import ModelSummary
from sinkscope.toy.patching import TriggerPatching
from sinkscope.toy.reproduce import ReproduceConfig, ReproduceSummary
from sinkscope.toy.run_dir import RunConfig, TrainResult
from sinkscope.toy.source_run import SourceRun
from sinkscope.toy.sweep import SweepConfig, SweepResult
from sinkscope.toy.tradeoff import TradeoffResult

PERSISTED = {
    cls.SCHEMA: cls
    for cls in (
        AuditResult,
        AuditSuite,
        Comparison,
        PatchingResult,
        ModelSummary,
        ProbeResult,
        Provenance,
        ReproduceConfig,
        ReproduceSummary,
        RunConfig,
        SourceRun,
        SweepConfig,
        SweepResult,
        ToyDefaultState,
        TradeoffResult,
        TrainResult,
        TriggerPatching,
        WindowTestResult,
    )
}


def assert_json_files_round_trip(directory: Path) -> set[str]:
    """Every schema'd JSON file under ``directory`` read back and encoded again equals the
    file; returns the schemas seen."""
    seen = set()
    for path in sorted(Path(directory).rglob("*.json")):
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or "schema" not in data:
            continue
        cls = PERSISTED[data["schema"]]
        assert data["schema_version"] == cls.SCHEMA_VERSION, path  # written by today's code
        fields = {key: value for key, value in data.items() if key not in ("schema", "schema_version")}
        assert encode(read_result(path, cls)) == fields, path
        seen.add(data["schema"])
    return seen


# Every module that defines a persisted (schema'd) result class today.
PERSISTED_MODULES = (
    "sinkscope.infra.provenance",
    "sinkscope.probes.probe",
    "sinkscope.probes.patching",
    "sinkscope.probes.mechanism",
    "sinkscope.toy.run_dir",
    "sinkscope.toy.source_run",
    "sinkscope.toy.evaluate",
    "sinkscope.toy.experiment",
    "sinkscope.toy.patching",
    "sinkscope.toy.tradeoff",
    "sinkscope.toy.reproduce",
    "sinkscope.toy.sweep",
    "sinkscope.pretrained_analysis.audit",
    "sinkscope.pretrained_analysis.audit_config",
    "sinkscope.pretrained_analysis.compare",
    "sinkscope.pretrained_analysis.suite",
    "sinkscope.probes.window_test",
)
