"""The default-state test: removing a real sink breaks default outputs, the matched
control does not; a model without sink heads reports that there is nothing to remove."""

from __future__ import annotations

import json

import pytest
import torch

from sinkscope.infra.codec import encode
from sinkscope.probes.default_state import DefaultStateConfig, default_state_test
from sinkscope.probes.runner import probe_model
from sinkscope.toy.model import ToyModelConfig, ToyTransformer
from sinkscope.toy.task import TaskConfig, eval_batch
from tiny_models import toy_sink_model as sink_model

torch.set_num_threads(1)


def test_removing_the_sink_breaks_default_positions_far_more_than_control():
    model = sink_model()
    batch = eval_batch(TaskConfig(d_model=8, seq_len=8, eval_trigger_position=5), 32, seed=1, target="residual")
    default = batch.default_query_mask()
    with torch.no_grad():
        reference = model(batch.tokens)

    def default_error(output, prepared):
        squared = (output - reference).pow(2).mean(dim=-1)
        return (squared * default).sum(dim=1) / default.sum(dim=1)

    sinks = probe_model(model, batch.tokens, query_mask=default).sink_heads()
    result = default_state_test(model, batch.tokens, sinks, default_error, config=DefaultStateConfig(n_bootstrap=200))
    (row,) = result.rows
    assert result.all_sink_heads == row  # the only sink head: removing all of them is removing it
    assert row.head_set == ((0, 0),) and row.error_before == 0.0
    assert row.remove_increase.mean > 10 * max(row.control_increase.mean, 1e-12)
    assert row.remove_increase.ci_low > row.control_increase.ci_high
    assert row.cohens_d > 1.0
    json.dumps(encode(result), allow_nan=False)
    frame = result.to_dataframe()
    assert (
        frame["head_set"].tolist() == ["L0H0"] and frame["remove_increase_ci_low"].iloc[0] == row.remove_increase.ci_low
    )


def test_relu_model_has_no_sink_to_remove():
    model = ToyTransformer(ToyModelConfig(n_layers=2, n_heads=2, d_model=8, seq_len=8, attention="relu"))
    tokens = eval_batch(TaskConfig(d_model=8, seq_len=8), 4, seed=0, target="residual").tokens
    sinks = probe_model(model, tokens).sink_heads()
    result = default_state_test(model, tokens, sinks, lambda output, prepared: output.pow(2).mean(dim=(1, 2)))
    assert result.rows == () and result.all_sink_heads is None and "no sink" in result.note


def test_error_fn_must_return_one_value_per_input():
    model = sink_model()
    tokens = torch.randn(3, 5, 8)
    with pytest.raises(ValueError, match="one error per input"):
        default_state_test(model, tokens, [(0, 0)], lambda output, prepared: output.mean())
