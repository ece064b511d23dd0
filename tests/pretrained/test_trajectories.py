"""Sinks over training: audits of one model's checkpoints drawn against the training step.

The checkpoints are built with a known answer: a random tiny GPT-2 at "step 0", the same
model with a BOS sink planted in L0H0 at "step 1000", and in L0H0 and L1H1 at "step
143000". Each is audited for real; the revision names (or a mapping the user gives)
place them on the step axis, and every drawn point must be a measured value."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from sinkscope.cli import main
from sinkscope.infra.errors import InputError
from sinkscope.pretrained_analysis.audit import AuditConfig, audit, write_audit
from sinkscope.pretrained_analysis.compare import (
    TRAJECTORY_FIGURE,
    compare_audits,
    read_comparison,
    write_comparison,
)
from sinkscope.pretrained_analysis.compare_figures import CHECKPOINT_AXIS, sink_rate_figure
from sinkscope.pretrained_analysis.loading import LoadSpec
from sinkscope.pretrained_analysis.training_steps import parse_steps, step_from_revision
from sinkscope.pretrained_analysis.trajectory_figures import trajectory_figure
from sinkscope.reporting import report
from sinkscope.reports.step_axis import STEP_AXIS
from tiny_models import build_tiny_gpt2

PROMPTS = [
    "The first token collects attention that has nowhere else to go.",
    "Sinks appear in softmax attention because every row must sum to one.",
    "Language models park their attention on the beginning of the sequence.",
]
CONFIG = AuditConfig(n_examples=0, batch_size=3)
# revision -> the heads given a planted BOS sink
CHECKPOINTS = {"step0": None, "step1000": [(0, 0)], "step143000": [(0, 0), (1, 1)]}


def _as_revision(result, revision: str):
    """An audit as one of ``org/tiny``'s revisions (a local directory has none; a hub suite
    would record exactly these fields)."""
    model = replace(result.model, name="org/tiny", label=f"org/tiny@{revision}", revision=revision)
    return replace(result, model=model)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    audited = []
    for revision, sinks in CHECKPOINTS.items():
        directory = build_tiny_gpt2(root / revision)
        if sinks:
            from tiny_models import load_hf_model, plant_bos_sink

            model = load_hf_model(directory)
            for layer, head in sinks:
                plant_bos_sink(model, layer, head)
            model.save_pretrained(directory)
        result = audit(LoadSpec(str(directory)), PROMPTS, CONFIG, progress=False)
        audited.append(_as_revision(result, revision))
    return audited


def test_steps_are_read_from_the_names_researchers_use():
    assert step_from_revision("step143000") == 143000  # Pythia
    assert step_from_revision("stage1-step5000-tokens21B") == 5000  # OLMo
    assert step_from_revision("checkpoint-1000") == 1000  # the Hugging Face Trainer
    assert step_from_revision("global_step250") == 250
    for name in ("main", "v1.0", "nonstep12", "step", None, ""):
        assert step_from_revision(name) is None, name


def test_a_step_mapping_is_parsed_and_bad_pairs_are_refused():
    assert parse_steps("main=143000, step1=1") == {"main": 143000, "step1": 1}
    for bad in ("main", "main=", "=5", "main=-1", "main=1.5", "main=1,main=2", "main=²"):
        with pytest.raises(InputError, match="--steps"):
            parse_steps(bad)
    with pytest.raises(InputError, match="beyond any training run"):  # a result file could not hold it
        parse_steps("main=99999999999999999999999")
    assert parse_steps(f"main={2**63 - 1}") == {"main": 2**63 - 1}


def test_the_trajectory_holds_the_measured_checkpoints_in_step_order(results):
    comparison = compare_audits(list(reversed(results)))  # given out of order: drawn in step order
    ((model, rows),) = comparison.trajectories()
    assert model == "org/tiny"
    assert [row.step for row in rows] == [0, 1000, 143000]
    assert [row.n_sink_heads for row in rows] == [0, 1, 2]  # the planted sinks, by construction


def test_every_drawn_point_is_a_measured_value(results, tmp_path):
    comparison = compare_audits(results)
    figure = trajectory_figure(comparison, tmp_path / "over.png")
    rate_ax, heads_ax, layer_ax = figure.axes[:3]
    rows = comparison.trajectories()[0][1]
    steps = [0, 1000, 143000]
    for line, eps in zip(rate_ax.lines, comparison.epsilons(), strict=True):
        assert list(line.get_xdata()) == steps
        assert np.allclose(line.get_ydata(), [row.sink_rate[eps] for row in rows])
    assert np.allclose(heads_ax.lines[0].get_ydata(), [0, 1, 2])
    assert len(layer_ax.lines) == rows[0].n_layers  # one line per layer, nothing interpolated
    for layer, line in enumerate(layer_ax.lines):
        assert np.allclose(line.get_ydata(), [row.layer_anchor_mass[layer] for row in rows])
    # steps 0 to 143,000: a symmetric-log axis keeps step 0 on it
    assert all(ax.get_xscale() == "symlog" and ax.get_xlabel() == STEP_AXIS for ax in (rate_ax, heads_ax, layer_ax))


def test_names_without_steps_stay_ordered_checkpoints_until_a_mapping_places_them(results, tmp_path):
    renamed = [_as_revision(result, name) for result, name in zip(results, ["early", "middle", "main"], strict=True)]
    plain = compare_audits(renamed)
    assert plain.has_checkpoints() and not plain.trajectories()
    assert sink_rate_figure(plain, tmp_path / "rate.png").axes[0].get_xlabel() == CHECKPOINT_AXIS
    mapped = compare_audits(renamed, steps={"early": 10, "middle": 20, "main": 30})
    assert [row.step for row in mapped.trajectories()[0][1]] == [10, 20, 30]
    figure = trajectory_figure(mapped, tmp_path / "over.png")
    assert figure.axes[0].get_xscale() == "linear"  # 10 to 30: no decades to compress
    with pytest.raises(InputError, match="no audit has"):
        compare_audits(renamed, steps={"mian": 30})


def test_the_comparison_report_draws_and_states_the_trajectory(results, tmp_path):
    directories = []
    for result in results:
        directories.append(tmp_path / result.model.revision)
        write_audit(result, directories[-1])
    out = tmp_path / "suite"
    assert main(["compare", *map(str, directories), "--out", str(out)]) == 0
    stored = json.loads((out / "comparison.json").read_text())
    assert [row["step"] for row in stored["rows"]] == [0, 1000, 143000]
    assert read_comparison(out).trajectories()
    written = report(out)
    markdown = written.markdown.read_text()
    assert TRAJECTORY_FIGURE in markdown and "sinks over training" in markdown
    assert "| revision | step |" in markdown
    (finding,) = [f for f in written.findings if f.startswith("Over training")]
    assert "steps 0 to 143,000" in finding and "sink heads from 0 to 2" in finding


def test_a_comparison_written_before_steps_reads_as_no_trajectory(results, tmp_path):
    write_comparison(compare_audits(results), tmp_path / "cmp")
    path = tmp_path / "cmp" / "comparison.json"
    stored = json.loads(path.read_text())
    for row in stored["rows"]:
        del row["step"]
    path.write_text(json.dumps(stored))
    again = read_comparison(tmp_path / "cmp")
    assert all(row.step is None for row in again.rows) and not again.trajectories()


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as stop:  # argparse's own usage error
        return int(stop.code or 0)


def test_bad_steps_on_the_command_line_are_one_line_and_exit_2(results, tmp_path, capsys):
    directories = []
    for result in results[:2]:
        directories.append(str(tmp_path / result.model.revision))
        write_audit(result, directories[-1])
    out = tmp_path / "cmp"
    for steps, words in (("step0", "REVISION=STEP"), ("mian=3", "no audit has")):
        assert _exit_code(["compare", *directories, "--out", str(out), "--steps", steps]) == 2
        error = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("usage")]
        assert len(error) == 1 and words in error[0], error
        assert not out.exists()
    twice = [directories[0], directories[1], directories[0] + "/"]  # the same audit again, spelled apart
    assert _exit_code(["compare", *twice, "--out", str(out)]) == 2
    assert "is given twice" in capsys.readouterr().err and not out.exists()


def test_steps_given_in_python_are_whole_numbers_for_named_revisions(results):
    assert step_from_revision("step10k") is None  # "10k" is no exact step
    for bad in ({"step0": -5}, {"step0": 1.5}, {"step0": float("nan")}, {0: 1}, {"step0": True}, [("step0", 1)]):
        with pytest.raises(InputError, match="steps"):
            compare_audits(results, steps=bad)


def test_a_missing_directory_is_named_before_steps_are_judged(results, tmp_path, capsys):
    first = tmp_path / "a"
    write_audit(results[0], first)
    code = _exit_code(
        ["compare", str(first), str(tmp_path / "missing"), "--out", str(tmp_path / "o"), "--steps", "s=1"]
    )
    error = capsys.readouterr().err
    assert code == 2 and "missing" in error and "drop --steps" not in error


def test_a_learned_sink_ablation_is_not_compared_as_the_anchor_s(results):
    from sinkscope.pretrained_analysis.ablation import AblationResult
    from sinkscope.probes.default_state import DefaultStateResult, DefaultStateRow, Estimate

    change = Estimate(0.5, 0.4, 0.6)
    row = DefaultStateRow("all_sink_heads", ((0, 0),), 4.0, 4.5, 4.0, change, Estimate(0.0, -0.1, 0.1), 1.0)
    test = DefaultStateResult(((0, 0),), 3, (row,), row, "")
    anchor = replace(results[2], ablation=AblationResult(4.0, 4.1, test))
    learned = replace(results[2], ablation=AblationResult(4.0, 4.1, test, sink="learned"))
    rows = compare_audits([anchor, learned]).rows
    assert rows[0].all_sink_heads_loss_delta == pytest.approx(0.5)
    assert rows[1].all_sink_heads_loss_delta is None and rows[1].base_loss == 4.0  # another test: not the same column


def test_checkpoints_not_drawn_against_the_step_say_why(results):
    from sinkscope.pretrained_analysis.findings import comparison_findings

    renamed = [_as_revision(result, name) for result, name in zip(results, ["step0", "main", "step9"], strict=True)]
    assert any("no training step is known for main" in f for f in comparison_findings(compare_audits(renamed)))
    twice = [_as_revision(result, name) for result, name in zip(results, ["a", "b", "c"], strict=True)]
    shared = compare_audits(twice, steps={"a": 5, "b": 5, "c": 9})
    assert any("two checkpoints share step 5" in f for f in comparison_findings(shared))
