"""The command registry (``sinkscope.cli.commands``): every command the parser offers is one
entry, with what an interrupt leaves; and the one input rule, applied by the entry point to
every entry, refuses an ``--out`` over anything the command reads, before anything is
written. A new command without a case below fails ``test_every_command_has_a_case``."""

from __future__ import annotations

import argparse

import pytest

from fault_checks import one_line_exit_2, snapshot
from sinkscope.cli import demo
from sinkscope.cli.commands import COMMANDS, Command
from sinkscope.cli.parser import build_parser


def _leaf_commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> set[str]:
    """Every runnable command of ``parser``, as typed (``toy train``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set().union(*(_leaf_commands(sub, (*words, name)) for name, sub in action.choices.items()))
    return {" ".join(words)}


def test_every_command_the_parser_offers_is_registered_once():
    names = [command.name for command in COMMANDS]
    assert len(names) == len(set(names))
    assert set(names) == _leaf_commands(build_parser())


def test_a_command_without_its_inputs_or_interrupt_message_cannot_be_registered():
    from sinkscope.cli import report

    class NoPaths:
        __name__ = "sinkscope.cli.no_paths"
        add_parser = staticmethod(report.add_parser)
        run = staticmethod(report.run)

    with pytest.raises(TypeError, match="lacks paths"):
        Command(("no-paths",), NoPaths, "nothing was written")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="says nothing of what an interrupt leaves"):
        Command(("report",), report, " ")


def _training(command: list[str]) -> list[str]:
    """A training command whose TensorBoard log folder sits inside its output."""
    return [*command, "--tensorboard", "{out}/tensorboard"]


# command -> (argv with {out} for the output directory, the input it puts inside it)
CASES: dict[str, tuple[list[str], str]] = {
    "toy train": (_training(["toy", "train", "--out", "{out}"]), "tensorboard"),
    "toy reproduce": (_training(["toy", "reproduce", "--quick", "--out", "{out}", "--overwrite"]), "tensorboard"),
    "toy mitigations": (_training(["toy", "mitigations", "--quick", "--out", "{out}", "--overwrite"]), "tensorboard"),
    "toy sweep": (_training(["toy", "sweep", "--out", "{out}", "--overwrite"]), "tensorboard"),
    "toy probe": (["toy", "probe", "{out}/run", "--out", "{out}", "--overwrite"], "run"),
    "toy patch": (["toy", "patch", "{out}/run", "--out", "{out}", "--overwrite"], "run"),
    "toy tradeoff": (["toy", "tradeoff", "--run", "{out}/run", "--out", "{out}", "--overwrite"], "run"),
    "audit": (["audit", "{out}/model", "--out", "{out}", "--overwrite"], "model"),
    "report": (["report", "{out}/result", "--out", "{out}/result/pages"], "result"),
    "compare": (["compare", "{out}/a", "{out}/b", "--out", "{out}", "--overwrite"], "a"),
    "demo": (["demo", "--out", "{out}"], "minilm"),
    "window-test": (["window-test", "{out}/model", "--out", "{out}", "--overwrite"], "model"),
    "circuit": (["circuit", "{out}/model", "--out", "{out}", "--overwrite"], "model"),
}


def test_every_command_has_a_case():
    assert set(CASES) == {command.name for command in COMMANDS}


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_command_writes_over_its_own_input(name, tmp_path, monkeypatch, capsys):
    """Each command refuses, in one line and before its work, an ``--out`` that holds what
    it reads (``report``: an output inside the result it reports); nothing there changes."""
    argv, held = CASES[name]
    out = tmp_path / "out"
    for folder in (held, "b", "minilm", "smollm2", "result/pages"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    (out / held / "keep.txt").write_text("the user's", encoding="utf-8")
    monkeypatch.setattr(demo, "packaged_models", lambda: (out / "minilm", out / "smollm2"))
    before = snapshot(tmp_path)
    one_line_exit_2(capsys, [part.format(out=out) for part in argv], f"{held}, which")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "argv",
    [
        ["audit", "{model}", "--out", "{out}", "--overwrite"],
        ["window-test", "{model}", "--text", "{out}/book.txt", "--out", "{elsewhere}"],
        ["audit", "{model}", "--prompts", "{out}/prompts.txt", "--out", "{elsewhere}"],
    ],
    ids=["model-link-into-out", "text-file", "prompt-file"],
)
def test_inputs_are_found_through_links_and_files(argv, tmp_path, capsys):
    """A model given as a link whose target is inside ``--out``, and an ``--out`` inside a
    folder that a file input lies in, compared on real paths."""
    out = tmp_path / "out"
    (out / "model").mkdir(parents=True)
    (out / "book.txt").write_text("a book\n", encoding="utf-8")
    (out / "prompts.txt").write_text("a prompt\n", encoding="utf-8")
    model = tmp_path / "model-link"
    model.symlink_to(out / "model")
    elsewhere = out / "results"  # the output replaced would be a folder beside the input: fine
    before = snapshot(tmp_path)
    filled = [part.format(out=out, model=model, elsewhere=elsewhere) for part in argv]
    if "--out" in filled and filled[filled.index("--out") + 1] == str(elsewhere):
        filled[filled.index("--out") + 1] = str(out)  # the output is the folder holding the file
        filled.append("--overwrite")
    one_line_exit_2(capsys, filled, "this command's own input")
    assert snapshot(tmp_path) == before


def test_the_hub_cache_is_an_input_of_a_model_named_by_id(tmp_path, monkeypatch, capsys):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    (tmp_path / "hf" / "hub").mkdir(parents=True)
    one_line_exit_2(capsys, ["audit", "someone/model", "--out", str(tmp_path / "hf"), "--overwrite"], "hf/hub")


def test_the_compilers_cache_is_an_input_of_a_training_command(tmp_path, monkeypatch, capsys):
    (tmp_path / "out" / "inductor").mkdir(parents=True)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "out" / "inductor"))
    one_line_exit_2(capsys, ["toy", "train", "--out", str(tmp_path / "out")], "out/inductor")


def test_an_output_beside_the_inputs_still_runs_its_checks_past_the_rule(tmp_path, capsys):
    """The rule refuses only overlap: a command whose output is beside its input goes on
    to its own checks (here: the run is not a run directory)."""
    (tmp_path / "run").mkdir()
    code = __import__("sinkscope.cli", fromlist=["main"]).main(
        ["toy", "probe", str(tmp_path / "run"), "--out", str(tmp_path / "probe"), "--no-progress"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "own input" not in err, err


def test_each_interrupt_message_names_what_is_kept():
    assert all(command.interrupted.strip() for command in COMMANDS)
    by_name = {command.name: command.interrupted for command in COMMANDS}
    assert "--resume" in by_name["toy train"]
    assert "--resume" not in by_name["toy probe"]
