"""A report reads only inside its result directory (issue 22, item 4): every file it
embeds or links must resolve, after symlinks, to a regular PNG inside that directory.
A symlink out of it, an absolute or ``..`` path in a result's ``figures``, a FIFO or a
file that is not a PNG is one line and exit 2, and no report is written."""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path

import pytest

from fault_checks import audit_argv, one_line_exit_2, snapshot
from sinkscope.cli import main
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "b883e06"


@pytest.fixture(scope="module")
def audit_dir(tmp_path_factory) -> Path:
    """One audit of the tiny model, one attention example; each test reports on a copy."""
    root = tmp_path_factory.mktemp("inside")
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(TINY_GPT2_PROMPTS) + "\n", encoding="utf-8")
    out = root / "audit"
    argv = audit_argv(build_tiny_gpt2(root / "tiny-gpt2"), prompts, out)
    argv[argv.index("--examples") + 1] = "1"
    assert main(argv) == 0
    return out


@pytest.fixture
def private_png(tmp_path) -> Path:
    """A PNG outside every result directory: a report must never embed it."""
    path = tmp_path / "private" / "secret.png"
    path.parent.mkdir()
    shutil.copyfile(FIXTURES / "toy-tradeoff" / "tradeoff.png", path)
    return path


def copy_of(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / "result"
    shutil.copytree(source, target, symlinks=True)
    return target


def refused(capsys, result: Path, fix: str) -> None:
    """``sinkscope report result`` is one line with ``fix`` and exit 2, and writes nothing."""
    before = snapshot(result)
    one_line_exit_2(capsys, ["report", str(result), "--no-progress"], fix)
    assert snapshot(result) == before
    assert not (result / "report.html").exists() and not (result / "report.md").exists()


def edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_a_figure_symlinked_out_of_the_audit_is_refused(audit_dir, private_png, tmp_path, capsys):
    audit = copy_of(audit_dir, tmp_path)
    (audit / "anchor_mass_map.png").unlink()
    (audit / "anchor_mass_map.png").symlink_to(private_png)
    refused(capsys, audit, "outside")


def test_a_dotdot_path_in_the_audits_figures_is_refused(audit_dir, private_png, tmp_path, capsys):
    audit = copy_of(audit_dir, tmp_path)
    (audit / "attention_example_0").mkdir()  # so that the path resolves on every OS
    escape = "attention_example_0/../../private/secret.png"
    edit_json(audit / "audit.json", lambda data: data.update(figures=[*data["figures"], escape]))
    refused(capsys, audit, "figures")


def test_a_fifo_as_a_figure_is_refused_without_hanging(audit_dir, tmp_path, capsys):
    audit = copy_of(audit_dir, tmp_path)
    (audit / "anchor_mass_by_layer.png").unlink()
    os.mkfifo(audit / "anchor_mass_by_layer.png")
    refused(capsys, audit, "regular file")


def test_a_figure_that_is_not_a_png_is_refused(audit_dir, tmp_path, capsys):
    audit = copy_of(audit_dir, tmp_path)
    (audit / "attention_example_0.png").write_text("<svg/>")
    refused(capsys, audit, "not a PNG file")


def test_an_absolute_path_in_a_sweeps_figures_is_refused(private_png, tmp_path, capsys):
    sweep = copy_of(FIXTURES / "sweep", tmp_path)
    edit_json(sweep / "summary.json", lambda data: data.update(figures=[str(private_png)]))
    refused(capsys, sweep, "figures")


def test_an_absolute_path_in_a_reproductions_model_figures_is_refused(private_png, tmp_path, capsys):
    reproduction = copy_of(FIXTURES / "reproduction", tmp_path)
    edit_json(reproduction / "summary.json", lambda data: data["models"][0].update(figures=[str(private_png)]))
    refused(capsys, reproduction, "figures")


def test_a_run_figure_symlinked_out_of_a_reproduction_is_refused(private_png, tmp_path, capsys):
    reproduction = copy_of(FIXTURES / "reproduction", tmp_path)
    figure = reproduction / "softmax-1x1-seed0" / "attention_mean.png"
    figure.unlink()
    figure.symlink_to(private_png)
    refused(capsys, reproduction, "outside")


def test_a_symlink_inside_the_directory_is_followed_and_linked_to_its_target(audit_dir, tmp_path, capsys):
    audit = copy_of(audit_dir, tmp_path)
    (audit / "anchor_mass_map.png").unlink()
    (audit / "anchor_mass_map.png").symlink_to("anchor_mass_by_layer.png")
    out = tmp_path / "elsewhere"
    assert main(["report", str(audit), "--out", str(out), "--no-progress"]) == 0
    markdown = (out / "report.md").read_text()
    assert "../result/anchor_mass_by_layer.png" in markdown
    assert "../result/anchor_mass_map.png" not in markdown


def test_a_toy_probe_report_embeds_the_runs_heatmaps_from_its_own_copies(tmp_path):
    """The probe copies the run's heatmaps beside itself; its report never reads the run (or
    whatever run a tampered provenance names) again."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "toy-run", run, ignore=shutil.ignore_patterns("probe"))
    shutil.copyfile(FIXTURES / "toy-tradeoff" / "tradeoff.png", run / "attention_mean.png")
    assert main(["toy", "probe", str(run), "--sequences", "8", "--no-progress"]) == 0
    probe = run / "probe"
    assert (probe / "attention_mean.png").read_bytes() == (run / "attention_mean.png").read_bytes()
    shutil.copyfile(FIXTURES / "sweep" / "sink_fraction.png", run / "attention_mean.png")
    assert main(["report", str(probe), "--no-progress"]) == 0
    page = (probe / "report.html").read_text()
    encoded = base64.b64encode((probe / "attention_mean.png").read_bytes()).decode()
    assert encoded in page
    assert base64.b64encode((run / "attention_mean.png").read_bytes()).decode() not in page
