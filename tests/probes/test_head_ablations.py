"""Head ablations beside sink removal in the default-state test: the zero-ablation equals
the model with the head's W_O block zeroed, the mean-ablation of an input by its own
mean changes nothing, every reading of the rule is reached from the intervals it names,
and tables, findings and files carry the numbers (older files without them still read)."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from sinkscope.infra.codec import read_result, write_result
from sinkscope.probes.default_state import (
    ALL_SINK_HEADS,
    DefaultStateConfig,
    DefaultStateRow,
    Estimate,
    default_state_test,
)
from sinkscope.probes.head_ablation_report import head_ablation_findings, head_ablation_table
from sinkscope.probes.head_ablations import (
    HEAD_MATTERS,
    INCONCLUSIVE,
    MEAN_OUTPUT_MATTERS,
    NO_INCREASE,
    NO_READING,
    SINK_BREAKS_IT,
    head_ablation_reading,
    head_means,
)
from sinkscope.probes.interventions import mean_ablate_head, run_with_intervention
from sinkscope.toy.evaluate import ToyDefaultState
from sinkscope.toy.task import TaskConfig, eval_batch
from tiny_models import toy_sink_model

torch.set_num_threads(1)


def _default_error(model, batch):
    default = batch.default_query_mask()
    with torch.no_grad():
        reference = model(batch.tokens)

    def error(output, prepared):
        squared = (output - reference).pow(2).mean(dim=-1)
        return (squared * default).sum(dim=1) / default.sum(dim=1)

    return error


HEADS = [(0, 0), (1, 1)]  # the constructed sink head and a random one


def _model_and_batch():
    model = toy_sink_model()
    return model, eval_batch(TaskConfig(d_model=8, seq_len=8, eval_trigger_position=5), 32, seed=1, target="residual")


@pytest.fixture(scope="module")
def toy_test():
    model, batch = _model_and_batch()
    error = _default_error(model, batch)
    result = default_state_test(model, batch.tokens, HEADS, error, config=DefaultStateConfig(n_bootstrap=200))
    return model, batch, error, result


def test_zero_ablation_is_the_model_with_the_head_s_output_weights_zeroed(toy_test):
    model, batch, error, result = toy_test
    for row in result.tested_rows():
        edited = copy.deepcopy(model)
        with torch.no_grad():
            for layer, head in row.head_set:
                edited.blocks[layer].attn.W_O[head].zero_()
            expected = error(edited(batch.tokens), None).double()
        assert row.zero_increase is not None
        assert row.zero_increase.mean == pytest.approx(float(expected.mean()), rel=1e-6, abs=1e-12)


def test_mean_ablation_by_an_input_s_own_mean_changes_nothing():
    model = toy_sink_model()
    batch = eval_batch(TaskConfig(d_model=8, seq_len=8), 4, seed=2, target="residual")
    one = batch.tokens[:1]
    means = head_means(model, one.expand(3, -1, -1), batch_size=2)  # chunks add sums and counts exactly
    assert means.n_inputs == 3
    with torch.no_grad():
        clean = model(one)
    ablated = run_with_intervention(model, one, mean_ablate_head([(0, 0), (1, 1)], means))
    assert torch.allclose(ablated, clean, atol=1e-6)
    # another input's mean moves the random head (the sink head writes BOS's value for every input)
    other = run_with_intervention(model, batch.tokens[1:2], mean_ablate_head([(1, 1)], means))
    with torch.no_grad():
        assert not torch.allclose(other, model(batch.tokens[1:2]), atol=1e-4)


def test_the_constructed_sink_head_reads_removing_its_sink_breaks_it(toy_test):
    _, _, _, result = toy_test
    (sink, other) = result.rows
    assert head_ablation_reading(sink) == SINK_BREAKS_IT
    # the sink head writes BOS's value at every default query: its mean output is its output
    assert sink.mean_increase is not None and sink.remove_minus_mean is not None
    assert abs(sink.mean_increase.mean) < 1e-6 * sink.remove_increase.mean
    assert sink.remove_minus_mean.ci_low > 0
    # the removal and control intervals are those of the test without head ablations (own generator)
    model, batch = _model_and_batch()
    config = DefaultStateConfig(n_bootstrap=200, head_ablations=False)
    plain = default_state_test(model, batch.tokens, HEADS, _default_error(model, batch), config=config)
    for with_ablations, without in zip(result.tested_rows(), plain.tested_rows(), strict=True):
        assert with_ablations.remove_increase == without.remove_increase
        assert with_ablations.control_increase == without.control_increase
        assert without.zero_increase is None and head_ablation_reading(without) is None
    assert head_ablation_table(plain.tested_rows(), "error", plain.n_inputs) is None
    assert head_ablation_findings(plain.rows, plain.all_sink_heads, "error", plain.n_inputs) == []


def _row(remove, control, zero, mean, beyond, before=1.0, label="L0H0"):
    return DefaultStateRow(
        label,
        ((0, 0),),
        before,
        before + remove[0],
        before + control[0],
        Estimate(*remove),
        Estimate(*control),
        1.0,
        zero_increase=Estimate(*zero),
        mean_increase=Estimate(*mean),
        remove_minus_mean=Estimate(*beyond),
    )


NONE = (0.0, -0.01, 0.01)
UP = (0.5, 0.4, 0.6)


@pytest.mark.parametrize(
    ("row", "reading"),
    [
        (_row(UP, NONE, NONE, NONE, UP), SINK_BREAKS_IT),
        (_row(UP, UP, NONE, NONE, UP), INCONCLUSIVE),  # no more than the control: not the sink
        (_row(UP, NONE, UP, UP, NONE), HEAD_MATTERS),
        (_row(UP, NONE, UP, UP, (-0.3, -0.4, -0.2)), HEAD_MATTERS),
        (_row(NONE, NONE, UP, NONE, NONE), MEAN_OUTPUT_MATTERS),
        (_row(UP, NONE, NONE, NONE, NONE), INCONCLUSIVE),
        (_row(NONE, NONE, NONE, NONE, NONE), NO_INCREASE),
        (_row((-0.5, -0.6, -0.4), NONE, NONE, NONE, NONE), NO_INCREASE),
        (_row(UP, NONE, NONE, (1e-9, 1e-10, 2e-9), UP), SINK_BREAKS_IT),
        # an increase of a few ulps of the error is rounding, not a head that matters
        (_row(NONE, NONE, NONE, (1e-9, 1e-10, 2e-9), NONE), NO_INCREASE),
        (_row(UP, NONE, NONE, NONE, (0.5, math.nan, math.nan)), INCONCLUSIVE),  # rule 1 undecided, rule 4 holds
        (_row(NONE, NONE, NONE, NONE, (0.5, math.nan, math.nan)), NO_READING),  # no rule holds, one missing
        # a NaN control leaves rule 1 undecided; the mean-ablation still reads
        (_row(UP, (math.nan,) * 3, UP, UP, NONE), HEAD_MATTERS),
        (_row(*[(0.5, math.nan, math.nan)] * 5), NO_READING),
        # sink removal that lowers the error never "breaks" the head, however it compares
        (_row((-0.1, -0.12, -0.08), (-0.5, -0.6, -0.4), NONE, (-0.3, -0.35, -0.25), (0.2, 0.15, 0.25)), NO_INCREASE),
    ],
)
def test_each_reading_follows_the_intervals_it_names(row, reading):
    assert head_ablation_reading(row) == reading


def test_findings_name_the_costliest_single_head_when_it_costs_more_than_all_together():
    alone = [_row(UP, NONE, NONE, NONE, UP, label="L18H8"), _row(NONE, NONE, UP, UP, NONE, label="L3H1")]
    small = (0.1, 0.05, 0.15)
    together = _row(small, NONE, small, small, NONE, label=ALL_SINK_HEADS)
    together = DefaultStateRow(**{**together.__dict__, "head_set": ((18, 8), (3, 1))})
    findings = head_ablation_findings(alone, together, "next-token loss", 16, "prompt")
    assert findings[0].startswith(
        "Head ablations (each head's output zero- or mean-ablated beside its sink removal; next-token loss change, "
        "mean over 16 prompts): of 2 sink heads tested alone, 1 'removing its sink breaks it' (L18H8); "
        "1 'the head matters' (L3H1)."
    )
    assert "All 2 sink heads together: zero-ablation +0.10" in findings[1]
    assert findings[1].endswith("beside their sink removal's +0.100; reading: the heads matter.")
    assert findings[2].startswith("L18H8, the costliest sink removal alone (+0.500): zero-ablation +0.0000")
    assert "mean-ablation +0.0000 [95% CI -0.0100 to 0.0100, n = 16]" in findings[2]
    assert findings[2].endswith(
        "All 2 removed together cost +0.100, less than L18H8 alone and less than the +0.500 that the 2 single removals "
        "add up to (a sum of means)."
    )
    (one,) = head_ablation_findings(alone[:1], None, "error", 16)
    assert (
        "the one sink head tested alone (L18H8) reads 'removing its sink breaks it': without its sink the head" in one
    )
    both = head_ablation_findings([alone[0], alone[0]], None, "error", 16)[0]
    assert "both sink heads tested alone (L18H8, L18H8) read" in both and "each head writes" in both
    # every removal lowering the error: no "costliest" comparison of gains
    down = (-0.5, -0.6, -0.4)
    lowering = [_row(down, NONE, NONE, NONE, NONE), _row((-0.01, -0.02, -0.005), NONE, NONE, NONE, NONE, label="L1H0")]
    all_down = DefaultStateRow(**{**_row(down, NONE, NONE, NONE, NONE, label=ALL_SINK_HEADS).__dict__})
    all_down = DefaultStateRow(**{**all_down.__dict__, "head_set": ((0, 0), (1, 0))})
    assert not any("costliest" in line for line in head_ablation_findings(lowering, all_down, "error", 16))
    table = head_ablation_table([*alone, together], "next-token loss", 16)
    assert table is not None and [row[-1] for row in table.rows] == [SINK_BREAKS_IT, HEAD_MATTERS, "the heads matter"]
    few = head_ablation_table(alone, "next-token loss", 4)  # no interval from 4 inputs: no columns for them
    assert few is not None and not any("95% CI" in column.name for column in few.columns)


def test_rows_with_ablations_persist_and_rows_without_them_still_read(toy_test, tmp_path):
    _, _, _, result = toy_test
    state = ToyDefaultState.from_result(result)
    write_result(tmp_path / "state.json", state)
    assert read_result(tmp_path / "state.json", ToyDefaultState) == state
    raw = json.loads((tmp_path / "state.json").read_text())
    for row in [*raw["rows"], raw["all_sink_heads"]]:  # as a file written before the head ablations
        for name in ("zero_increase", "mean_increase", "remove_minus_mean"):
            del row[name]
    (tmp_path / "old.json").write_text(json.dumps(raw))
    old = read_result(tmp_path / "old.json", ToyDefaultState)
    assert old.rows[0].remove_increase == state.rows[0].remove_increase and old.rows[0].zero_increase is None
    assert head_ablation_table(old.tested_rows(), "error", result.n_inputs) is None
    frame = result.to_dataframe()
    assert list(frame["head_ablation_reading"]) == [head_ablation_reading(row) for row in result.tested_rows()]
    assert frame["mean_increase_ci_low"].iloc[0] == result.rows[0].mean_increase.ci_low
    html = result._repr_html_()
    assert "Head ablations beside sink removal" in html and SINK_BREAKS_IT in html


def test_the_config_refuses_a_non_boolean_switch():
    with pytest.raises(ValueError, match="head_ablations must be True or False"):
        DefaultStateConfig(head_ablations="yes")


def test_repeated_heads_empty_inputs_and_bad_batch_sizes_are_one_line():
    model, batch = _model_and_batch()
    error = _default_error(model, batch)
    with pytest.raises(ValueError, match="names L0H0 more than once; give each head once"):
        default_state_test(model, batch.tokens, [(0, 0), "L0H0"], error)
    with pytest.raises(ValueError, match="at least one input"):
        default_state_test(model, batch.tokens[:0], [(0, 0)], error)
    with pytest.raises(ValueError, match="at least one input"):
        head_means(model, batch.tokens[:0])
    for bad in (0, -1, True, 2.5, "3"):
        with pytest.raises(ValueError, match="batch_size must be a whole number >= 1 or None"):
            head_means(model, batch.tokens, batch_size=bad)


def test_counts_must_be_whole_numbers_and_intervals_carry_their_level():
    """A fractional count is one line, not a silent truncation; a 90% test says 90% in its
    tables, findings and inline display, not 95%."""
    for field in ("batch_size", "max_single_heads", "n_bootstrap"):
        with pytest.raises(ValueError, match=f"{field} must be an integer"):
            DefaultStateConfig(**{field: 1.5})
    model, batch = _model_and_batch()
    error = _default_error(model, batch)
    result = default_state_test(
        model, batch.tokens, HEADS, error, config=DefaultStateConfig(n_bootstrap=200, confidence=0.9)
    )
    assert result.confidence == 0.9
    html = result._repr_html_()
    assert "90% CI low" in html and "95% CI" not in html
    findings = " ".join(
        head_ablation_findings(result.rows, result.all_sink_heads, "error", result.n_inputs, level="90%")
    )
    assert "90% CI" in findings and "95% CI" not in findings


def test_one_sink_head_with_no_single_tests_is_still_tested_once():
    model, batch = _model_and_batch()
    error = _default_error(model, batch)
    config = DefaultStateConfig(n_bootstrap=200, max_single_heads=0)
    result = default_state_test(model, batch.tokens, [(0, 0)], error, config=config)
    assert result.rows == () and result.all_sink_heads is not None and result.all_sink_heads.label == "L0H0"
    assert result.tested_rows() == (result.all_sink_heads,) and "all 1 together" not in result.note
    assert "tested once" in result.note
