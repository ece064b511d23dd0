"""Activation patching on the toy trigger task: constructions (exact) and a trained run."""

from __future__ import annotations

import json

import pytest
import torch

from round_trip import assert_json_files_round_trip
from sinkscope.cli import main
from sinkscope.infra.codec import encode
from sinkscope.toy.constructions import relu_exact_model, softmax_scaled_model
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.patching import remove_trigger, trigger_patching
from sinkscope.toy.run_dir import RunConfig, TrainConfig
from sinkscope.toy.task import TRIGGER_FLAG, TaskConfig, eval_batch
from sinkscope.toy.train import train

TASK = TaskConfig(d_model=8, seq_len=10, eval_trigger_position=6)


def test_remove_trigger_makes_a_content_token():
    batch = eval_batch(TASK, 4, seed=0, target="single")
    tokens = remove_trigger(batch, TASK)
    assert tokens[:, :, TRIGGER_FLAG].sum() == 0 and torch.all(tokens[:, 1:, TASK.bias_coord] == 1)
    assert torch.equal((tokens != batch.tokens).any(dim=-1), batch.trigger_query_mask())


@pytest.mark.parametrize(
    "build", [lambda: relu_exact_model(TASK), lambda: softmax_scaled_model(TASK, 10.0)], ids=["relu", "softmax"]
)
def test_constructions_carry_the_trigger_in_their_head_at_the_trigger(build):
    result = trigger_patching(build(), TASK, n_inputs=16)
    assert result.per_head.source_metric == pytest.approx(1.0, abs=1e-3) and abs(result.per_head.target_metric) < 1e-3
    assert result.per_head.matrix()[0, 0].item() == pytest.approx(1.0, abs=1e-5)
    positions = result.per_position.matrix()[0]
    assert positions[TASK.eval_trigger_position].item() == pytest.approx(1.0, abs=1e-5)
    assert torch.count_nonzero(positions) == 1
    json.dumps(encode(result), allow_nan=False)


def test_cli_patch_on_a_trained_run(tmp_path, capsys):
    run = tmp_path / "run"
    config = RunConfig(ToyModelConfig(), TaskConfig(), TrainConfig(seed=0))
    assert train(config, run, progress=False).converged
    assert main(["toy", "patch", str(run), "--inputs", "64", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    heads = data["per_head"]["rows"]
    assert len(heads) == 1 and heads[0]["normalised_effect"] > 0.95  # the one head carries the trigger
    positions = {row["position"]: row["normalised_effect"] for row in data["per_position"]["rows"]}
    assert positions[7] > 0.95 and all(abs(v) < 0.05 for p, v in positions.items() if p != 7)
    for name in ("patching.json", "patching_heads.png", "patching_positions.png"):
        assert (run / "patch" / name).stat().st_size > 0
    assert assert_json_files_round_trip(run / "patch") == {
        "trigger_patching",
        "patching",
        "toy_source_run",
        "provenance",
    }
    assert main(["toy", "patch", str(run), "--inputs", "64"]) == 2  # no silent overwrite
    assert "--overwrite" in capsys.readouterr().err
