"""Everyday options: typed prompts (--prompt), a choice of layers (--layers) on audits and
toy probes, and a --help that explains every flag and every report kind."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from fault_checks import one_line_exit_2, snapshot
from sinkscope.cli import main
from sinkscope.cli.parser import build_parser
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2

SINK_HEAD = (2, 1)  # planted: the tiny model's one strong BOS sink, in its last layer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_gpt2(tmp_path_factory.mktemp("options") / "tiny-gpt2", n_layer=3, bos_sink_head=SINK_HEAD)


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> Path:
    from sinkscope.toy.model import ToyModelConfig
    from sinkscope.toy.run_dir import RunConfig, TrainConfig
    from sinkscope.toy.task import TaskConfig
    from sinkscope.toy.train import train

    run = tmp_path_factory.mktemp("toy") / "softmax-2x1"
    train(RunConfig(ToyModelConfig(n_layers=2), TaskConfig(), TrainConfig(max_steps=20)), run, progress=False)
    return run


def _audit(model_dir: Path, out: Path, *flags: str) -> list[str]:
    return ["audit", str(model_dir), "--max-len", "16", "--examples", "0", "--out", str(out), "--no-progress", *flags]


def test_typed_prompts_are_each_one_prompt(model_dir, tmp_path, capsys):
    typed = ["The cat sat on the mat.", "default", "prompts.txt"]  # never read as a source or a file
    argv = _audit(model_dir, tmp_path / "out", *[arg for text in typed for arg in ("--prompt", text)], "--json")
    assert main(argv) == 0
    prompts = json.loads(capsys.readouterr().out)["prompts"]
    assert prompts["n_prompts"] == 3 and prompts["location"] == "3 prompts typed with --prompt"
    assert prompts["spec"]["source"] == "texts"


def test_layers_restrict_the_probe_the_sink_heads_and_the_ablations(model_dir, tmp_path, capsys):
    from sinkscope.pretrained_analysis.audit import read_audit

    prompts = [arg for text in TINY_GPT2_PROMPTS[:4] for arg in ("--prompt", text)]
    assert main(_audit(model_dir, tmp_path / "all", *prompts, "--ablate")) == 0
    assert main(_audit(model_dir, tmp_path / "some", *prompts, "--ablate", "--layers", "0-1")) == 0
    every, some = read_audit(tmp_path / "all"), read_audit(tmp_path / "some")
    assert SINK_HEAD in every.sink_heads() and SINK_HEAD in every.ablation.default_state.sink_heads
    assert some.config.layers == (0, 1) and some.probe.config.layers == (0, 1)
    assert {row.layer for row in some.probe.heads} == {0, 1} and [row.layer for row in some.probe.layers] == [0, 1]
    assert all(layer < 2 for layer, _ in some.ablation.default_state.sink_heads)
    assert any("layers 0-1 of 3 probed" in note for note in some.notes)
    assert all(layer < 2 for row in some.ablation.default_state.rows for layer, _ in row.head_set)
    # the probed layers' numbers do not depend on which other layers were probed
    assert [row.anchor_mass for row in some.probe.heads] == pytest.approx(
        [row.anchor_mass for row in every.probe.heads if row.layer < 2]
    )
    capsys.readouterr()
    assert main(["report", str(tmp_path / "some"), "--no-progress"]) == 0
    assert "| layers probed | 0-1 |" in (tmp_path / "some" / "report.md").read_text()
    assert main(["report", str(tmp_path / "all"), "--no-progress"]) == 0
    assert "| layers probed | all |" in (tmp_path / "all" / "report.md").read_text()


def test_python_api_takes_prompt_strings_and_layers(model_dir):
    import sinkscope

    config = sinkscope.AuditConfig(layers=range(2, 3), n_examples=0)
    assert config.layers == (2,)
    result = sinkscope.audit(sinkscope.LoadSpec(str(model_dir)), TINY_GPT2_PROMPTS[:3], config, progress=False)
    assert result.prompts.n_prompts == 3 and result.sink_heads() == [SINK_HEAD]
    with pytest.raises(sinkscope.InputError, match="has 3 layers, numbered 0 to 2"):
        sinkscope.audit(sinkscope.LoadSpec(str(model_dir)), ["a b"], sinkscope.AuditConfig(layers=[5]), progress=False)
    with pytest.raises(sinkscope.InputError, match="not a file, default, random or a dataset id"):
        sinkscope.PromptSpec("The cat sat on the mat.")


def test_a_restricted_audit_claims_only_its_layers_and_draws_no_line_across_a_gap(model_dir, tmp_path):
    """Issue 32: an audit of layers 0 and 2 says which layers it probed, words its per-layer
    findings "among the probed layers", and its per-layer chart joins no points across layer 1."""
    import math

    import sinkscope
    from sinkscope.pretrained_analysis.findings import audit_findings
    from sinkscope.reports.plots import line_chart

    config = sinkscope.AuditConfig(layers=[0, 2], n_examples=0)
    result = sinkscope.audit(sinkscope.LoadSpec(str(model_dir)), TINY_GPT2_PROMPTS[:3], config, progress=False)
    findings = audit_findings(result)
    assert any(line.startswith("Only layers 0, 2 were probed (2 of 3)") for line in findings), findings
    assert any(line.startswith("Anchor mass") and "among the probed layers" in line for line in findings)
    every = sinkscope.audit(sinkscope.LoadSpec(str(model_dir)), TINY_GPT2_PROMPTS[:3], progress=False)
    assert not any("probed" in line for line in audit_findings(every))
    figure = line_chart(
        [0, 1, 2, 17, 18], [("mass", [0.1, 0.2, 0.3, 0.9, 0.8])], tmp_path / "c.png", "t", "x", "y", break_gaps=True
    )
    (line,) = figure.axes[0].lines
    assert [math.isnan(y) for y in line.get_ydata()] == [False, False, False, True, False, False]
    assert list(line.get_xdata())[3] == 9.5  # a gap point between layers 2 and 17, drawn as nothing


def test_an_audit_json_without_layers_reads_as_every_layer(model_dir, tmp_path):
    from sinkscope.pretrained_analysis.audit import read_audit

    assert main(_audit(model_dir, tmp_path / "out", "--prompt", "The cat sat on the mat.")) == 0
    path = tmp_path / "out" / "audit.json"
    data = json.loads(path.read_text())
    del data["config"]["layers"], data["probe"]["config"]["layers"]  # as written before --layers
    path.write_text(json.dumps(data))
    result = read_audit(tmp_path / "out")
    assert result.config.layers is None and result.probe.config.layers is None


def test_toy_probe_layers(toy_run, tmp_path, capsys):
    out = tmp_path / "probe"
    assert (
        main(
            [
                "toy",
                "probe",
                str(toy_run),
                "--out",
                str(out),
                "--sequences",
                "20",
                "--allow-unfinished",
                "--layers",
                "1",
            ]
        )
        == 0
    )
    probe = json.loads((out / "probe.json").read_text())
    assert probe["config"]["layers"] == [1]
    assert {row["layer"] for row in probe["heads"]} == {1} and [row["layer"] for row in probe["layers"]] == [1]
    capsys.readouterr()
    one_line_exit_2(
        capsys,
        ["toy", "probe", str(toy_run), "--out", str(tmp_path / "x"), "--allow-unfinished", "--layers", "2"],
        "has 2 layers, numbered 0 to 1",
    )
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "flags, fix",
    [
        (["--layers", "3-1"], "write it low to high, 1-3"),
        (["--layers", "x"], "expected layer indices such as 0,3,5 or 0-3"),
        (["--layers", "0,,1"], "remove the extra comma"),
        (["--layers", "99"], "has 3 layers, numbered 0 to 2; choose layers in that range (--layers)"),
        (["--prompt", ""], "type the prompt's text"),
        (["--prompt", "  "], "type the prompt's text"),
        (["--prompt", "a b", "--prompts", "default"], "pass one of them"),
        (["--prompts", "The cat sat on the mat."], "pass --prompt 'The cat sat on the mat.'"),
        (["--prompts", "no such folder/prompts"], "if it is a file, check its path"),
        (["--prompt", "a b", "--executor", "ray"], "pass --prompts FILE"),
    ],
)
def test_bad_everyday_options_are_one_line_and_write_nothing(model_dir, tmp_path, capsys, flags, fix):
    before = snapshot(tmp_path)
    one_line_exit_2(capsys, _audit(model_dir, tmp_path / "out", *flags), fix)
    assert snapshot(tmp_path) == before


def test_typed_prompts_with_several_models_name_the_file_route(model_dir, tmp_path, capsys):
    argv = ["audit", str(model_dir), str(model_dir), "--prompt", "a b", "--out", str(tmp_path / "out")]
    one_line_exit_2(capsys, argv, "put the prompts in a .txt file")
    assert not (tmp_path / "out").exists()


def _actions(parser: argparse.ArgumentParser, path: str):
    """Every (command path, action) of ``parser`` and its subcommands; each subcommand as an action too."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{path} {name}", argparse.Action([], name, help=helps.get(name))
                yield from _actions(sub, f"{path} {name}")
        else:
            yield path, action


def test_every_flag_and_command_has_help():
    missing = [
        f"{path} {'/'.join(action.option_strings) or action.dest}"
        for path, action in _actions(build_parser(), "sinkscope")
        if not (action.help or "").strip() or action.help == argparse.SUPPRESS
    ]
    assert missing == []


def test_report_help_names_every_kind_the_detector_knows(capsys):
    from sinkscope.reporting import REPORT_KINDS

    with pytest.raises(SystemExit):
        main(["report", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for kind in REPORT_KINDS:
        assert f"{kind.name} {' + '.join(kind.markers)}" in text, kind.name
