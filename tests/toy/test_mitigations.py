"""Where the default state lives, on models whose answer is known by construction, and
`sinkscope toy mitigations` end to end on a small grid."""

from __future__ import annotations

import json

import pytest
import torch

from sinkscope.cli import main
from sinkscope.infra.errors import InputError
from sinkscope.probes.default_state import default_state_test
from sinkscope.probes.interventions import open_gate, remove_null, run_with_intervention
from sinkscope.probes.probe import ProbeConfig
from sinkscope.probes.runner import probe_model
from sinkscope.reporting import report
from sinkscope.toy.constructions import (
    gated_head_model,
    kv_bias_zero_value_model,
    learned_sink_model,
    relu_exact_model,
    softmax_scaled_model,
)
from sinkscope.toy.evaluate import default_position_mse
from sinkscope.toy.mitigations import MITIGATION_KINDS, PREDICTIONS, measured_source
from sinkscope.toy.task import TaskConfig, eval_batch

TASK = TaskConfig()


@pytest.fixture(scope="module")
def figure_batch():
    return eval_batch(TASK, 200, 7, "single")


@pytest.mark.parametrize(
    ("build", "source"),
    [
        (softmax_scaled_model, "anchor"),
        (learned_sink_model, "null"),
        (kv_bias_zero_value_model, "null"),
        (gated_head_model, "gate"),
    ],
)
def test_each_construction_measures_where_its_default_state_lives(build, source, figure_batch) -> None:
    model = build(TASK, 20.0)
    probe = probe_model(model, figure_batch.tokens, query_mask=figure_batch.default_query_mask(), config=ProbeConfig())
    assert [row.default_source for row in probe.heads] == [source]


def test_relu_rows_are_quiet(figure_batch) -> None:
    probe = probe_model(relu_exact_model(TASK), figure_batch.tokens, query_mask=figure_batch.default_query_mask())
    assert probe.heads[0].default_source == "quiet rows" and probe.heads[0].row_mass == 0.0


@pytest.mark.parametrize(
    ("build", "removal"),
    [(learned_sink_model, remove_null), (kv_bias_zero_value_model, remove_null), (gated_head_model, open_gate)],
)
def test_removing_the_home_of_the_default_state_breaks_it_and_the_control_does_not(build, removal, figure_batch):
    model = build(TASK, 20.0)
    error_fn = default_position_mse(figure_batch.targets, figure_batch.default_query_mask())
    result = default_state_test(model, figure_batch.tokens, [(0, 0)], error_fn, removal=removal)
    row = result.all_sink_heads
    assert row is not None and row.error_before < 1e-10
    assert row.remove_increase.ci_low > 1e-3  # the default state is gone
    assert abs(row.control_increase.mean) < 1e-6  # one random key masked costs nothing
    # removing the anchor's sink costs these models nothing: the anchor holds nothing
    anchor = default_state_test(model, figure_batch.tokens, [(0, 0)], error_fn).all_sink_heads
    assert anchor is not None and abs(anchor.remove_increase.mean) < 1e-6


def test_interventions_a_model_lacks_are_refused_naming_what_it_has(figure_batch) -> None:
    softmax = softmax_scaled_model(TASK, 5.0)
    with pytest.raises(InputError, match="softmax attention has none"):
        run_with_intervention(softmax, figure_batch.tokens, remove_null([(0, 0)]))
    with pytest.raises(InputError, match="attention is softmax, with no gate to open"):
        run_with_intervention(softmax, figure_batch.tokens, open_gate([(0, 0)]))


def test_a_masked_key_in_a_null_slot_kind_rescales_as_its_softmax(figure_batch) -> None:
    """Removing BOS from a learned-sink row gives its mass to the keys and the null in
    proportion: the same as the model computed with BOS's score at -inf."""
    model = learned_sink_model(TASK, 2.0)
    tokens = figure_batch.tokens[:8]
    from sinkscope.probes.interventions import remove_sink

    edited = run_with_intervention(model, tokens, remove_sink([(0, 0)]))

    def bos_hidden(scores, hook):
        scores = scores.clone()
        scores[:, :, 1:, 0] = float("-inf")
        return scores

    direct = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_attn_scores", bos_hidden)])
    torch.testing.assert_close(edited, direct, atol=1e-6, rtol=1e-5)


def test_the_measured_source_is_the_most_common_one_that_holds_a_default_state() -> None:
    assert measured_source({"anchor": 2, "null": 5, "none": 9}) == "null"
    assert measured_source({"anchor": 3, "null": 3}) == "anchor / null"
    assert measured_source({"none": 4}) == "none"
    assert set(PREDICTIONS) == set(MITIGATION_KINDS)


def test_the_command_runs_resumes_and_reports(tmp_path, capsys) -> None:
    out = tmp_path / "mitigations"
    argv = ["toy", "mitigations", "--quick", "--kinds", "softmax,kv_bias,gated_element", "--seeds", "1"]
    argv += ["--max-steps", "30", "--sequences", "40", "--workers", "1", "--no-progress", "--out", str(out), "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [kind["kind"] for kind in summary["kinds"]] == ["softmax", "kv_bias", "gated_element"]
    assert all(
        kind["n_runs"] == 1 and kind["n_converged"] == 0 for kind in summary["kinds"]
    )  # 30 steps: no run converges
    assert all(kind["agrees"] is None for kind in summary["kinds"])  # nothing converged, nothing compared
    gated = next(model for model in summary["models"] if model["attention"] == "gated_element")
    assert gated["gate_state"]["all_sink_heads"] is not None and gated["null_state"] is None
    kv = next(model for model in summary["models"] if model["attention"] == "kv_bias")
    assert kv["null_state"]["all_sink_heads"] is not None and kv["gate_state"] is None
    # a re-run resumes: nothing trains again, the same summary comes back
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["models"] == summary["models"]
    written = report(out)
    assert "no run converged" in written.html.read_text()
    assert written.figures == ()  # nothing converged: no bar to draw
    # another experiment written over one of these runs (or inside it) is refused, even with --overwrite
    run = out / "softmax-1x1-seed0"
    files = sorted(path.name for path in run.rglob("*"))
    capsys.readouterr()
    for target in (run, run / "checkpoints"):
        again = [*argv[: argv.index("--out")], "--out", str(target), "--overwrite"]
        assert main(again) == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and f"the toy run {run}" in error[0] and "--out" in error[0]
    assert sorted(path.name for path in run.rglob("*")) == files


def test_an_unknown_kind_is_one_line_listing_the_kinds(tmp_path, capsys) -> None:
    out = tmp_path / "never"
    assert main(["toy", "mitigations", "--kinds", "softmax,sparsemax", "--no-progress", "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "sparsemax" in error[0] and "learned_sink" in error[0] and "--kinds" in error[0]
    assert not out.exists()


def test_a_model_whose_default_error_is_exactly_zero_evaluates(figure_batch) -> None:
    """softpick rows of scores <= 0 write exactly nothing: a default error of exactly 0.0, and
    the evaluation still finishes (it once divided by zero)."""
    from sinkscope.toy.evaluate import evaluate_model
    from sinkscope.toy.model import ToyModelConfig, ToyTransformer
    from sinkscope.toy.run_dir import RunConfig, TrainConfig

    config = RunConfig(ToyModelConfig(attention="softpick"), TASK, TrainConfig())
    model = ToyTransformer(config.model)
    with torch.no_grad():
        model.attention(0).W_Q.zero_()  # every score 0: every row empty
    evaluation = evaluate_model(model, config, n_sequences=50)
    assert evaluation.default_mse == 0.0 and evaluation.heads[0].default_source == "null"
    assert evaluation.null_state is None  # no slot to remove: softpick's null is its empty rows
    assert evaluation.default_state is not None and evaluation.default_state.all_sink_heads is None  # no sink head
    with pytest.raises(InputError, match="softpick's null is its rows' own emptiness"):
        run_with_intervention(model, figure_batch.tokens, remove_null([(0, 0)]))


def test_an_error_of_exactly_zero_before_has_no_growth_factor() -> None:
    """A head set whose outputs were exact before (an empty softpick row, an exact
    construction) gets no error-growth ratio rather than a division by zero."""
    from sinkscope.probes.default_state import DefaultStateResult, DefaultStateRow, Estimate
    from sinkscope.toy.evaluate import ToyDefaultState

    zero = Estimate(0.0, 0.0, 0.0)
    row = DefaultStateRow("L0H0", ((0, 0),), 0.0, 0.5, 0.0, Estimate(0.5, 0.4, 0.6), zero, float("nan"))
    state = ToyDefaultState.from_result(DefaultStateResult(((0, 0),), 10, (row,), row, ""))
    assert state.error_growth_remove is None and state.error_growth_control is None
    assert state.default_error_after_remove == 0.5


def test_more_seeds_than_can_be_listed_are_refused_before_anything_is_written(tmp_path, capsys) -> None:
    out = tmp_path / "huge"
    with pytest.raises(SystemExit) as refused:  # while parsing: the run list is never built
        main(["toy", "mitigations", "--seeds", "100000000", "--no-progress", "--out", str(out)])
    assert refused.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "an integer in [1, 1000]" in error[0] and "--seeds" in error[0]
    assert not out.exists()


def test_remove_learned_sink_on_a_toy_null_slot_points_to_remove_null(figure_batch) -> None:
    from sinkscope.probes.interventions import remove_learned_sink

    with pytest.raises(InputError, match="has a null slot: use remove_null"):
        run_with_intervention(learned_sink_model(TASK, 5.0), figure_batch.tokens, remove_learned_sink([(0, 0)]))
