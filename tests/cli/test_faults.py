"""Fault injection on output directories: whatever the user points ``--out`` at, nothing
existing is lost, moved or re-moded; refusals are one line on stderr with exit 2 and no
traceback. (Issue 11; the cases covered so far are listed in each test's name.)"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from fault_checks import audit_argv, one_line_exit_2, snapshot  # noqa: F401  (re-exported for older imports)
from sinkscope.cli import main
from sinkscope.infra.atomic_io import OutputError, atomic_directory
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_gpt2(tmp_path_factory.mktemp("faults") / "tiny-gpt2")


@pytest.fixture
def prompts(tmp_path) -> Path:
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(TINY_GPT2_PROMPTS) + "\n", encoding="utf-8")
    return path


def test_a_sibling_named_like_the_old_trash_survives(model_dir, prompts, tmp_path):
    (tmp_path / "x" / "out").mkdir(parents=True)
    (tmp_path / "x" / ".out.old").mkdir()
    (tmp_path / "x" / ".out.old" / "backup.txt").write_text("b")
    before = snapshot(tmp_path / "x" / ".out.old")
    assert main(audit_argv(model_dir, prompts, tmp_path / "x" / "out")) == 0
    assert main(audit_argv(model_dir, prompts, tmp_path / "x" / "out", "--overwrite")) == 0
    assert snapshot(tmp_path / "x" / ".out.old") == before
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == [".out.old", "out"]  # no temporary left


def test_a_symlinked_out_is_followed_and_the_link_stays(model_dir, prompts, tmp_path, capsys):
    """Issue 22 (was: refused): results go into the link's target, the link stays, and
    --overwrite replaces the target, never the link."""
    target = tmp_path / "target"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    assert main(audit_argv(model_dir, prompts, link)) == 0
    assert link.is_symlink() and os.readlink(link) == str(target) and (target / "audit.json").is_file()
    assert main(audit_argv(model_dir, prompts, link, "--overwrite")) == 0
    assert link.is_symlink() and os.readlink(link) == str(target) and (target / "audit.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "prompts.txt", "target"]  # no temporary left


def test_an_empty_out_keeps_its_mode(model_dir, prompts, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o750)
    assert main(audit_argv(model_dir, prompts, out)) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o750 and (out / "audit.json").is_file()
    out.chmod(0o705)
    assert main(audit_argv(model_dir, prompts, out, "--overwrite")) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o705


def test_overwrite_refuses_an_out_that_holds_the_inputs(model_dir, tmp_path, capsys):
    copy = tmp_path / "model"
    copy.mkdir()
    for child in model_dir.iterdir():
        (copy / child.name).write_bytes(child.read_bytes())
    prompts = copy / "prompts.txt"
    prompts.write_text("\n".join(TINY_GPT2_PROMPTS) + "\n", encoding="utf-8")
    before = snapshot(copy)
    one_line_exit_2(capsys, audit_argv(copy, prompts, copy, "--overwrite"), "holds this command's own input")
    one_line_exit_2(capsys, audit_argv(model_dir, prompts, tmp_path, "--overwrite"), "holds this command's own input")
    assert snapshot(copy) == before


def test_a_regular_file_as_out_is_refused(model_dir, prompts, tmp_path, capsys):
    out = tmp_path / "result"
    out.write_text("keep me")
    one_line_exit_2(capsys, audit_argv(model_dir, prompts, out, "--overwrite"), "is not a directory")
    assert out.read_text() == "keep me"


def test_two_writers_on_one_out_exactly_one_wins(tmp_path):
    """The second writer's check passed before the first landed (as with two audits started
    together): at the final rename it finds the first one's result, keeps it and refuses."""
    out = tmp_path / "out"
    with pytest.raises(OutputError, match="filled by another run"):
        with atomic_directory(out, replace=False) as tmp:
            (tmp / "mine.txt").write_text("second")
            with atomic_directory(out, replace=False) as other:
                (other / "theirs.txt").write_text("first")
    assert [p.name for p in out.iterdir()] == ["theirs.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # both temporaries gone


def test_a_mount_point_is_refused_before_any_work(model_dir, prompts, tmp_path, capsys, monkeypatch):
    out = tmp_path / "mnt"
    out.mkdir()
    real_ismount = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda path: Path(path) == out or real_ismount(path))
    one_line_exit_2(capsys, audit_argv(model_dir, prompts, out), "is a mount point")


def test_cuda_on_a_machine_without_it_is_one_line(model_dir, prompts, tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the refusal is for machines without it")
    one_line_exit_2(
        capsys,
        audit_argv(model_dir, prompts, tmp_path / "out", "--device", "cuda"),
        "use device cpu or auto (--device)",
    )
    assert not (tmp_path / "out").exists()


def test_an_unknown_device_is_one_line(model_dir, prompts, tmp_path, capsys):
    one_line_exit_2(capsys, audit_argv(model_dir, prompts, tmp_path / "out", "--device", "banana"), "unknown device")
    assert not (tmp_path / "out").exists()


def test_the_current_directory_or_a_run_is_not_an_out(model_dir, prompts, toy_run, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("k")
    for out in (".", ".."):
        one_line_exit_2(capsys, audit_argv(model_dir, prompts, Path(out), "--overwrite"), "is the current directory")
    assert (tmp_path / "keep.txt").read_text() == "k"
    before = snapshot(toy_run)
    for target in (toy_run, toy_run.parent):
        one_line_exit_2(capsys, ["toy", "probe", str(toy_run), "--out", str(target), "--overwrite"], "holds the run")
    assert snapshot(toy_run) == before


def test_an_unwritable_parent_is_one_line(model_dir, prompts, tmp_path, capsys, monkeypatch):
    """EACCES where the temporary directory is made (what a 0555 parent or a read-only
    filesystem gives an ordinary user; injected, since CI runs as root)."""
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    one_line_exit_2(capsys, audit_argv(model_dir, prompts, tmp_path / "out"), "choose a writable output location")
    assert not (tmp_path / "out").exists()


def test_a_full_disk_where_the_temporary_is_made_is_named_as_full(model_dir, prompts, tmp_path, capsys, monkeypatch):
    """ENOSPC making the temporary beside the output (what a real full disk gave toy train's
    checkpoints/ in the fault-injection suite) was "choose a writable output location"."""
    import errno
    import tempfile

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "mkdtemp", full)
    one_line_exit_2(capsys, audit_argv(model_dir, prompts, tmp_path / "out"), "free space on its device")
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> Path:
    from sinkscope.toy.model import ToyModelConfig
    from sinkscope.toy.run_dir import RunConfig, TrainConfig
    from sinkscope.toy.task import TaskConfig
    from sinkscope.toy.train import train

    run = tmp_path_factory.mktemp("toy") / "softmax-1x1"
    train(RunConfig(ToyModelConfig(), TaskConfig(), TrainConfig(max_steps=50)), run, progress=False)
    return run


@pytest.mark.parametrize("command, flags", [("probe", ["--sequences", "20"]), ("patch", ["--inputs", "8"])])
def test_toy_overwrite_keeps_the_old_result_until_the_new_one_is_complete(
    toy_run, tmp_path, monkeypatch, command, flags
):
    """An interrupt while the new result is being written (injected at its last figure)
    leaves the old result exactly as it was, and no temporary behind."""
    import sinkscope.reports.plots

    out = tmp_path / command
    assert main(["toy", command, str(toy_run), "--out", str(out), "--no-progress", *flags]) == 0
    before = snapshot(out)
    name = "draw_head_maps" if command == "probe" else "heatmap"
    module = __import__("sinkscope.toy.probe_run" if command == "probe" else "sinkscope.toy.patching", fromlist=[name])
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return getattr(sinkscope.reports.plots, name)(*args, **kwargs)

    monkeypatch.setattr(module, name, interrupted)
    assert main(["toy", command, str(toy_run), "--out", str(out), "--no-progress", "--overwrite", *flags]) == 1
    assert snapshot(out) == before
    assert [p.name for p in tmp_path.iterdir()] == [command]


def test_argparse_errors_are_one_line_naming_help(capsys):
    one_line_exit_2(capsys, ["toy", "train", "--layers", "x", "--out", "unused"], "see sinkscope toy train --help")
    one_line_exit_2(capsys, ["audit"], "see sinkscope audit --help")


@pytest.mark.parametrize(
    "content, fix",
    [
        ("[1, 2]", "not a JSON object"),
        ("{}", "lacks the field 'model'; regenerate it with sinkscope audit"),
        (
            '{"schema": "audit", "schema_version": 99}',
            "schema version 99; this sinkscope reads version 1 to 2; upgrade",
        ),
        ('{"schema": "probe", "schema_version": 1}', "is a 'probe' file, not 'audit'"),
    ],
)
def test_report_on_a_malformed_audit_json_is_one_line(model_dir, prompts, tmp_path, capsys, content, fix):
    out = tmp_path / "audit"
    assert main(audit_argv(model_dir, prompts, out)) == 0
    (out / "audit.json").write_text(content)
    before = snapshot(out)
    one_line_exit_2(capsys, ["report", str(out), "--no-progress"], fix)
    assert snapshot(out) == before


def test_a_truncated_newest_checkpoint_resumes_from_the_previous_one(tmp_path, capsys):
    """Final weights equal an uninterrupted run's, bit for bit, and the fallback is said."""
    from sinkscope.toy.checkpoint import load_tensors
    from sinkscope.toy.model import ToyModelConfig
    from sinkscope.toy.run_dir import FINAL_WEIGHTS, RunConfig, TrainConfig, checkpoint_dirs
    from sinkscope.toy.task import TaskConfig
    from sinkscope.toy.train import train

    def config(max_steps: int) -> RunConfig:
        return RunConfig(
            ToyModelConfig(),
            TaskConfig(),
            TrainConfig(max_steps=max_steps, checkpoint_every=40, stop_linf=1e-12, log_every=20),
        )

    train(config(200), tmp_path / "straight", progress=False)
    run = tmp_path / "interrupted"
    train(config(160), run, progress=False)  # checkpoints at 120 and 160 are kept
    newest = checkpoint_dirs(run)[-1]
    assert newest.name.endswith("160")
    weights = newest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    capsys.readouterr()
    result = train(config(200), run, progress=False)
    assert result.resumed_from_step == 120
    err = capsys.readouterr().err
    assert "step-00000160" in err and "unreadable" in err
    assert (run / "checkpoints" / "unreadable-step-00000160").is_dir()  # kept, but no longer taken for a checkpoint
    straight, resumed = load_tensors(tmp_path / "straight" / FINAL_WEIGHTS), load_tensors(run / FINAL_WEIGHTS)
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[name], resumed[name]) for name in straight)


def test_probe_and_patch_refuse_an_unfinished_run_unless_allowed(toy_run, tmp_path, capsys):
    import json
    import shutil

    from sinkscope.toy.run_dir import RESULT_FILE

    run = tmp_path / "run"
    shutil.copytree(toy_run, run)
    (run / RESULT_FILE).unlink()  # as after an interrupt: checkpoints only
    for command, flags in (("probe", ["--sequences", "20"]), ("patch", ["--inputs", "8"])):
        out = tmp_path / f"{command}-out"
        one_line_exit_2(capsys, ["toy", command, str(run), "--out", str(out), *flags], "--allow-unfinished")
        assert not out.exists()
    assert (
        main(
            [
                "toy",
                "probe",
                str(run),
                "--out",
                str(tmp_path / "p"),
                "--sequences",
                "20",
                "--allow-unfinished",
                "--json",
            ]
        )
        == 0
    )
    notes = json.loads((tmp_path / "p" / "probe.json").read_text())["notes"]
    assert any("has not finished training" in note for note in notes)
    diverged = json.loads((toy_run / RESULT_FILE).read_text()) | {"status": "diverged"}
    (run / RESULT_FILE).write_text(json.dumps(diverged))
    one_line_exit_2(capsys, ["toy", "probe", str(run), "--out", str(tmp_path / "d")], "diverged")


def test_a_run_config_that_is_not_an_object_is_one_line(toy_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(toy_run, run)
    (run / "config.json").write_text("[1, 2, 3]")
    one_line_exit_2(capsys, ["toy", "probe", str(run), "--out", str(tmp_path / "p")], "is not a run_config file")


def test_a_comparison_report_reads_nothing_outside_its_directory(model_dir, prompts, tmp_path, capsys):
    import json

    out = tmp_path / "comparison"
    assert main(audit_argv(model_dir, prompts, out) + ["--revision", "main"]) == 2  # a local dir takes no revision
    capsys.readouterr()
    second = tmp_path / "second"
    second.mkdir()
    for child in model_dir.iterdir():
        (second / child.name).write_bytes(child.read_bytes())
    assert (
        main(
            [
                "audit",
                str(model_dir),
                str(second),
                "--prompts",
                str(prompts),
                "--max-len",
                "16",
                "--examples",
                "0",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    data = json.loads((out / "comparison.json").read_text())
    data["rows"][0]["directory"] = "../../"
    (out / "comparison.json").write_text(json.dumps(data))
    one_line_exit_2(capsys, ["report", str(out), "--no-progress"], "outside")
    assert not (out / "report.html").exists()


@pytest.mark.parametrize(
    "name, content, fix",
    [
        ("utf16.txt", "one prompt\n".encode("utf-16"), "save it as UTF-8"),
        ("latin1.txt", "caf\xe9 au lait\n".encode("latin-1"), "save it as UTF-8"),
        ("nul.txt", b"\x00\x00\x00\n", "binary, not text"),
        ("broken.parquet", b"PAR1 this is not a parquet file\n\n\nat all", "intact file"),
    ],
)
def test_unreadable_prompt_files_are_one_line(model_dir, tmp_path, capsys, name, content, fix):
    path = tmp_path / name
    path.write_bytes(content)
    one_line_exit_2(capsys, audit_argv(model_dir, path, tmp_path / "out"), fix)
    assert not (tmp_path / "out").exists()


def test_prompt_sources_that_are_not_files_name_the_fix(model_dir, tmp_path, capsys):
    one_line_exit_2(capsys, audit_argv(model_dir, tmp_path, tmp_path / "out"), "is a directory")
    one_line_exit_2(
        capsys, audit_argv(model_dir, tmp_path / "x.bin", tmp_path / "out"), "prompt file"
    )  # not a dataset id


def test_resume_refuses_a_config_whose_lr_was_edited(toy_run, tmp_path, capsys):
    import json
    import shutil

    from sinkscope.toy.run_dir import RESULT_FILE

    run = tmp_path / "run"
    shutil.copytree(toy_run, run)
    (run / RESULT_FILE).unlink()  # an interrupted run
    (run / "model.safetensors").unlink()
    config = json.loads((run / "config.json").read_text())
    config["train"]["lr"] = 0.005
    (run / "config.json").write_text(json.dumps(config))
    before = snapshot(run)
    one_line_exit_2(
        capsys,
        ["toy", "train", "--out", str(run), "--resume", "--lr", "0.005", "--max-steps", "50", "--no-progress"],
        "put the lr back in config.json",
    )
    assert snapshot(run) == before


def test_report_out_that_is_a_file_is_one_line(model_dir, prompts, tmp_path, capsys):
    out = tmp_path / "audit"
    assert main(audit_argv(model_dir, prompts, out)) == 0
    target = tmp_path / "report-file"
    target.write_text("keep")
    one_line_exit_2(capsys, ["report", str(out), "--out", str(target)], "is a file, not a directory")
    assert target.read_text() == "keep"


def test_sigterm_ends_a_run_like_ctrl_c_leaving_no_temporaries(tmp_path):
    """A real ``sinkscope toy train`` process killed with SIGTERM mid-run: exit 1 with the
    interrupt line, no traceback, and no hidden temporary directory or file left behind."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sinkscope.cli",
            "toy",
            "train",
            "--out",
            str(out),
            "--layers",
            "2",
            "--heads",
            "2",
            "--max-steps",
            "1000000",
            "--checkpoint-every",
            "50",
            "--no-progress",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not list(out.glob("checkpoints/step-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1, err
    assert "interrupted" in err and "Traceback" not in err
    hidden = [str(path) for path in out.rglob(".*")]
    assert hidden == [], hidden
    assert list(out.glob("checkpoints/step-*"))  # finished checkpoints are kept


def _tiny_sweep_argv(out: Path, max_steps: int, *extra: str) -> list[str]:
    """A one-configuration sweep of a few steps (one worker)."""
    return [
        "toy",
        "sweep",
        "--seq-len",
        "8",
        "--d-model",
        "8",
        "--seeds",
        "1",
        "--max-steps",
        str(max_steps),
        "--workers",
        "1",
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]


def _tiny_reproduce_argv(out: Path, max_steps: int, *extra: str) -> list[str]:
    """The --quick reproduction cut to a few steps per model (six models, one worker)."""
    return [
        "toy",
        "reproduce",
        "--quick",
        "--max-steps",
        str(max_steps),
        "--sequences",
        "16",
        "--workers",
        "1",
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]


@pytest.mark.parametrize("command", ["audit", "probe", "patch", "tradeoff", "train", "reproduce", "sweep", "report"])
def test_a_second_writer_on_a_locked_out_is_refused(model_dir, prompts, toy_run, tmp_path, capsys, command):
    """Another run holds ``--out`` (its lock, as a running sinkscope process holds it):
    this one exits 2 at once, one line, and ``--out`` is untouched."""
    from sinkscope.infra.atomic_io import locked_directory

    out = tmp_path / "out"
    out.mkdir()
    argv = {
        "audit": audit_argv(model_dir, prompts, out, "--overwrite"),
        "probe": ["toy", "probe", str(toy_run), "--out", str(out), "--sequences", "20", "--overwrite"],
        "patch": ["toy", "patch", str(toy_run), "--out", str(out), "--inputs", "8", "--overwrite"],
        "tradeoff": ["toy", "tradeoff", "--run", str(toy_run), "--out", str(out), "--overwrite"],
        "train": ["toy", "train", "--out", str(out), "--max-steps", "5", "--no-progress", "--resume"],
        "reproduce": _tiny_reproduce_argv(out, 5, "--overwrite"),
        "sweep": _tiny_sweep_argv(out, 5, "--overwrite"),
        "report": ["report", str(toy_run / "probe"), "--out", str(out), "--overwrite"],
    }[command]
    if command == "report" and not (toy_run / "probe").exists():
        assert main(["toy", "probe", str(toy_run), "--sequences", "20", "--no-progress"]) == 0
    (out / "theirs.txt").write_text("being written")
    before = snapshot(out)
    with locked_directory(out):
        one_line_exit_2(capsys, argv, "is being written by another sinkscope run")
    assert snapshot(out) == before
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left beside it


def test_two_audit_processes_on_one_out_exactly_one_wins(model_dir, prompts, tmp_path):
    """Two real ``sinkscope audit`` processes started together on one new ``--out``."""
    import subprocess
    import sys

    out = tmp_path / "out"
    argv = [sys.executable, "-m", "sinkscope.cli", *audit_argv(model_dir, prompts, out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    processes = [
        subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)
    ]
    outcomes = sorted((process.wait(timeout=300), process.stderr.read()) for process in processes)
    assert [code for code, _ in outcomes] == [0, 2], outcomes
    loser = outcomes[1][1].strip()
    assert len(loser.splitlines()) == 1 and "Traceback" not in loser, loser
    assert "another sinkscope run" in loser or "exists and is not empty" in loser, loser
    assert (out / "audit.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "prompts.txt"]


def test_two_toy_trainers_on_one_out_exactly_one_wins(tmp_path):
    """Two real ``sinkscope toy train`` processes on one ``--out``: one trains, the other
    exits 2 with one line; metrics.jsonl holds each step once."""
    import json
    import subprocess
    import sys

    out = tmp_path / "run"
    argv = [
        sys.executable,
        "-m",
        "sinkscope.cli",
        "toy",
        "train",
        "--out",
        str(out),
        "--max-steps",
        "400",
        "--no-progress",
        "--resume",
    ]
    processes = [subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outcomes = sorted((process.wait(timeout=300), process.stderr.read()) for process in processes)
    if [code for code, _ in outcomes] == [0, 0]:
        pytest.fail(f"both trainers succeeded: {outcomes}")
    # the second either met the lock, or started after the first finished and found the
    # finished run (a --resume of a finished run returns it: exit 0 without training)
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == len(set(steps)) and steps == sorted(steps)
    loser = outcomes[-1][1].strip()
    assert outcomes[-1][0] == 2 and len(loser.splitlines()) == 1 and "another sinkscope run" in loser, outcomes


def test_audit_overwrite_interrupted_keeps_the_old_result(model_dir, prompts, tmp_path, monkeypatch):
    """Ctrl-C while the new audit is being written (at its heads.csv, after the figures):
    the old result stays exactly as it was; without the interrupt the new one replaces it."""
    import sinkscope.pretrained_analysis.audit as audit_module

    out = tmp_path / "out"
    assert main(audit_argv(model_dir, prompts, out)) == 0
    before = snapshot(out)

    class Interrupted:
        def __init__(self, probe):
            self.probe = probe

        def __getattr__(self, name):
            if name == "write_heads_csv":
                raise KeyboardInterrupt
            return getattr(self.probe, name)

    real_write_audit = audit_module.write_audit

    def interrupted_write_audit(result, directory):
        from dataclasses import replace

        return real_write_audit(replace(result, probe=Interrupted(result.probe)), directory)

    monkeypatch.setattr(audit_module, "write_audit", interrupted_write_audit)
    assert main(audit_argv(model_dir, prompts, out, "--overwrite", "--seed", "1")) == 1
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "prompts.txt"]
    monkeypatch.setattr(audit_module, "write_audit", real_write_audit)
    assert main(audit_argv(model_dir, prompts, out, "--overwrite", "--batch-size", "2")) == 0
    assert snapshot(out) != before and (out / "audit.json").is_file()


def test_reproduce_overwrite_keeps_the_old_result_until_the_new_one_is_complete(tmp_path, monkeypatch):
    """``toy reproduce --quick --overwrite`` over an older reproduction with other settings:
    Ctrl-C late in the new run (at the trade-off, after every model trained) leaves the old
    result exactly as it was and nothing beside it; the uninterrupted run replaces it whole,
    and the run directories it records are the final ones, not the staging name."""
    import json

    import sinkscope.toy.reproduce as reproduce_module

    out = tmp_path / "toy"
    assert main(_tiny_reproduce_argv(out, 3)) == 0
    before = snapshot(out)
    real = reproduce_module.write_tradeoff

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(reproduce_module, "write_tradeoff", interrupted)
    assert main(_tiny_reproduce_argv(out, 4, "--overwrite")) == 1
    assert snapshot(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["toy"]
    monkeypatch.setattr(reproduce_module, "write_tradeoff", real)
    assert main(_tiny_reproduce_argv(out, 4, "--overwrite")) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["toy"]
    assert json.loads((out / "reproduce.json").read_text())["max_steps"] == 4
    for result_file in out.glob("*/result.json"):
        assert json.loads(result_file.read_text())["run_dir"] == str(out / result_file.parent.name)
    assert ".tmp" not in "".join(p.read_text() for p in out.rglob("*.json"))


def test_an_interrupt_checkpoints_the_current_step_and_resume_is_bitwise(tmp_path):
    """SIGINT to a real ``sinkscope toy train`` between checkpoints: the run checkpoints
    the step it stopped at (no finished step lost), and ``--resume`` ends with the same
    weights as a run never interrupted."""
    import json
    import signal
    import subprocess
    import sys
    import time

    from sinkscope.toy.checkpoint import load_tensors
    from sinkscope.toy.run_dir import FINAL_WEIGHTS, checkpoint_dirs

    argv = ["toy", "train", "--max-steps", "2500", "--checkpoint-every", "100000", "--no-progress"]
    run = tmp_path / "interrupted"
    process = subprocess.Popen(
        [sys.executable, "-m", "sinkscope.cli", *argv, "--out", str(run)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        metrics = run / "metrics.jsonl"
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:  # steps 0, 100, 200 logged
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1 and "interrupted" in err and "Traceback" not in err, err
    steps = [int(path.name.split("-")[1]) for path in checkpoint_dirs(run)]
    assert len(steps) == 2 and steps[0] == 0 and steps[1] >= 200, steps  # step 0, and where it stopped
    logged = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert not (run / FINAL_WEIGHTS).exists()
    assert main([*argv, "--out", str(run), "--resume"]) == 0
    assert main([*argv, "--out", str(tmp_path / "straight")]) == 0
    resumed, straight = load_tensors(run / FINAL_WEIGHTS), load_tensors(tmp_path / "straight" / FINAL_WEIGHTS)
    assert all(torch.equal(resumed[name], straight[name]) for name in straight)
    assert logged[-1] < steps[1] + 100


def test_metrics_with_a_nan_are_standard_json(tmp_path):
    import json

    from sinkscope.toy.run_dir import METRICS_FILE, append_metrics, read_metrics

    append_metrics(tmp_path, {"step": 0, "loss": float("nan"), "anchor_mass_trigger": [[float("inf"), 0.5]]})
    line = (tmp_path / METRICS_FILE).read_text()
    json.loads(line, parse_constant=lambda name: pytest.fail(f"bare {name} in {line}"))
    assert read_metrics(tmp_path) == [{"step": 0, "loss": None, "anchor_mass_trigger": [[None, 0.5]]}]


@pytest.mark.parametrize(
    "argv, fix",
    [
        (["toy", "train", "--out", "x", "--layers", "0"], "--layers: must be an integer in [1, 2**63 - 1], got 0"),
        (["toy", "train", "--out", "x", "--lr", "-1"], "--lr: must be a finite number > 0"),
        (["toy", "reproduce", "--out", "x", "--seeds", "0"], "--seeds: must be an integer in [1, 1000]"),
        (["toy", "probe", "run", "--sequences", "0"], "--sequences: must be an integer in [1, 1000000]"),
        (["toy", "patch", "run", "--inputs", "-3"], "--inputs: must be an integer in [1, 1000000]"),
        (["toy", "sweep", "--out", "x", "--d-model", "8,0"], "each item must be an integer in [1, 2**63 - 1]"),
        (["audit", "gpt2", "--batch-size", "0"], "--batch-size: must be an integer in [1, 2**63 - 1]"),
        (["audit", "gpt2", "--sink-eps", "1.5"], "--sink-eps: must be a number in [0, 1)"),
        (["audit", "gpt2", "--max-len", "1"], "--max-len: must be an integer in [2, 1048576]"),
    ],
)
def test_bad_counts_are_one_line_before_torch_loads(tmp_path, argv, fix):
    """Checked while parsing: one line naming --help, exit 2, and torch never imported
    (about 8 s saved on every typo)."""
    import subprocess
    import sys

    probe = (
        "import sys\nfrom sinkscope.cli import main\ntry:\n    code = main(sys.argv[1:])\n"
        "except SystemExit as exit_:\n    code = exit_.code\nprint('torch' in sys.modules)\nsys.exit(code)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and fix in err and "--help" in err, err
    assert done.stdout.strip() == "False"
    assert list(tmp_path.iterdir()) == []


def _toy_argv(command: str, toy_run: Path, out: Path) -> list[str]:
    return {
        "train": ["toy", "train", "--out", str(out), "--max-steps", "5", "--no-progress"],
        "train --resume": ["toy", "train", "--out", str(out), "--max-steps", "5", "--no-progress", "--resume"],
        "reproduce": _tiny_reproduce_argv(out, 3),
        "sweep": _tiny_sweep_argv(out, 3),
        "probe": ["toy", "probe", str(toy_run), "--out", str(out), "--sequences", "20"],
        "patch": ["toy", "patch", str(toy_run), "--out", str(out), "--inputs", "8"],
        "tradeoff": ["toy", "tradeoff", "--run", str(toy_run), "--out", str(out)],
        "report": ["report", str(toy_run), "--out", str(out)],
    }[command]


TOY_COMMANDS = ["train", "train --resume", "reproduce", "sweep", "probe", "patch", "tradeoff"]


@pytest.mark.parametrize("command", TOY_COMMANDS)
def test_a_regular_file_as_out_is_refused_by_every_toy_command(toy_run, tmp_path, capsys, command):
    out = tmp_path / "result"
    out.write_text("keep me")
    for flags in ([], ["--overwrite"] if command not in ("train", "train --resume") else []):
        one_line_exit_2(capsys, _toy_argv(command, toy_run, out) + flags, "not a directory")
    assert out.read_text() == "keep me"
    assert [p.name for p in tmp_path.iterdir()] == ["result"]


@pytest.mark.parametrize("command", ["train", "reproduce", "sweep", "probe", "tradeoff", "report"])
def test_an_unwritable_location_is_one_line_before_any_work(toy_run, tmp_path, capsys, monkeypatch, command):
    """EACCES when the output directory (or a temporary beside it) is made, as under a
    0555 parent or a read-only filesystem for an ordinary user; injected, since CI runs
    as root. The command stops at once, naming a writable location."""
    import tempfile

    parent = tmp_path / "read-only"
    parent.mkdir()
    real_mkdir, real_mkdtemp = os.mkdir, tempfile.mkdtemp

    def refuse_mkdir(path, *args, **kwargs):
        if Path(path).parent == parent:
            raise PermissionError(13, "Permission denied", str(path))
        return real_mkdir(path, *args, **kwargs)

    def refuse_mkdtemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == parent:
            raise PermissionError(13, "Permission denied")
        return real_mkdtemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(os, "mkdir", refuse_mkdir)
    monkeypatch.setattr(tempfile, "mkdtemp", refuse_mkdtemp)
    if command == "report" and not (toy_run / "probe").exists():
        monkeypatch.undo()
        assert main(["toy", "probe", str(toy_run), "--sequences", "20", "--no-progress"]) == 0
        monkeypatch.setattr(os, "mkdir", refuse_mkdir)
        monkeypatch.setattr(tempfile, "mkdtemp", refuse_mkdtemp)
    argv = _toy_argv(command, toy_run, parent / "out")
    if command == "report":
        argv[1] = str(toy_run / "probe")
    one_line_exit_2(capsys, argv, "writable output location")
    assert list(parent.iterdir()) == []


def test_a_bogus_device_map_names_the_placements(model_dir, prompts, tmp_path, capsys):
    one_line_exit_2(
        capsys,
        audit_argv(model_dir, prompts, tmp_path / "out", "--device-map", "bogus"),
        "pass auto, balanced, balanced_low_0, sequential",
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content, fix", [("{not json", "is not valid JSON"), ("[1, 2]", "is not a model config")])
def test_a_broken_model_config_names_the_file_not_the_network(model_dir, prompts, tmp_path, capsys, content, fix):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    (model / "config.json").write_text(content)
    before = snapshot(model)
    one_line_exit_2(capsys, audit_argv(model, prompts, tmp_path / "out"), fix)
    err_fix = "restore it"
    one_line_exit_2(capsys, audit_argv(model, prompts, tmp_path / "out"), err_fix)
    assert snapshot(model) == before and not (tmp_path / "out").exists()


def test_truncated_weights_are_one_line_naming_the_file(model_dir, prompts, toy_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(toy_run, run, ignore=shutil.ignore_patterns("probe", "patch"))
    weights = run / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    one_line_exit_2(
        capsys,
        ["toy", "probe", str(run), "--out", str(tmp_path / "p"), "--sequences", "8"],
        "is not a readable safetensors file",
    )
    one_line_exit_2(
        capsys,
        ["toy", "patch", str(run), "--out", str(tmp_path / "q"), "--inputs", "4"],
        "is not a readable safetensors file",
    )
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    (model / "model.safetensors").write_bytes((model_dir / "model.safetensors").read_bytes()[:500])
    one_line_exit_2(capsys, audit_argv(model, prompts, tmp_path / "out"), "cannot be read")
    assert not (tmp_path / "out").exists() and not (tmp_path / "p").exists()


def test_a_run_config_with_sections_of_the_wrong_type_is_one_line(toy_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(toy_run, run, ignore=shutil.ignore_patterns("probe", "patch"))
    (run / "config.json").write_text('{"model": 1, "task": 2, "train": 3}')
    one_line_exit_2(capsys, ["toy", "probe", str(run), "--out", str(tmp_path / "p")], "restore it")
    one_line_exit_2(capsys, ["toy", "tradeoff", "--run", str(run), "--out", str(tmp_path / "t")], "restore it")


def test_running_out_of_memory_is_one_line_naming_the_counts(toy_run, tmp_path, capsys, monkeypatch):
    """A count too large for the machine (injected: an allocation the allocator refuses)."""
    import sinkscope.toy.probe_run

    def refuse(*args, **kwargs):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 8000000000000 bytes."
        )

    monkeypatch.setattr(sinkscope.toy.probe_run, "probe_model", refuse)
    one_line_exit_2(capsys, ["toy", "probe", str(toy_run), "--out", str(tmp_path / "p")], "lower the sizes and counts")
    assert not (tmp_path / "p").exists()


def test_sigterm_after_the_work_is_one_line_and_exit_1(toy_run, tmp_path):
    """SIGTERM while the console script shuts down (after main returned): not a silent
    exit 143."""
    import subprocess
    import sys

    code = (
        "import os, signal, sys, time\nfrom sinkscope.cli import main\nsys.argv[0] = 'sinkscope'\n"
        "status = main()\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(10)\nsys.exit(status)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "toy", "probe", str(toy_run), "--out", str(tmp_path / "p"), "--sequences", "8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done
    assert done.stderr.strip() == "sinkscope: interrupted after the result was complete; it is kept"
    assert (tmp_path / "p" / "probe.json").is_file()


def test_a_broken_symlink_at_or_above_out_names_it(model_dir, prompts, toy_run, tmp_path, capsys):
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    one_line_exit_2(capsys, audit_argv(model_dir, prompts, tmp_path / "dangling" / "sub"), "broken symbolic link")
    if not (toy_run / "probe").exists():
        assert main(["toy", "probe", str(toy_run), "--sequences", "20", "--no-progress"]) == 0
    one_line_exit_2(capsys, ["report", str(toy_run / "probe"), "--out", str(tmp_path / "dangling")], "symbolic link")
    assert not (tmp_path / "nowhere").exists()


def test_resume_without_max_steps_keeps_a_finished_run_finished(toy_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(toy_run, run)
    before = snapshot(run)
    assert main(["toy", "train", "--out", str(run), "--resume", "--no-progress"]) == 0
    assert snapshot(run) == before  # finished at its own max_steps: nothing retrained or rewritten
    assert "max_steps after 50 steps" in capsys.readouterr().out


def test_a_filesystem_without_directory_locks_works_unlocked_and_says_so(toy_run, tmp_path, capsys, monkeypatch):
    """NFS refuses flock on a directory (EBADF): the command still runs, with one note."""
    import errno
    import fcntl

    def no_locks(descriptor, operation):
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    out = tmp_path / "probe"
    assert main(["toy", "probe", str(toy_run), "--out", str(out), "--sequences", "8"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "without directory locks" in err[0], err
    assert (out / "probe.json").is_file()


def test_staged_paths_are_rewritten_even_when_json_escapes_them(tmp_path):
    import json

    from sinkscope.execution.outputs import _record_final_location
    from sinkscope.infra.atomic_io import atomic_write_json

    parent = tmp_path / 'résultats "q"'
    staging, final = parent / ".out.abc.tmp", parent / "out"
    (staging / "run").mkdir(parents=True)
    atomic_write_json(staging / "run" / "result.json", {"run_dir": str(staging / "run"), "steps": 3})
    assert "\\u00e9" in (staging / "run" / "result.json").read_text()  # escaped on disk
    _record_final_location(staging, final)
    assert json.loads((staging / "run" / "result.json").read_text())["run_dir"] == str(final / "run")


def test_an_exception_sinkscope_did_not_mean_is_a_bug_and_propagates(tmp_path, monkeypatch):
    """Only ``InputError`` means bad usage: a plain ``ValueError`` from inside a command
    (here from the function ``sinkscope report`` calls; in life from torch or a bug) is
    not turned into a one-line exit 2, so its traceback shows."""
    import sinkscope.reporting

    def broken(*args, **kwargs):
        raise ValueError("boom")

    monkeypatch.setattr(sinkscope.reporting, "report", broken)
    with pytest.raises(ValueError, match="boom") as raised:
        main(["report", str(tmp_path)])
    assert type(raised.value) is ValueError


def test_run_failed_is_exit_1_and_input_errors_name_the_flag_of_their_field(tmp_path, capsys, monkeypatch):
    """``RunFailed``: one line, exit 1. ``InputError(field=...)``: one line, exit 2, the
    library's message (which names the setting) followed by the command's flag for it;
    a field that names no flag of the command leaves the message as it is."""
    import sinkscope.pretrained_analysis.loading
    import sinkscope.reporting
    from sinkscope.infra.errors import InputError, RunFailed

    def fail(*args, **kwargs):
        raise RunFailed("the numbers cannot be trusted; rerun with dtype float32", field="dtype")

    monkeypatch.setattr(sinkscope.reporting, "report", fail)
    assert main(["report", str(tmp_path)]) == 1  # report has no --dtype: no flag appended
    err = capsys.readouterr().err
    assert err == "sinkscope: run failed: the numbers cannot be trusted; rerun with dtype float32\n"
    for field, flag in (("max_len", " (--max-len)"), ("n_examples", " (--examples)"), ("n_bootstrap", "")):

        def refuse(*args, field=field, **kwargs):
            raise InputError(f"{field} is out of range", field=field)

        monkeypatch.setattr(sinkscope.pretrained_analysis.loading, "resolve_model", refuse)
        assert main(["audit", "gpt2", "--out", str(tmp_path / "out"), "--no-progress"]) == 2
        assert capsys.readouterr().err == f"sinkscope: error: {field} is out of range{flag}\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["audit", "report", "toy probe"])
def test_a_symbolic_link_loop_as_input_is_one_line(command, model_dir, prompts, tmp_path, capsys):
    """A loop given as the model, result or run was a RuntimeError traceback from the input
    rule's path resolution (found by tests/faults)."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    argv = {
        "audit": audit_argv(loop, prompts, tmp_path / "out"),
        "report": ["report", str(loop), "--out", str(tmp_path / "out")],
        "toy probe": ["toy", "probe", str(loop), "--out", str(tmp_path / "out")],
    }[command]
    one_line_exit_2(capsys, argv, "is a symbolic link loop")
    assert not (tmp_path / "out").exists()
