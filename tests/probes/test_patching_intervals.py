"""Activation patching's intervals: each site's effect and normalised effect with a 95%
bootstrap interval over input pairs, checked against a resampling written out by hand
(the same draws); none from one pair or from a metric that returns only batch means; and
the toy patch report's chart of the largest effects draws them as whiskers in a browser."""

from __future__ import annotations

import math

import pytest
import torch
from test_probes_patching import TASK, projection_on_source_target, trigger_pair

from browser import Chromium, find_chromium, pixels
from sinkscope.infra.codec import read_result, write_result
from sinkscope.infra.errors import InputError
from sinkscope.probes.patching import MetricContext, PatchingResult, activation_patching
from sinkscope.probes.patching_intervals import CONFIDENCE, N_BOOTSTRAP, patching_intervals
from sinkscope.reporting import report
from sinkscope.toy.constructions import relu_exact_model
from sinkscope.toy.model import ToyModelConfig, ToyTransformer
from sinkscope.toy.patching import HEADS_FILE, PATCHING_FILE, POSITIONS_FILE, trigger_patching

torch.set_num_threads(1)


def by_hand(source, target, patched, seed: int = 0):
    """Every draw's means computed from indices, one site at a time, and the percentile ends."""
    n = target.shape[0]
    picks = torch.randint(0, n, (N_BOOTSTRAP, n), generator=torch.Generator().manual_seed(seed))
    tail = (1 - CONFIDENCE) / 2
    ends = []
    for site in patched:
        effect = site[picks].mean(dim=1) - target[picks].mean(dim=1)
        normalised = effect / (source[picks].mean(dim=1) - target[picks].mean(dim=1))
        levels = torch.tensor([tail, 1 - tail], dtype=torch.float64)
        ends.append((*torch.quantile(effect, levels).tolist(), *torch.nanquantile(normalised, levels).tolist()))
    return ends


def test_the_intervals_are_a_paired_bootstrap_over_inputs():
    generator = torch.Generator().manual_seed(1)
    source = torch.rand(40, generator=generator, dtype=torch.float64) + 1.0
    target = torch.rand(40, generator=generator, dtype=torch.float64)
    patched = (
        target + torch.rand(300, 40, generator=generator, dtype=torch.float64) * torch.linspace(0, 1, 300)[:, None]
    )
    intervals = patching_intervals(source, target, patched)  # 300 sites: more than one block of sites
    expected = torch.tensor(by_hand(source, target, patched), dtype=torch.float64)
    computed = torch.stack(
        [intervals.effect_low, intervals.effect_high, intervals.normalised_low, intervals.normalised_high], dim=1
    )
    torch.testing.assert_close(computed, expected, rtol=1e-9, atol=1e-12)
    effects = patched.mean(dim=1) - target.mean()
    assert bool(((intervals.effect_low <= effects) & (effects <= intervals.effect_high)).all())
    assert bool((intervals.effect_high - intervals.effect_low > 0)[1:].all())


def test_patching_rows_carry_their_intervals_and_the_json_keeps_them(tmp_path):
    batch, untriggered = trigger_pair(n=24)
    model = ToyTransformer(ToyModelConfig(d_model=TASK.d_model, n_layers=2, n_heads=2))
    metric = projection_on_source_target(batch)
    result = activation_patching(model, batch.tokens, untriggered, "z", metric, per=("layer", "head"))
    assert result.n_inputs == 24 and not any("interval" in note for note in result.notes)
    for row in result.rows:
        assert row.effect_ci_low <= row.effect <= row.effect_ci_high
        assert row.normalised_effect_ci_low <= row.normalised_effect_ci_high
    write_result(tmp_path / "patching.json", result)
    assert read_result(tmp_path / "patching.json", PatchingResult).rows == result.rows
    frame = result.to_dataframe()
    assert {"effect_ci_low", "normalised_effect_ci_high"} <= set(frame.columns) and frame["effect_ci_low"].notna().all()


def test_no_interval_from_one_pair_or_from_batch_means():
    batch, untriggered = trigger_pair(n=8)
    model, metric = relu_exact_model(TASK), projection_on_source_target(batch)
    one = activation_patching(model, batch.tokens[:1], untriggered[:1], "resid_pre", metric, per=("layer",))
    assert one.notes == ("n = 1 input pair, no interval (fewer than 5)",)
    assert all(math.isnan(row.effect_ci_low) and math.isnan(row.normalised_effect_ci_high) for row in one.rows)
    four = activation_patching(model, batch.tokens[:4], untriggered[:4], "resid_pre", metric, per=("layer",))
    assert four.notes == ("n = 4 input pairs, no interval (fewer than 5)",)
    assert all(math.isnan(row.effect_ci_high) for row in four.rows)
    five = activation_patching(model, batch.tokens[:5], untriggered[:5], "resid_pre", metric, per=("layer",))
    assert not five.notes and all(row.effect_ci_low <= row.effect <= row.effect_ci_high for row in five.rows)

    def batch_mean(output: torch.Tensor, context: MetricContext) -> torch.Tensor:
        return metric(output, context).mean()

    means = activation_patching(model, batch.tokens, untriggered, "resid_pre", batch_mean, per=("layer",), batch_size=3)
    per_input = activation_patching(model, batch.tokens, untriggered, "resid_pre", metric, per=("layer",), batch_size=3)
    assert [row.effect for row in means.rows] == pytest.approx([row.effect for row in per_input.rows], abs=1e-6)
    assert all(math.isnan(row.effect_ci_high) for row in means.rows)
    assert any("one value per batch" in note and "return a tensor [batch]" in note for note in means.notes)


@pytest.mark.skipif(find_chromium() is None, reason="Debian's chromium is not installed (apt-get install -y chromium)")
def test_the_toy_patch_report_draws_the_largest_effects_with_whiskers(tmp_path):
    torch.manual_seed(0)
    model = ToyTransformer(ToyModelConfig(d_model=TASK.d_model, n_layers=2, n_heads=2))
    patch_dir = tmp_path / "patch"
    patch_dir.mkdir()
    patched = trigger_patching(model, TASK, n_inputs=32)
    for name, result in (
        (PATCHING_FILE, patched),
        (HEADS_FILE, patched.per_head),
        (POSITIONS_FILE, patched.per_position),
    ):
        write_result(patch_dir / name, result)  # the files `sinkscope toy patch` writes
    html = report(patch_dir).html
    with Chromium() as chromium:
        page = chromium.open(html)
        text = page.evaluate("document.body.innerText")
        assert text.count("whiskers: 95% bootstrap intervals over 32 input pairs") == 2
        assert "95% CI" in text and "normalised 95% CI low" in text
        width, height, bars = pixels(page, "z patched per head: the 4 of 4 sites", "#d9480f", tol=12)
        assert len(bars) > 200  # the effects' bars
        _, _, whiskers = pixels(page, "z patched per head: the 4 of 4 sites", "#1d2330", tol=40, bluish=True)
        assert sum(1 for _, y in whiskers if y < height * 0.85) >= 8  # four whiskers with caps


def test_no_pairs_and_non_finite_metrics_are_refused_in_one_line():
    batch, untriggered = trigger_pair(n=8)
    model, metric = relu_exact_model(TASK), projection_on_source_target(batch)
    with pytest.raises(InputError, match="at least one pair"):
        activation_patching(model, batch.tokens[:0], untriggered[:0], "resid_pre", metric, per=("layer",))

    def nan_for_input_3(output: torch.Tensor, context: MetricContext) -> torch.Tensor:
        values = metric(output, context).clone()
        values[context.rows == 3] = float("nan")
        return values

    with pytest.raises(InputError, match=r"NaN or infinity for 1 of the 8 inputs of a batch \(input 3 first\)"):
        activation_patching(model, batch.tokens, untriggered, "resid_pre", nan_for_input_3, per=("layer",))


def test_a_denominator_that_vanishes_in_some_draw_gives_no_normalised_interval():
    source = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.01], dtype=torch.float64)
    target = torch.zeros(5, dtype=torch.float64)
    patched = torch.ones(2, 5, dtype=torch.float64)
    intervals = patching_intervals(source, target, patched)
    assert not intervals.normalised_defined
    assert bool(torch.isnan(intervals.normalised_low).all() and torch.isnan(intervals.normalised_high).all())
    assert bool(torch.isfinite(intervals.effect_low).all())  # the effect keeps its interval
    steady = patching_intervals(source.abs() + 1.0, target, patched)
    assert steady.normalised_defined and bool(torch.isfinite(steady.normalised_low).all())


def test_an_interval_below_zero_is_drawn_below_zero(tmp_path):
    from matplotlib.figure import Figure as MplFigure

    from sinkscope.reports.bars import IntervalSeries, draw_interval_bars

    ax = MplFigure().subplots()
    draw_interval_bars(ax, ["a", "b"], [IntervalSeries("effect", [0.5, 1e-4], [0.4, -3.5e-4], [0.6, 3.5e-4])])
    assert ax.get_ylim()[0] < -3e-4  # the whisker's low end is on the axis, not cut at 0
