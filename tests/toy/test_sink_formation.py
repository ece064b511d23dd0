"""When a toy run's sink forms: the sink quantities training logs every N steps into
metrics.jsonl, drawn against the step by ``toy probe`` and stated in its report."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sinkscope.reporting import report
from sinkscope.toy.model import ToyModelConfig, ToyTransformer
from sinkscope.toy.probe_run import probe_run
from sinkscope.toy.run_dir import METRICS_FILE, RunConfig, TrainConfig, read_metrics
from sinkscope.toy.run_member import sink_rates
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.train import train
from sinkscope.toy.training_curves import SINK_FORMATION_FIGURE, formation_finding, sink_formation_figure


def test_the_sink_rate_counts_entries_whose_mean_bos_attention_exceeds_eps():
    model = ToyTransformer(ToyModelConfig(n_layers=2, n_heads=1))
    # 2 sequences x 3 queries; alpha_0 = mean over queries of A[i, 0]
    strong = torch.tensor([[1.0, 0.0, 0.0], [0.9, 0.1, 0.0], [0.8, 0.1, 0.1]])  # alpha 0.9
    weak = torch.tensor([[1.0, 0.0, 0.0], [0.1, 0.9, 0.0], [0.0, 0.5, 0.5]])  # alpha 0.3667
    layer0 = torch.stack([strong, weak]).unsqueeze(1)  # [batch, head, query, key]
    layer1 = torch.stack([weak, weak]).unsqueeze(1)
    rates = sink_rates(model, {"blocks.0.attn.hook_pattern": layer0, "blocks.1.attn.hook_pattern": layer1})
    # of 4 (sequence, layer, head) entries: 4 have alpha > 0.3, 1 has alpha > 0.8
    assert rates == {"0.3": 100.0, "0.8": 25.0}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("formation") / "run"
    config = RunConfig(ToyModelConfig(), TaskConfig(), TrainConfig(max_steps=240, log_every=40, checkpoint_every=120))
    train(config, run_dir, progress=False)
    return run_dir


def test_every_logged_step_holds_the_sink_heads_and_the_sink_rate(run):
    records = read_metrics(run)
    assert [record["step"] for record in records] == [0, 40, 80, 120, 160, 200, 240]
    for record in records:
        masses = [mass for layer in record["anchor_mass_default"] for mass in layer]
        assert record["n_sink_heads"] == sum(mass >= 0.9 for mass in masses)
        assert set(record["sink_rate"]) == {"0.3", "0.8"}
        assert 0.0 <= record["sink_rate"]["0.8"] <= record["sink_rate"]["0.3"] <= 100.0


def test_the_probe_draws_the_logged_points_and_the_report_states_them(run, tmp_path):
    result = probe_run(run, tmp_path / "probe", n_sequences=64, allow_unfinished=True)
    assert SINK_FORMATION_FIGURE in result.files and (tmp_path / "probe" / SINK_FORMATION_FIGURE).is_file()
    records = read_metrics(run)
    figure = sink_formation_figure(records, "run", tmp_path / "again.png")
    rate_ax, heads_ax, layer_ax = figure.axes
    steps = [record["step"] for record in records]
    for line, eps in zip(rate_ax.lines, ("0.3", "0.8"), strict=True):
        assert list(line.get_xdata()) == steps
        assert np.allclose(line.get_ydata(), [record["sink_rate"][eps] for record in records])
    assert list(heads_ax.lines[0].get_ydata()) == [record["n_sink_heads"] for record in records]
    assert np.allclose(layer_ax.lines[0].get_ydata(), [record["anchor_mass_default"][0][0] for record in records])
    written = report(tmp_path / "probe")
    markdown = written.markdown.read_text()
    assert "## Sinks during training" in markdown and SINK_FORMATION_FIGURE in markdown
    assert formation_finding(records, "run") is not None
    assert any("logged steps" in finding or "logged step" in finding for finding in written.findings)


def test_a_run_logged_before_the_sink_rate_draws_what_it_has(run, tmp_path):
    records = [
        {k: v for k, v in record.items() if k not in ("sink_rate", "n_sink_heads")} for record in read_metrics(run)
    ]
    figure = sink_formation_figure(records, "old", tmp_path / "old.png")
    assert len(figure.axes) == 2  # sink heads and per-layer BOS mass; no sink rate was logged


def test_a_formed_sink_is_found_at_its_first_logged_step():
    def line(step: int, mass: float) -> dict:
        return {"step": step, "anchor_mass_default": [[mass, 0.1]]}

    records = [line(0, 0.2), line(100, 0.5), line(200, 0.95), line(300, 0.97)]
    finding = formation_finding(records, "r")
    assert finding is not None and "first sink head appears at logged step 200" in finding
    assert "at step 300 it has 1" in finding and "every 100 steps" in finding
    never = formation_finding([line(0, 0.2), line(50, 0.3)], "r")
    assert never is not None and "formed no sink head over its 2 logged steps" in never


def test_the_metrics_lines_are_json_with_the_new_fields(run):
    first = json.loads((run / METRICS_FILE).read_text().splitlines()[0])
    assert {"n_sink_heads", "sink_rate"} <= set(first)


def test_records_out_of_order_twice_or_damaged_are_drawn_in_step_order_or_left_out():
    def line(step, mass, **extra):
        return {"step": step, "anchor_mass_default": [[mass]], **extra}

    records = [line(300, 0.97), line(100, 0.5), line(200, 0.95), line(0, 0.2), line(200, 0.96)]
    finding = formation_finding(records, "r")
    assert "first sink head appears at logged step 200" in finding and "every 100 steps" in finding
    damaged = [
        line(0, 0.1),
        {"step": 50, "anchor_mass_default": [["x"]]},  # a text where a mass should be
        {"step": 60, "anchor_mass_default": []},
        {"step": "70", "anchor_mass_default": [[0.5]]},
        line(80, 0.2, sink_rate={"abc": 1.0}),
        line(100, 0.3, sink_rate={"0.3": 5.0}),
    ]
    from sinkscope.toy.training_curves import formation_records

    kept = formation_records(damaged)
    assert [record["step"] for record in kept] == [0, 80, 100]
    assert all("sink_rate" not in record for record in kept)  # thresholds differ between lines: none drawn


def test_a_metrics_line_damaged_in_the_middle_refuses_the_resume_and_changes_nothing(run, tmp_path):
    import shutil

    from sinkscope.infra.errors import InputError
    from sinkscope.toy.metrics_log import metrics_before

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    lines = (copy / METRICS_FILE).read_text().splitlines(keepends=True)
    damaged = "".join([lines[0], "not json\n", *lines[1:]])
    (copy / METRICS_FILE).write_text(damaged)
    with pytest.raises(InputError, match="line 2 is not a metrics line"):
        metrics_before(copy, 10_000)
    assert (copy / METRICS_FILE).read_text() == damaged
    cut = "".join(lines) + '{"step": 28'  # the last line cut short by an interruption: dropped
    (copy / METRICS_FILE).write_text(cut)
    assert metrics_before(copy, 10_000) == "".join(json.dumps(json.loads(x)) + "\n" for x in lines)
