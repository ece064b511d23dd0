"""A result describes only itself (issue 34, item 2): a toy probe or patch keeps a copy of
its training run (``source_run.json``: the run's config, the logged steps it draws, the
sha256 of the run's files), and its report reads that copy, never the run's path again.
A report into a directory that holds another result is refused; a result written before
the copy still reports, without the run's settings, and says so in one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from fault_checks import one_line_exit_2, snapshot
from sinkscope.cli import main
from sinkscope.reporting import report
from sinkscope.toy.run_dir import CONFIG_FILE, METRICS_FILE, RunConfig, read_config, read_metrics
from sinkscope.toy.run_integrity import file_sha256
from sinkscope.toy.training_curves import formation_finding

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "b883e06"
PREDATES = "predates the copy of its training run"

# every path opened while a report is written, collected while ``_opened`` is a list
_opened: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _opened is not None and isinstance(args[0], (str, bytes, os.PathLike)):
        _opened.append(os.path.abspath(os.fsdecode(args[0])))


sys.addaudithook(_audit)  # hooks cannot be removed: this one records only inside opened_during


def opened_during(action) -> tuple[object, list[Path]]:
    """``action()``'s value and every file path it opened (with ``open`` or ``os.open``)."""
    global _opened
    _opened = []
    try:
        value = action()
    finally:
        seen, _opened = _opened, None
    return value, [Path(path) for path in seen]


def toy_run(path: Path) -> Path:
    shutil.copytree(FIXTURES / "toy-run", path, ignore=shutil.ignore_patterns("probe"))
    return path


def replace_with_another_run(run: Path) -> None:
    """``run`` replaced whole by another run: two layers, seed 7, a log with no sink."""
    shutil.rmtree(run)
    toy_run(run)
    config = json.loads((run / CONFIG_FILE).read_text())
    config["model"]["n_layers"], config["train"]["seed"], config["train"]["max_steps"] = 2, 7, 4000
    (run / CONFIG_FILE).write_text(json.dumps(config))
    lines = [{"step": step, "anchor_mass_default": [[0.01], [0.02]]} for step in (0, 100, 200)]
    (run / METRICS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))


def key_values(markdown: str, caption: str) -> dict[str, str]:
    """The rows of the report's label/value table headed ``**caption**``."""
    block = markdown.split(f"**{caption}**", 1)[1].split("\n\n**", 1)[0]
    return dict(re.findall(r"^\| (.+?) \| (.*?) \|$", block, flags=re.MULTILINE))


def unescaped(markdown: str) -> str:
    return re.sub(r"\\(.)", r"\1", markdown)


def assert_reads_only_inside(opened: list[Path], result: Path, root: Path) -> None:
    """Of the files under ``root`` (the test's folder), only the result's own were opened."""
    outside = [path for path in opened if path.is_relative_to(root) and not path.is_relative_to(result)]
    assert not outside, f"the report opened {outside}"


@pytest.mark.parametrize("after", ["replaced", "deleted"])
def test_a_probe_report_describes_the_run_it_probed_after_the_run_is_gone(after, tmp_path):
    run = toy_run(tmp_path / "run")
    original: RunConfig = read_config(run)
    formation = formation_finding(read_metrics(run), "run")
    hashes = {name: file_sha256(run / name) for name in (CONFIG_FILE, METRICS_FILE)}
    probe = tmp_path / "probe"
    assert main(["toy", "probe", str(run), "--out", str(probe), "--sequences", "8", "--no-progress"]) == 0
    if after == "replaced":
        replace_with_another_run(run)
    else:
        shutil.rmtree(run)
    written, opened = opened_during(lambda: report(probe))
    assert_reads_only_inside(opened, probe, tmp_path)
    markdown = unescaped((probe / "report.md").read_text())
    model, training = key_values(markdown, "Toy model (training run)"), key_values(markdown, "Training")
    for name in ("n_layers", "n_heads", "d_model", "seq_len", "attention"):
        assert model[name] == str(getattr(original.model, name)), name
    for name in ("seed", "batch_size", "max_steps", "log_every"):
        assert training[name] == str(getattr(original.train, name)), name
    assert formation is not None and formation in written.findings  # the steps the probe drew, not the new log
    files = key_values(markdown, "Training run's files, as read (sha256)")
    assert files[CONFIG_FILE] == hashes[CONFIG_FILE] and files[METRICS_FILE] == hashes[METRICS_FILE]
    assert PREDATES not in markdown


def test_a_patch_report_describes_the_run_it_patched_after_the_run_is_replaced(tmp_path):
    run = toy_run(tmp_path / "run")
    original = read_config(run)
    patch = tmp_path / "patch"
    assert main(["toy", "patch", str(run), "--out", str(patch), "--inputs", "8", "--no-progress"]) == 0
    replace_with_another_run(run)
    written, opened = opened_during(lambda: report(patch))
    assert_reads_only_inside(opened, patch, tmp_path)
    markdown = unescaped((patch / "report.md").read_text())
    model = key_values(markdown, "Toy model (training run)")
    assert model["n_layers"] == str(original.model.n_layers) and model["n_heads"] == str(original.model.n_heads)
    assert key_values(markdown, "Task")["seq_len"] == str(original.task.seq_len)
    assert written.findings[0].startswith("run: triggered inputs patched")


@pytest.mark.parametrize("other", ["the probed run", "audit-gpt2", "toy-tradeoff", "toy-patch"])
def test_a_report_into_a_directory_holding_another_result_is_refused(other, tmp_path, capsys):
    shutil.copytree(FIXTURES / "toy-run", tmp_path / "toy-run")
    probe = tmp_path / "toy-run" / "probe"
    out = probe.parent if other == "the probed run" else shutil.copytree(FIXTURES / other, tmp_path / other)
    before, result_before = snapshot(out), snapshot(probe)
    argv = ["report", str(probe), "--out", str(out), "--no-progress"]
    one_line_exit_2(capsys, argv, "holds another result")
    one_line_exit_2(capsys, [*argv, "--overwrite"], "choose an empty or new output directory for the report (--out)")
    assert snapshot(out) == before and snapshot(probe) == result_before
    # its own directory, named as --out, and a new one stay fine
    assert main(["report", str(probe), "--out", str(probe), "--no-progress"]) == 0
    assert main(["report", str(probe), "--out", str(tmp_path / "new"), "--no-progress"]) == 0


def test_a_probe_written_before_the_copy_reports_without_the_runs_settings_and_says_so(tmp_path):
    """The previous release's probe, beside a run that is no longer the one it probed: the
    report shows the probe's own numbers, none of the run's settings, and one line why."""
    run = shutil.copytree(FIXTURES / "toy-run", tmp_path / "toy-run")
    replace_with_another_run_keeping_probe(run)
    probe = run / "probe"
    written, opened = opened_during(lambda: report(probe))
    assert_reads_only_inside(opened, probe, tmp_path)
    markdown = unescaped((probe / "report.md").read_text())
    assert "**Toy model (training run)**" not in markdown and "**Training**" not in markdown
    notes = [finding for finding in written.findings if PREDATES in finding]
    assert len(notes) == 1 and "sinkscope toy probe" in notes[0] and "--overwrite" in notes[0]
    heads = json.loads((probe / "probe.json").read_text())["heads"]
    assert f"{sum(h['is_sink_head'] for h in heads)} of {len(heads)} heads" in markdown
    assert written.markdown.parent == probe


def replace_with_another_run_keeping_probe(run: Path) -> None:
    probe = run.parent / "kept-probe"
    shutil.move(run / "probe", probe)
    replace_with_another_run(run)
    shutil.move(probe, run / "probe")


def test_a_patch_written_before_the_copy_still_reports_and_says_so(tmp_path):
    patch = shutil.copytree(FIXTURES / "toy-patch", tmp_path / "toy-patch")
    written = report(patch)
    assert sum(PREDATES in finding for finding in written.findings) == 1
    assert "sinkscope toy patch RUN_DIR" in next(f for f in written.findings if PREDATES in f)  # no provenance
    assert "**Toy model (training run)**" not in written.markdown.read_text()


def test_a_mechanism_comparison_of_a_probe_names_the_run_it_probed_not_the_one_beside_it(tmp_path):
    run = toy_run(tmp_path / "run")
    model = read_config(run).model
    assert main(["toy", "probe", str(run), "--sequences", "8", "--no-progress"]) == 0
    replace_with_another_run_keeping_probe(run)  # the probe now sits in a two-layer run
    out = tmp_path / "mechanism"
    _, opened = opened_during(lambda: main(["compare", str(run / "probe"), "--mechanism", "--out", str(out)]))
    assert_reads_only_inside(opened, run / "probe", run)  # nothing of the run around the probe
    [row] = json.loads((out / "mechanism.json").read_text())["models"]
    assert (row["source"], row["model"]) == (
        "run",
        f"toy softmax {model.n_layers}x{model.n_heads} (d_model {model.d_model})",
    )


def test_a_copy_linked_from_outside_the_result_is_refused(tmp_path, capsys):
    """A ``source_run.json`` that is a link to another result's copy would describe that run."""
    run = toy_run(tmp_path / "run")
    assert main(["toy", "probe", str(run), "--sequences", "8", "--no-progress"]) == 0
    other = shutil.copytree(run / "probe", tmp_path / "other")
    (run / "probe" / "source_run.json").unlink()
    (run / "probe" / "source_run.json").symlink_to(other / "source_run.json")
    before = snapshot(run / "probe")
    one_line_exit_2(capsys, ["report", str(run / "probe"), "--no-progress"], "leads outside")
    assert snapshot(run / "probe") == before
