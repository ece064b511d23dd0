"""One validation at the boundary (issue 22, items 8 and 10): the codec checks every
persisted result's types, ranges and consistency on read. A tampered ``audit.json``
(a layer beyond n_layers, n_layers 0, an anchor mass of 1e308, no heads, n_heads -4,
n_queries 10**400, JSON nested 100,000 deep) is one line naming the file, the field and
what is allowed, exit 2, and no report; files of earlier releases still read."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import shutil
import typing
from pathlib import Path

import pytest

from fault_checks import audit_argv, one_line_exit_2, snapshot
from round_trip import PERSISTED_MODULES
from sinkscope.cli import main
from sinkscope.infra.codec import SchemaError, decode, encode, read_result, write_result
from sinkscope.probes.default_state import Estimate
from sinkscope.toy.run_dir import TrainResult
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "b883e06"


@pytest.fixture(scope="module")
def audit_dir(tmp_path_factory) -> Path:
    """One audit of the tiny model (2 layers x 2 heads); each test tampers with a copy."""
    root = tmp_path_factory.mktemp("validation")
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(TINY_GPT2_PROMPTS) + "\n", encoding="utf-8")
    out = root / "audit"
    assert main(audit_argv(build_tiny_gpt2(root / "tiny-gpt2"), prompts, out)) == 0
    return out


def refused_report(capsys, result: Path, fix: str, file: str = "") -> None:
    """``sinkscope report result``: exit 2, one line naming ``fix`` (and the ``file``), nothing written."""
    before = snapshot(result)
    one_line_exit_2(capsys, ["report", str(result), "--no-progress"], fix)
    assert snapshot(result) == before
    if file:  # one_line_exit_2 read the line; the same run again names the file
        assert main(["report", str(result), "--no-progress"]) == 2
        assert str(result / file) in capsys.readouterr().err
    assert not (result / "report.html").exists() and not (result / "report.md").exists()


def tampered_copy(source: Path, tmp_path: Path, name: str, edit) -> Path:
    copy = tmp_path / "result"
    shutil.copytree(source, copy)
    data = json.loads((copy / name).read_text())
    edit(data)
    (copy / name).write_text(json.dumps(data))
    return copy


def set_at(path: str, value):
    """An edit that sets the field at dotted ``path`` (list indices as numbers)."""

    def edit(data):
        *parents, last = [int(part) if part.isdigit() else part for part in path.split(".")]
        for part in parents:
            data = data[part]
        data[last] = value

    return edit


# (field path in audit.json, tampered value, what the one line must name)
AUDIT_TAMPERING = [
    ("probe.heads.3.layer", 99, "probe.heads[3].layer is 99; allowed: an index below n_layers (2)"),
    ("probe.heads.1.head", 2, "probe.heads[1].head is 2; allowed: an index below n_heads (2)"),
    ("probe.model.n_layers", 0, "probe.model.n_layers is 0; allowed: a number >= 1"),
    ("model.n_layers", 0, "model.n_layers is 0; allowed: a number >= 1"),
    ("probe.heads.0.anchor_mass", 1e308, "probe.heads[0].anchor_mass is 1e+308; allowed: a number in [0, 1]"),
    ("probe.layers.1.anchor_mass", 1.5, "probe.layers[1].anchor_mass is 1.5; allowed: a number in [0, 1]"),
    ("probe.heads.2.value_weighted_anchor_share", -0.5, "value_weighted_anchor_share is -0.5"),
    ("probe.heads", [], "probe.heads is 0 rows; allowed: n_layers x n_heads = 4 rows"),
    ("probe.layers", [], "probe.layers is 0 rows; allowed: one row per layer"),
    ("probe.model.n_heads", -4, "probe.model.n_heads is -4; allowed: a number >= 1"),
    ("model.n_heads", 3, "model.n_heads is 3; allowed: the probe's probe.model.n_heads (2)"),
    ("probe.n_queries", 10**400, "probe.n_queries is an integer of 401 digits"),
    ("probe.n_queries", -1, "probe.n_queries is -1; allowed: a number >= 0"),
    ("probe.n_inputs", True, "probe.n_inputs is bool True, not int"),
    ("probe.layers.0.n_sink_heads", 3, "probe.layers[0].n_sink_heads is 3; allowed: at most n_heads (2)"),
    ("probe.sink_rates.0.percent", 250.0, "probe.sink_rates[0].percent is 250.0; allowed: a number in [0, 100]"),
    ("prompts.n_truncated", 99, "prompts.n_truncated is 99; allowed: at most n_prompts"),
    ("seconds", -1.0, "seconds is -1.0; allowed: a number >= 0"),
    ("figures", ["/x/private.png"], "figures[0] is '/x/private.png'; allowed: a relative path"),
    ("figures", ["../private.png"], "figures[0] is '../private.png'; allowed: a relative path"),
]


@pytest.mark.parametrize("path, value, fix", AUDIT_TAMPERING, ids=[f"{p}={str(v)[:12]}" for p, v, _ in AUDIT_TAMPERING])
def test_a_tampered_audit_is_one_line_naming_the_field_and_its_range(audit_dir, tmp_path, capsys, path, value, fix):
    audit = tampered_copy(audit_dir, tmp_path, "audit.json", set_at(path, value))
    refused_report(capsys, audit, fix, "audit.json")


def test_infinity_and_nan_tokens_are_not_json(audit_dir, tmp_path, capsys):
    audit = tmp_path / "result"
    shutil.copytree(audit_dir, audit)
    text = (audit / "audit.json").read_text()
    (audit / "audit.json").write_text(text.replace('"seconds": ', '"seconds": Infinity, "x": ', 1))
    refused_report(capsys, audit, "Infinity is not standard JSON")


def test_an_audit_nested_100000_deep_is_one_line(audit_dir, tmp_path, capsys):
    audit = tmp_path / "result"
    shutil.copytree(audit_dir, audit)
    (audit / "audit.json").write_text("[" * 100_000 + "]" * 100_000)
    refused_report(capsys, audit, "nests too deep")


def test_a_mass_rounded_just_above_one_and_an_undefined_mass_still_read(audit_dir, tmp_path, capsys):
    def edit(data):
        data["probe"]["heads"][0]["anchor_mass"] = 1 + 1e-9  # a float sum of softmax weights
        data["probe"]["heads"][0]["is_sink_head"] = True  # as that mass makes it
        data["probe"]["heads"][1]["anchor_mass_other"] = None  # NaN: measured for no query

    audit = tampered_copy(audit_dir, tmp_path, "audit.json", edit)
    assert main(["report", str(audit), "--no-progress"]) == 0
    capsys.readouterr()


# --- the toy results, through the CLI on copies of earlier releases' results (schema
# version 1: a model's per-head rows are ``heads_table``, read as today's ``heads``) ---

SUMMARY_TAMPERING = [
    ("sweep", "rows.0.sink_fraction", 1.5, "rows[0].sink_fraction is 1.5; allowed: a number in [0, 1]"),
    ("sweep", "rows.0.converged", 5, "rows[0].converged is 5; allowed: at most seeds (1)"),
    ("sweep", "models.0.heads_table.0.layer", 7, "models[0].heads[0].layer is 7; allowed: an index below n_layers (1)"),
    ("sweep", "models.0.n_sink_heads", -1, "models[0].n_sink_heads is -1; allowed: a number >= 0"),
    (
        "sweep",
        "models.0.default_state_test.sink_heads",
        [[0, 5]],
        "models[0].default_state.sink_heads[0][1] is 5; allowed: an index below n_heads (1)",
    ),
    ("reproduction", "models.2.heads_table", [], "models[2].heads is 0 rows"),
    ("reproduction", "models.0.linf_error", -2.0, "models[0].linf_error is -2.0; allowed: a number >= 0"),
    ("reproduction", "config.max_steps", 0, "max_steps must be an integer in [1, 2**63 - 1], got 0"),
    ("reproduction", "wall_seconds", 1e400, "is not valid JSON"),
]


@pytest.mark.parametrize(
    "kind, path, value, fix", SUMMARY_TAMPERING, ids=[f"{k}:{p}" for k, p, _, _ in SUMMARY_TAMPERING]
)
def test_a_tampered_toy_summary_is_one_line(tmp_path, capsys, kind, path, value, fix):
    result = tampered_copy(FIXTURES / kind, tmp_path, "summary.json", set_at(path, value))
    if isinstance(value, float) and math.isinf(value):  # json writes it as Infinity
        assert "Infinity" in (result / "summary.json").read_text()
    refused_report(capsys, result, fix, "summary.json")


def test_a_toy_run_result_out_of_range_is_refused_by_the_codec(tmp_path):
    path = tmp_path / "result.json"
    write_result(
        path,
        TrainResult(
            run_dir="run", status="converged", converged=True, steps=10, wall_seconds=1.0, linf_error=0.1, loss=0.01
        ),
    )
    data = json.loads(path.read_text())
    data["steps"] = -3
    path.write_text(json.dumps(data))
    with pytest.raises(SchemaError, match=r"result\.json: steps is -3; allowed: a number >= 0"):
        read_result(path, TrainResult)


def test_the_codec_refuses_an_interval_whose_ends_are_swapped():
    with pytest.raises(SchemaError, match=r"ci_low is 2.0; allowed: at most ci_high \(1.0\)"):
        decode(Estimate, {"mean": 1.5, "ci_low": 2.0, "ci_high": 1.0})
    assert decode(Estimate, encode(Estimate(math.nan, math.nan, math.nan))).ci_low != 0  # undefined stays NaN


# --- every persisted class declares the range of every number it holds ---------------


def persisted_dataclasses() -> set[type]:
    """Every persisted class and every dataclass nested in one."""
    found: set[type] = set()

    def walk(kind) -> None:
        if dataclasses.is_dataclass(kind) and isinstance(kind, type):
            if kind in found:
                return
            found.add(kind)
            hints = typing.get_type_hints(kind)
            for field in dataclasses.fields(kind):
                if field.metadata.get("persist", True):
                    walk(hints[field.name])
        for arg in typing.get_args(kind):
            walk(arg)

    for name in PERSISTED_MODULES:
        for value in vars(importlib.import_module(name)).values():
            if isinstance(value, type) and dataclasses.is_dataclass(value) and "SCHEMA" in vars(value):
                walk(value)
    return found


def test_every_number_of_every_persisted_class_has_a_declared_range():
    from sinkscope.infra.bounds import undeclared_numeric_fields  # here: the file's other tests predate it

    classes = persisted_dataclasses()
    assert len(classes) > 30
    undeclared = {cls.__name__: undeclared_numeric_fields(cls) for cls in classes}
    assert {name: fields for name, fields in undeclared.items() if fields} == {}
