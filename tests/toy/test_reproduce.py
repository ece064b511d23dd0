"""`sinkscope toy reproduce`: layout of its outputs, resumption, and (slow) the paper's claims."""

from __future__ import annotations

import json

import pytest

from round_trip import assert_json_files_round_trip
from sinkscope.infra.codec import encode
from sinkscope.infra.errors import InputError
from sinkscope.reporting import report
from sinkscope.toy.experiment import seed_groups
from sinkscope.toy.reproduce import ReproduceConfig, reproduce
from sinkscope.toy.train import train

REQUIRED_MODEL_KEYS = {
    "n_layers",
    "n_heads",
    "attention",
    "seed",
    "converged",
    "steps",
    "wall_seconds",
    "linf_error",
    "heads",
    "heldout_linf_error",
    "heldout_mse",
}
REQUIRED_HEAD_KEYS = {"layer", "head", "anchor_mass", "anchor_mass_other", "row_mass", "is_sink_head"}


def _tiny(**overrides) -> ReproduceConfig:
    settings = dict(seeds=1, architectures=((1, 1), (2, 2)), max_steps=25, n_sequences=40, workers=1)
    return ReproduceConfig(**{**settings, **overrides})


def test_outputs_have_the_documented_layout(tmp_path):
    out = tmp_path / "repro"
    summary = reproduce(_tiny(), out, progress=False)
    data = json.loads((out / "summary.json").read_text())
    names = [m["name"] for m in data["models"]]
    assert names == ["softmax-1x1-seed0", "relu-1x1-seed0", "softmax-2x2-seed0", "relu-2x2-seed0"]
    for model in data["models"]:
        assert REQUIRED_MODEL_KEYS <= set(model)
        assert len(model["heads"]) == model["n_layers"] * model["n_heads"]
        for row in model["heads"]:
            assert REQUIRED_HEAD_KEYS <= set(row)
            assert row["is_sink_head"] == (row["anchor_mass"] >= 0.9)
        run_dir = out / model["name"]
        for name in (
            "config.json",
            "metrics.jsonl",
            "model.safetensors",
            "result.json",
            "attention_mean.png",
            "attention_std.png",
        ):
            assert (run_dir / name).is_file(), name
        assert model["steps"] == 25 and not model["converged"]
    assert not (out / "summary.md").exists()  # the reproduction's one Markdown file is its report's
    markdown = report(out).markdown.read_text()
    assert "0.92, 1.00, 0.93, 1.00" in markdown  # the paper's 2x2 numbers sit next to ours
    failed = [line for line in markdown.splitlines() if line.startswith("|") and "reaches L-inf" in line]
    assert failed and all("| no |" in line for line in failed)  # 25 steps cannot converge, and the checks say so
    assert len(summary.checks) == len(data["checks"])
    assert data["figures"] == ["tradeoff.png"] and (out / "tradeoff.png").is_file()
    assert "softmax-1x1-seed0 (W_Q x factor)" in json.loads((out / "tradeoff.json").read_text())["series"]
    frame = summary.to_dataframe()  # one row per (model, layer, head)
    assert len(frame) == 2 * (1 + 4) and frame["model"].iloc[0] == "softmax-1x1-seed0"
    assert {"attention", "seed", "anchor_mass", "row_mass", "is_sink_head"} <= set(frame.columns)
    assert assert_json_files_round_trip(out) == {
        "reproduce_config",
        "reproduction",
        "tradeoff",
        "run_config",
        "train_result",
        "model_summary",
        "provenance",
    }


def test_rerun_resumes_and_different_settings_are_refused(tmp_path):
    out = tmp_path / "repro"
    config = _tiny(architectures=((1, 1),))
    first = reproduce(config, out, progress=False)
    again = reproduce(config, out, progress=False)  # finished runs are reused, not retrained
    assert [m.steps for m in again.models] == [m.steps for m in first.models]
    assert [m.wall_seconds for m in again.models] == [m.wall_seconds for m in first.models]
    with pytest.raises(InputError, match="choose another output directory or overwrite it") as refused:
        reproduce(_tiny(architectures=((1, 1),), max_steps=30), out, progress=False)
    assert refused.value.field == "overwrite"  # the CLI names its flag
    replaced = reproduce(_tiny(architectures=((1, 1),), max_steps=30), out, overwrite=True, progress=False)
    assert all(m.steps == 30 for m in replaced.models)


def test_parallel_workers_give_the_same_numbers_as_one(tmp_path):
    serial = reproduce(_tiny(architectures=((1, 1),)), tmp_path / "serial", progress=False)
    parallel = reproduce(_tiny(architectures=((1, 1),), workers=2), tmp_path / "parallel", progress=False)
    assert [m.linf_error for m in serial.models] == [m.linf_error for m in parallel.models]
    # as stored (NaN as null): a metric measured for no head is NaN, which no NaN equals
    assert encode([m.heads for m in serial.models]) == encode([m.heads for m in parallel.models])


def test_seeds_of_one_config_are_grouped_costliest_first():
    config = _tiny(seeds=3, architectures=((2, 2), (1, 1)), attentions=("softmax",), workers=2)
    groups = seed_groups(config.run_configs(), config.workers)
    assert [[name for name, _ in group] for group in groups] == [
        ["softmax-2x2-seed0", "softmax-2x2-seed1"],
        ["softmax-2x2-seed2"],
        ["softmax-1x1-seed0", "softmax-1x1-seed1"],
        ["softmax-1x1-seed2"],
    ]
    assert [len(group) for group in seed_groups(config.run_configs(), 1)] == [3, 3]


def test_seeds_trained_together_give_the_numbers_of_one_by_one_training(tmp_path):
    config = _tiny(seeds=2, architectures=((2, 2),), attentions=("softmax",), max_steps=40)
    together = reproduce(config, tmp_path / "together", progress=False)  # one worker: one group of 2
    for model, (name, run_config) in zip(together.models, config.run_configs()):
        alone = train(run_config, tmp_path / "alone" / name, progress=False)
        assert model.name == name and model.steps == alone.steps == 40
        assert model.linf_error == pytest.approx(alone.linf_error, rel=1e-5)
        assert json.loads((tmp_path / "together" / name / "metrics.jsonl").read_text().splitlines()[0])["step"] == 0
    assert together.models[0].linf_error != together.models[1].linf_error  # the seeds really differ
