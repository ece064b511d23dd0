"""Result directories written by the previous release (commit b883e06, the old layout with
top-level ``interp``/``toy``/``probes`` packages) still read and still report.

The fixtures under ``tests/fixtures/b883e06/`` were written by that commit's code
(``make_fixtures.sh`` there regenerates them; its README names each command). Each test
works on a copy in ``tmp_path``, so the fixtures stay as that release left them. Expected
numbers are read from the fixture files and formatted the way today's reports format them,
so a regeneration with other digits still tests the same thing.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from round_trip import PERSISTED_MODULES
from sinkscope.cli import main
from sinkscope.infra.codec import read_result
from sinkscope.pretrained_analysis.audit import read_audit
from sinkscope.probes.tables import ANCHOR_MASS, HEAD_TABLE, VALUE_SHARE
from sinkscope.reports.formatting import format_cell, sig, sig_kept
from sinkscope.toy.tradeoff import point_label

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "b883e06"


# the per-head numbers are formatted as the one per-head table definition formats them
ANCHOR_MASS_OTHER, ALPHA = (
    next(c for c in HEAD_TABLE.columns if c.name == name) for name in ("anchor_mass_other", "alpha")
)


def persisted_classes() -> dict[str, type]:
    """Today's class for each schema name (``"audit"`` -> ``AuditResult``, ...)."""
    classes: dict[str, type] = {}
    for name in PERSISTED_MODULES:
        for value in vars(importlib.import_module(name)).values():
            if isinstance(value, type) and dataclasses.is_dataclass(value) and "SCHEMA" in vars(value):
                classes[value.SCHEMA] = value
    return classes


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def unescaped(markdown: str) -> str:
    """The report's Markdown with its backslash escapes (``\\(``, ``\\_``, ``\\+``) undone."""
    return re.sub(r"\\(.)", r"\1", markdown)


# --- the numbers each kind of report must show, read from the fixture's own files -------


def toy_probe_numbers(directory: Path) -> list[str]:
    probe = load(directory / "probe.json")
    heads = probe["heads"]
    n_sink = sum(head["is_sink_head"] for head in heads)
    expected = [f"{n_sink} of {len(heads)} heads", f"{probe['n_inputs']} test sequences"]
    expected += [f"{format_cell(rate['percent'], '.1f')}% at ε = {rate['eps']}" for rate in probe["sink_rates"]]
    expected += [
        f"| {head['layer']} | {head['head']} | {format_cell(head['anchor_mass'], ANCHOR_MASS.fmt)} "
        f"| {format_cell(head['anchor_mass_other'], ANCHOR_MASS_OTHER.fmt)} | {format_cell(head['alpha'], ALPHA.fmt)} |"
        for head in heads
    ]
    default_state = load(directory / "default_state.json")
    if default_state["default_error_before"] is not None:
        expected.append(
            f"from {sig_kept(default_state['default_error_before'], 3)} to "
            f"{sig_kept(default_state['default_error_after_remove'], 3)}"
        )
    return expected


def toy_patch_numbers(directory: Path) -> list[str]:
    patching = load(directory / "patching.json")
    expected = []
    # positions as reports count them: from 1, BOS at 1
    shown = {"head": lambda row: row["head"], "position": lambda row: row["position"] + 1}
    for name, site, place in (("heads", "L{layer}H{head}", "head"), ("positions", "L{layer} pos {shown}", "position")):
        result = patching[name]
        expected.append(f"{result['n_inputs']} input pairs; metric {sig(result['target_metric'], 3)} on the target")
        expected += [
            f"| {site.format(shown=shown[place](row), **row)} | {row['layer']} | {shown[place](row)} "
            f"| {format_cell(row['patched'], '.4g')} "
            f"| {format_cell(row['effect'], '.4g')} | {format_cell(row['normalised_effect'], '.3f')} |"
            for row in result["rows"]
        ]
    return expected


def toy_tradeoff_numbers(directory: Path) -> list[str]:
    tradeoff = load(directory / "tradeoff.json")
    return [
        f"| {series} | {point['label']} | {point_label(series, SimpleNamespace(**point))} "
        f"| {format_cell(point['scale'], '.3g')} "
        f"| {format_cell(point['anchor_mass_default'], '.4f')} | {format_cell(point['default_mse'], '.3g')} |"
        for series, points in tradeoff["series"].items()
        for point in points
    ]


def toy_reproduction_numbers(directory: Path) -> list[str]:
    summary = load(directory / "summary.json")
    models = summary["models"]
    passed = sum(check["passed"] for check in summary["checks"])
    expected = [
        f"{len(models)} models trained",
        f"within {summary['config']['max_steps']} steps",
        f"{passed} of {len(summary['checks'])} checks against the paper pass",
    ]
    expected += [
        f"| {model['name']} | {model['attention']} | {model['layers']} | {model['heads']} | {model['seed']} "
        f"| {format_cell(model['converged'])} | {model['steps']} |"
        for model in models
    ]
    expected += [
        f"{model['name']} {model['n_sink_heads']}/{model['layers'] * model['heads']} (paper {model['paper_sink_heads']})"
        for model in models
        if model["attention"] == "softmax"
    ]
    return expected


def _status(row: dict) -> str:
    """A sweep row's status as the report states it: unfinished rows are at the step cap."""
    done = row["converged"] == row["seeds"]
    return "converged" if done else f"at step cap ({row['converged']}/{row['seeds']} converged)"


def toy_sweep_numbers(directory: Path) -> list[str]:
    summary = load(directory / "summary.json")
    config, rows = summary["config"], summary["rows"]
    expected = [
        f"{len(rows)} configurations x {config['seeds']} seed{'s' if config['seeds'] != 1 else ''} "
        f"({len(summary['models'])} models), "
        f"up to {config['max_steps']:,} steps each"
    ]
    expected += [
        f"| {row['attention']} {row['layers']}x{row['heads']} d{row['d_model']} L{row['seq_len']} "
        f"| {_status(row)} | {row['mean_steps']} |"
        for row in rows
    ]
    return expected


def audit_numbers(directory: Path) -> list[str]:
    audit = load(directory / "audit.json")
    model, probe = audit["model"], audit["probe"]
    heads = probe["heads"]
    n_sink = sum(head["is_sink_head"] for head in heads)
    expected = [f"{model['n_layers']} layers x {model['n_heads']} heads, {model['n_params']:,} parameters"]
    expected.append(f"{n_sink} of {len(heads)} heads" if n_sink else f"None of the {len(heads)} heads is a sink head")
    expected += [f"{format_cell(rate['percent'], '.1f')}% at ε = {rate['eps']}" for rate in probe["sink_rates"]]
    expected += [
        f"| {head['layer']} | {head['head']} | {format_cell(head['anchor_mass'], ANCHOR_MASS.fmt)} "
        f"| {format_cell(head['alpha'], ALPHA.fmt)} |"
        for head in heads
    ]
    ablation = audit["ablation"]
    if ablation is not None and ablation["base_loss"] is not None:
        base, evicted = ablation["base_loss"], ablation["evict_anchor_loss"]
        expected.append(f"from {base:.3f} to {evicted:.3f} (change {evicted - base:+.3f}, no interval recorded)")
    return expected


def comparison_numbers(directory: Path) -> list[str]:
    comparison = load(directory / "comparison.json")
    return [
        f"| {row['label']} | {format_cell(row['revision'])} | {row['n_layers']} | {row['n_heads']} | {row['n_params']:,} "
        + "".join(f"| {format_cell(percent, '.1f')} " for percent in row["sink_rate"].values())
        + f"| {row['n_sink_heads']} | {format_cell(row['mean_anchor_mass'], '.3f')} | {format_cell(row['base_loss'], '.3f')} "
        f"| {format_cell(row['all_sink_heads_loss_delta'], '.4f')} | {format_cell(row['evict_anchor_loss_delta'], '.4f')} |"
        for row in comparison["rows"]
    ]


def mechanism_numbers(directory: Path) -> list[str]:
    mechanism = load(directory / "mechanism.json")
    n_sink = sum(model["n_sink_heads"] for model in mechanism["models"])
    expected = [f"{len(mechanism['models'])} models compared with the same probes", f"{n_sink} sink heads in all"]
    expected += [
        f"| {head['source']} | {head['kind']} | {model} | {head['layer']} | {head['head']} "
        f"| {format_cell(head['anchor_mass'], ANCHOR_MASS.fmt)} "
        f"| {format_cell(head['value_weighted_anchor_share'], VALUE_SHARE.fmt)} |"
        for head in mechanism["heads"]
        for model in [next(m["model"] for m in mechanism["models"] if m["source"] == head["source"])]
    ]
    return expected


# fixture directory -> (the kind `sinkscope report` must recognise, the numbers its Markdown shows)
REPORTED: dict[str, tuple[str, Callable[[Path], list[str]]]] = {
    "toy-run/probe": ("toy probe", toy_probe_numbers),
    "toy-patch": ("toy patch", toy_patch_numbers),
    "toy-tradeoff": ("toy tradeoff", toy_tradeoff_numbers),
    "reproduction": ("toy reproduction", toy_reproduction_numbers),
    "sweep": ("toy sweep", toy_sweep_numbers),
    "audit-gpt2": ("audit", audit_numbers),
    "audit-neox": ("audit", audit_numbers),
    "minilm-audit": ("audit", audit_numbers),
    "audit-comparison": ("comparison", comparison_numbers),
    "audit-suite": ("comparison", comparison_numbers),
    "mechanism": ("mechanism", mechanism_numbers),
}
FIXTURE_DIRS = sorted({name.split("/")[0] for name in REPORTED} | {"toy-run"})


def copy_fixture(name: str, tmp_path: Path) -> Path:
    """A copy of the fixture directory holding ``name`` (``toy-run/probe`` copies the run)."""
    top = name.split("/")[0]
    shutil.copytree(FIXTURES / top, tmp_path / top)
    return tmp_path / name


def test_every_fixture_directory_is_covered() -> None:
    # a fixture added by make_fixtures.sh but forgotten here would go untested
    on_disk = sorted(path.name for path in FIXTURES.iterdir() if path.is_dir())
    assert on_disk == FIXTURE_DIRS


@pytest.mark.parametrize("name", FIXTURE_DIRS)
def test_every_schema_file_reads_back_with_todays_classes(name: str, tmp_path: Path) -> None:
    directory = copy_fixture(name, tmp_path)
    classes = persisted_classes()
    files = sorted(directory.rglob("*.json"))
    assert files, f"{name} holds no JSON"
    for path in files:
        schema = load(path).get("schema")
        assert schema in classes, f"{path.relative_to(tmp_path)}: schema {schema!r} has no class today"
        result = read_result(path, classes[schema])
        assert isinstance(result, classes[schema])


@pytest.mark.parametrize("name", sorted(REPORTED))
def test_report_writes_html_and_markdown_with_the_fixtures_numbers(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kind, numbers = REPORTED[name]
    directory = copy_fixture(name, tmp_path)
    capsys.readouterr()
    assert main(["report", str(directory), "--json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == kind
    assert (directory / "report.html").stat().st_size > 0
    markdown = unescaped((directory / "report.md").read_text())
    expected = numbers(directory)
    assert expected
    missing = [text for text in expected if text not in markdown]
    assert not missing, f"{name}: report.md lacks {missing}"


def test_compare_accepts_the_previous_releases_audits(tmp_path: Path) -> None:
    audits = [copy_fixture(name, tmp_path) for name in ("audit-gpt2", "audit-neox")]
    out = tmp_path / "comparison"
    assert main(["compare", *map(str, audits), "--out", str(out), "--no-progress"]) == 0
    # the same rows the previous release's compare wrote from the same audits, plus what it
    # did not record: a step only where known, the loss changes' intervals and their n
    added = ("all_sink_heads_loss_change", "evict_anchor_loss_change", "ablation_prompts")
    written = load(out / "comparison.json")["rows"]
    rows = [
        {key: value for key, value in row.items() if (key, value) != ("step", None) and key not in added}
        for row in written
    ]
    assert rows == load(FIXTURES / "audit-comparison" / "comparison.json")["rows"]
    for row, audit in zip(written, audits):
        ablation = read_audit(audit).ablation
        assert ablation is not None and row["ablation_prompts"] == ablation.default_state.n_inputs
        assert row["evict_anchor_loss_change"] is None is ablation.evict_anchor_increase  # not recorded then
        assert row["all_sink_heads_loss_change"]["mean"] == pytest.approx(row["all_sink_heads_loss_delta"])
    assert main(["report", str(out), "--no-progress"]) == 0


def test_compare_puts_a_previous_toy_run_beside_a_previous_audit(tmp_path: Path) -> None:
    run, audit = copy_fixture("toy-run", tmp_path), copy_fixture("audit-gpt2", tmp_path)
    out = tmp_path / "mechanism"
    assert main(["compare", str(run), str(audit), "--sequences", "64", "--out", str(out), "--no-progress"]) == 0
    # both probes are read from the old files (probe.json, audit.json): every head's numbers as before
    assert load(out / "mechanism.json")["heads"] == load(FIXTURES / "mechanism" / "mechanism.json")["heads"]
