"""Inputs and outputs never overlap, in either direction, on real paths (issue 22, item 2);
``compare`` ships exactly the audits it describes, refuses special files and a single
directory (item 6); ``report --overwrite`` validates all three targets before writing
(item 10)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fault_checks import audit_argv, mounted_tmpfs, one_line_exit_2, snapshot
from sinkscope.cli import main
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> Path:
    from sinkscope.toy.model import ToyModelConfig
    from sinkscope.toy.run_dir import RunConfig, TrainConfig
    from sinkscope.toy.task import TaskConfig
    from sinkscope.toy.train import train

    run = tmp_path_factory.mktemp("toy") / "softmax-1x1"
    train(
        RunConfig(ToyModelConfig(), TaskConfig(), TrainConfig(max_steps=50, checkpoint_every=25)), run, progress=False
    )
    return run


@pytest.fixture(scope="module")
def audits(tmp_path_factory) -> dict[str, Path]:
    """Audits of three different tiny models on the same prompts: a, b and c."""
    root = tmp_path_factory.mktemp("audits")
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(TINY_GPT2_PROMPTS) + "\n", encoding="utf-8")
    found = {}
    for seed, name in enumerate("abc"):
        model = build_tiny_gpt2(root / f"model-{name}", seed=seed)
        assert main(audit_argv(model, prompts, root / f"audit-{name}")) == 0
        found[name] = root / f"audit-{name}"
    return found


@pytest.fixture(scope="module")
def probe_dir(toy_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("probe") / "probe"
    assert main(["toy", "probe", str(toy_run), "--out", str(out), "--sequences", "20", "--no-progress"]) == 0
    return out


def toy_argv(command: str, run: Path, out: Path) -> list[str]:
    return {
        "probe": ["toy", "probe", str(run), "--sequences", "20"],
        "patch": ["toy", "patch", str(run), "--inputs", "8"],
        "tradeoff": ["toy", "tradeoff", "--run", str(run)],
    }[command] + ["--out", str(out), "--overwrite", "--no-progress"]


@pytest.mark.parametrize("command", ["probe", "patch", "tradeoff"])
def test_an_out_inside_the_run_is_refused_even_through_a_link(toy_run, tmp_path, capsys, command):
    """`toy probe r/run3 --out r/run3/checkpoints --overwrite` deleted the run's checkpoints."""
    assert (toy_run / "checkpoints").is_dir()
    link = tmp_path / "link-to-run"
    link.symlink_to(toy_run)
    before = snapshot(toy_run)
    for out in (toy_run / "checkpoints", link / "checkpoints", toy_run / "new-folder"):
        one_line_exit_2(capsys, toy_argv(command, toy_run, out), "lies inside the run")
    assert snapshot(toy_run) == before


def test_the_commands_own_folder_in_the_run_stays_allowed(toy_run, capsys):
    out = toy_run / "patch"
    assert main(["toy", "patch", str(toy_run), "--inputs", "8", "--no-progress", "--out", str(out)]) == 0
    assert (out / "patching.json").is_file()
    capsys.readouterr()


def test_an_audit_out_inside_the_model_directory_is_refused(tmp_path, capsys):
    model = build_tiny_gpt2(tmp_path / "model")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(TINY_GPT2_PROMPTS) + "\n", encoding="utf-8")
    before = snapshot(model)
    capsys.readouterr()  # the model builder's progress bar
    one_line_exit_2(capsys, audit_argv(model, prompts, model / "audit"), "lies inside this command's own input")
    assert snapshot(model) == before


@pytest.mark.parametrize("command", ["window-test", "circuit"])
def test_a_model_commands_out_that_holds_its_text_prompts_or_model_is_refused(tmp_path, capsys, command):
    """`window-test MODEL --text OUT/book.txt --out OUT --overwrite` deleted book.txt, and
    with the model inside --out its weights: every path the command reads stays out of --out."""
    out = tmp_path / "out"
    model = build_tiny_gpt2(out / "model")
    text = out / "book.txt"
    text.write_text(" ".join(TINY_GPT2_PROMPTS * 40) + "\n", encoding="utf-8")
    capsys.readouterr()  # the model builder's progress bar
    before = snapshot(out)
    read_flag = "--text" if command == "window-test" else "--prompts"
    outside_model = build_tiny_gpt2(tmp_path / "elsewhere")
    capsys.readouterr()
    for model_arg in (model, outside_model):
        argv = [command, str(model_arg), read_flag, str(text), "--out", str(out), "--overwrite", "--no-progress"]
        one_line_exit_2(capsys, argv, f"{out} holds this command's own input")
    assert snapshot(out) == before


def test_a_compare_out_inside_an_audit_is_refused(audits, capsys):
    before = snapshot(audits["a"])
    argv = ["compare", str(audits["a"]), str(audits["b"]), "--out", str(audits["a"] / "cmp")]
    one_line_exit_2(capsys, argv, "lies inside an input to compare")
    assert snapshot(audits["a"]) == before


def test_a_report_whose_figure_folder_holds_the_result_is_refused(probe_dir, tmp_path, capsys):
    import shutil

    out = tmp_path / "out"
    result = out / "report_figures"
    shutil.copytree(probe_dir, result)
    before = snapshot(out)
    one_line_exit_2(capsys, ["report", str(result), "--out", str(out), "--overwrite"], "holds the result")
    assert snapshot(out) == before


def test_compare_of_a_single_audit_is_one_line(audits, tmp_path, capsys):
    one_line_exit_2(capsys, ["compare", str(audits["a"]), "--out", str(tmp_path / "cmp")], "at least two")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("special", ["fifo", "link"])
def test_compare_refuses_a_pipe_or_link_inside_an_audit(audits, tmp_path, capsys, special):
    import shutil

    audit = tmp_path / "audit-with-special"
    shutil.copytree(audits["b"], audit)
    if special == "fifo":
        os.mkfifo(audit / "notes.txt")
    else:
        (tmp_path / "private.txt").write_text("outside")
        (audit / "notes.txt").symlink_to(tmp_path / "private.txt")
    before = snapshot(tmp_path)
    argv = ["compare", str(audits["a"]), str(audit), "--out", str(tmp_path / "cmp")]
    one_line_exit_2(capsys, argv, "named pipe" if special == "fifo" else "symbolic link")
    assert snapshot(tmp_path) == before


def test_compare_describes_the_audits_it_ships_when_one_is_replaced_meanwhile(audits, tmp_path, monkeypatch):
    """An `audit --overwrite` lands on B after compare first read it (injected at that read):
    the comparison must still describe the copy it ships."""
    import shutil

    import sinkscope.pretrained_analysis.suite as suite

    sources = {name: tmp_path / f"in-{name}" for name in "ab"}
    for name, path in sources.items():
        shutil.copytree(audits[name], path)
    real_read = suite.read_audit
    landed = []

    def read_then_replace(directory):
        result = real_read(directory)
        if Path(directory) == sources["b"] and not landed:
            landed.append(True)  # as atomic_directory does: a whole new directory swapped in
            shutil.copytree(audits["c"], tmp_path / "incoming")
            os.rename(sources["b"], tmp_path / "gone")
            os.rename(tmp_path / "incoming", sources["b"])
        return result

    monkeypatch.setattr(suite, "read_audit", read_then_replace)
    out = tmp_path / "cmp"
    assert main(["compare", str(sources["a"]), str(sources["b"]), "--out", str(out), "--no-progress"]) == 0
    assert landed
    rows = json.loads((out / "comparison.json").read_text())["rows"]
    for row in rows:
        shipped = json.loads((out / row["directory"] / "audit.json").read_text())["model"]
        assert shipped["label"] == row["label"]
    assert [row["label"] for row in rows] == ["model-a", "model-c"]


def test_compare_refuses_an_audit_replaced_while_it_was_copied(audits, tmp_path, capsys, monkeypatch):
    import shutil

    import sinkscope.pretrained_analysis.gather as gather

    source = tmp_path / "in-b"
    shutil.copytree(audits["b"], source)
    real_copytree = shutil.copytree

    def swapped_midway(src, dst, **kwargs):
        if Path(src) == source:  # an `audit --overwrite` swaps a new directory in during the copy
            real_copytree(audits["c"], tmp_path / "incoming")
            os.rename(source, tmp_path / "gone")
            os.rename(tmp_path / "incoming", source)
        return real_copytree(src, dst, **kwargs)

    monkeypatch.setattr(gather.shutil, "copytree", swapped_midway)
    argv = ["compare", str(audits["a"]), str(source), "--out", str(tmp_path / "cmp")]
    one_line_exit_2(capsys, argv, "was replaced while it was being copied")
    assert not (tmp_path / "cmp").exists()


@pytest.mark.parametrize("kind", ["symlink", "file"])
def test_report_overwrite_replaces_a_figure_folder_that_is_a_link_or_a_file(probe_dir, tmp_path, capsys, kind):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(probe_dir, out)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.png").write_bytes(b"not yours")
    if kind == "symlink":
        (out / "report_figures").symlink_to(outside)
    else:
        (out / "report_figures").write_text("a file")
    before = snapshot(outside)
    assert main(["report", str(out), "--overwrite"]) == 0, capsys.readouterr().err
    assert snapshot(outside) == before
    folder = out / "report_figures"
    assert not folder.is_symlink() and (folder.is_dir() or not os.path.lexists(folder))
    assert (out / "report.html").is_file() and (out / "report.md").is_file()


def test_report_overwrite_onto_a_page_that_is_a_directory_changes_nothing(probe_dir, tmp_path, capsys):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(probe_dir, out)
    assert main(["report", str(out)]) == 0
    shutil.rmtree(out / "report.html") if (out / "report.html").is_dir() else (out / "report.html").unlink()
    (out / "report.html").mkdir()
    (out / "report.html" / "mine.txt").write_text("keep")
    before = snapshot(out)
    one_line_exit_2(capsys, ["report", str(out), "--overwrite"], "is a directory, not a report page")
    assert snapshot(out) == before


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 32 KiB tmpfs (a really full disk); skipped where this user cannot mount one."""
    with mounted_tmpfs(tmp_path / "small", "32k") as mount_point:
        yield mount_point


def test_a_really_full_disk_is_one_line_and_leaves_nothing(probe_dir, toy_run, small_tmpfs, capsys):
    for argv in (
        ["report", str(probe_dir), "--out", str(small_tmpfs / "report")],
        ["toy", "probe", str(toy_run), "--sequences", "20", "--no-progress", "--out", str(small_tmpfs / "probe")],
    ):
        one_line_exit_2(capsys, argv, "free space on its device or choose another output location")
        assert list(small_tmpfs.iterdir()) == []


def test_a_full_disk_is_one_line_and_the_old_result_is_kept(audits, tmp_path, capsys, monkeypatch):
    """ENOSPC injected (any user can run this): while compare copies audits, and while training
    saves a checkpoint (safetensors reports it only in words)."""
    import shutil

    from safetensors import SafetensorError

    out = tmp_path / "cmp"
    assert main(["compare", str(audits["a"]), str(audits["b"]), "--out", str(out)]) == 0
    before = snapshot(tmp_path)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil, "copyfile", full)
    argv = ["compare", str(audits["a"]), str(audits["b"]), "--out", str(out), "--overwrite"]
    one_line_exit_2(capsys, argv, "free space on its device or choose another output location")
    assert snapshot(tmp_path) == before

    def words(*args, **kwargs):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, message: "No space left on device" })')

    monkeypatch.setattr("sinkscope.toy.checkpoint.save_file", words)
    argv = ["toy", "train", "--max-steps", "5", "--checkpoint-every", "5", "--out", str(tmp_path / "run")]
    one_line_exit_2(capsys, argv + ["--no-progress"], "free space on its device")


def test_a_full_disk_in_a_sweeps_units_is_one_line(tmp_path, capsys, monkeypatch):
    """The units' ENOSPC reaches the command only as their messages: still one line, no traceback."""
    from safetensors import SafetensorError

    def words(*args, **kwargs):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, message: "No space left on device" })')

    monkeypatch.setattr("sinkscope.toy.checkpoint.save_file", words)
    argv = ["toy", "sweep", "--d-model", "8", "--attention", "softmax", "--seeds", "1", "--max-steps", "2"]
    argv += ["--sequences", "8", "--workers", "1", "--no-progress", "--out", str(tmp_path / "sweep")]
    one_line_exit_2(capsys, argv, "free space on its device")


def test_a_read_only_location_is_one_line(toy_run, tmp_path, capsys, monkeypatch):
    real_mkdir = os.mkdir

    def read_only(path, *args, **kwargs):
        if Path(path).parent == tmp_path:
            raise OSError(30, "Read-only file system", str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", read_only)
    argv = ["toy", "probe", str(toy_run), "--sequences", "20", "--no-progress", "--out", str(tmp_path / "p")]
    one_line_exit_2(capsys, argv, "Read-only file system")
    assert list(tmp_path.iterdir()) == []


def _probe_process(toy_run: Path, out: Path, stdout) -> tuple[int, str]:
    import subprocess
    import sys

    argv = [sys.executable, "-m", "sinkscope", "toy", "probe", str(toy_run), "--sequences", "20", "--no-progress"]
    process = subprocess.Popen([*argv, "--out", str(out), "--json"], stdout=stdout, stderr=subprocess.PIPE)
    if stdout is subprocess.PIPE:
        process.stdout.close()  # the reader is gone before anything is printed (`| head -c 0`)
    stderr = process.stderr.read().decode()
    return process.wait(timeout=300), stderr


def test_json_to_a_full_file_is_one_line(toy_run, tmp_path):
    with open("/dev/full", "w") as full:
        code, stderr = _probe_process(toy_run, tmp_path / "p", full)
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr, stderr
    assert "no space left writing standard output" in stderr


def test_a_closed_pipe_ends_quietly(toy_run, tmp_path):
    import subprocess

    code, stderr = _probe_process(toy_run, tmp_path / "p", subprocess.PIPE)
    assert code == 1 and stderr == "", stderr
    assert (tmp_path / "p" / "probe.json").is_file()  # the result itself is complete


def test_a_full_temporary_directory_is_named_as_tmpdir_not_the_output(probe_dir, tmp_path, capsys, monkeypatch):
    """A report's figures are drawn in the temporary directory first: ENOSPC there names
    TMPDIR and its fix, never the output's disk; the output's own ENOSPC still names the output."""
    import tempfile

    temporary = tmp_path / "tmpdir"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    monkeypatch.setattr(tempfile, "tempdir", None)  # Python caches the first answer

    def full_at(where: Path):
        def write(*args, **kwargs):
            raise OSError(28, "No space left on device", str(where))

        return write

    monkeypatch.setattr("sinkscope.reporting.write_report", full_at(temporary / "sinkscope-report-1" / "fig.png"))
    one_line_exit_2(capsys, ["report", str(probe_dir), "--out", str(tmp_path / "pages")], "point TMPDIR at a directory")
    monkeypatch.setattr("sinkscope.reporting.write_report", full_at(tmp_path / "pages" / "report.html"))
    one_line_exit_2(
        capsys, ["report", str(probe_dir), "--out", str(tmp_path / "pages")], "choose another output location"
    )


@pytest.mark.parametrize("setting", ["a-file", "missing"])
def test_an_unusable_tmpdir_is_one_line_naming_it(setting, tmp_path, capsys, monkeypatch):
    (tmp_path / "a-file").write_text("not a directory")
    monkeypatch.setenv("TMPDIR", str(tmp_path / setting))
    one_line_exit_2(capsys, ["toy", "train", "--out", str(tmp_path / "run")], f"TMPDIR={tmp_path / setting} is not")
    assert not (tmp_path / "run").exists()
