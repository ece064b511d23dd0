"""Every CSV sinkscope writes names the model and its revision, and holds no column in
which nothing was measured (``anchor_mass_other`` is defined only where queries are
split, as at the toy task's trigger; audits leave it out)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from sinkscope.cli import main
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2


def _columns(path: Path) -> dict[str, list[str]]:
    with path.open(newline="") as file:
        rows = list(csv.DictReader(file))
    assert rows, path
    return {name: [row[name] for row in rows] for name in rows[0]}


def _empty(cell: str) -> bool:
    return cell == "" or (cell.lower() == "nan") or (_is_number(cell) and math.isnan(float(cell)))


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _measured_columns(path: Path, allowed_empty: set[str]) -> dict[str, list[str]]:
    columns = _columns(path)
    empty = {name for name, cells in columns.items() if all(_empty(cell) for cell in cells)}
    assert empty <= allowed_empty, f"{path}: nothing in {sorted(empty - allowed_empty)}"
    return columns


@pytest.fixture(scope="module")
def audit_out(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("csv")
    model = build_tiny_gpt2(root / "tiny-gpt2", bos_sink_head=(1, 0))
    prompts = [arg for text in TINY_GPT2_PROMPTS[:4] for arg in ("--prompt", text)]
    argv = ["audit", str(model), *prompts, "--max-len", "16", "--out", str(root / "audit"), "--no-progress"]
    assert main(argv) == 0
    return root / "audit"


def test_audit_csvs_name_the_model_and_hold_no_empty_column(audit_out):
    paths = sorted(audit_out.rglob("*.csv"))
    assert [path.name for path in paths] == ["heads.csv"]
    columns = _measured_columns(paths[0], allowed_empty={"revision"})  # a local model has no revision
    assert list(columns)[:4] == ["model", "revision", "layer", "head"]
    assert set(columns["model"]) == {"tiny-gpt2"} and set(columns["revision"]) == {""}
    assert "anchor_mass_other" not in columns  # no trigger split in an audit: measured nowhere


def test_a_revision_fills_its_column(audit_out):
    from sinkscope.pretrained_analysis.audit import read_audit

    probe = read_audit(audit_out).probe
    lines = probe.heads_csv("pythia-14m", "step1000").splitlines()
    assert lines[0].startswith("model,revision,") and all(line.startswith("pythia-14m,step1000,") for line in lines[1:])


def test_toy_probe_csvs_name_the_run_and_hold_no_empty_column(tmp_path):
    from sinkscope.toy.model import ToyModelConfig
    from sinkscope.toy.run_dir import RunConfig, TrainConfig
    from sinkscope.toy.task import TaskConfig
    from sinkscope.toy.train import train

    run = tmp_path / "softmax-1x1"
    train(RunConfig(ToyModelConfig(), TaskConfig(), TrainConfig(max_steps=20)), run, progress=False)
    out = tmp_path / "probe"
    assert main(["toy", "probe", str(run), "--out", str(out), "--sequences", "20", "--allow-unfinished"]) == 0
    paths = sorted(out.rglob("*.csv"))
    assert [path.name for path in paths] == ["heads.csv"]
    columns = _measured_columns(paths[0], allowed_empty={"revision"})
    assert set(columns["model"]) == {"softmax-1x1"}
    assert "anchor_mass_other" in columns  # the BOS mass at the trigger, measured in the toy task


def test_the_data_frame_has_the_csv_columns(audit_out):
    """``to_dataframe()`` and ``heads.csv`` agree: the same columns, in order, and the model
    named the same way (its name, the revision apart)."""
    import csv

    from sinkscope.pretrained_analysis.audit import read_audit

    result = read_audit(audit_out)
    frame = result.to_dataframe()
    with (audit_out / "heads.csv").open(newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle))
    assert list(frame.columns) == header
    assert set(frame["model"]) == {"tiny-gpt2"} and "anchor_mass_other" not in frame.columns
    assert list(result.probe.to_dataframe().columns) == header[2:]
