"""The toy-vs-pretrained verdict is made from the measured numbers: each pretrained model's
value-weighted anchor share and cancellation stand beside the toy's with their distance
(a difference with a bootstrap interval over sink heads, a ratio for the one-number
cancellation), never a threshold label alone (SmolLM2's 0.408 is not "the toy mechanism"
because it is under 0.5 while the toy's is 0.0005)."""

from __future__ import annotations

import html
import math

import pytest

from sinkscope.mechanism import write_mechanism
from sinkscope.probes.mechanism import MechanismComparison, MechanismHead, MechanismModel
from sinkscope.probes.mechanism_display import mechanism_html
from sinkscope.probes.mechanism_distance import DISTANCE_TABLE, spread, toy_distances
from sinkscope.probes.mechanism_findings import mechanism_findings
from sinkscope.probes.mechanism_report import mechanism_markdown, mechanism_report
from sinkscope.probes.mechanism_rules import CANCELLATION, SHARE


def _model(source: str, kind: str, n_layers: int, shares: list[float], cancellation: float) -> MechanismModel:
    return MechanismModel(
        source=source,
        kind=kind,
        model=source,
        origin="passed in memory",
        directory=None,
        attention="softmax",
        n_layers=n_layers,
        n_heads=4,
        n_inputs=16,
        sink_eps=0.5,
        n_sink_heads=len(shares),
        n_dormant_sink_heads=0,
        sink_anchor_mass=0.9 if shares else math.nan,
        sink_value_weighted_anchor_share=sum(shares) / len(shares) if shares else math.nan,
        sink_anchor_value_norm=1.0 if shares else math.nan,
        attn_out_norm_of_sum=cancellation * 10.0,
        attn_out_sum_of_norms=10.0,
        cancellation=cancellation,
    )


def _heads(model: MechanismModel, shares: list[float]) -> list[MechanismHead]:
    return [
        MechanismHead(model.source, model.kind, k % model.n_layers, k % 4, 0.9, share, 1.0, 1.0, False, 1.0, 2.0)
        for k, share in enumerate(shares)
    ]


def comparison_of(*specs: tuple[str, str, int, list[float], float]) -> MechanismComparison:
    models = [_model(*spec) for spec in specs]
    heads = [head for model, spec in zip(models, specs) for head in _heads(model, spec[3])]
    return MechanismComparison(models=tuple(models), heads=tuple(heads))


TOY = ("toy-4x4", "toy", 4, [0.99, 0.98, 0.995, 0.985, 0.9875], 0.0005)
SMOL = ("SmolLM2", "pretrained", 30, [0.62, 0.55, 0.71, 0.58, 0.66], 0.408)


def test_smollm2_is_reported_by_its_numbers_beside_the_toys():
    comparison = comparison_of(TOY, SMOL)
    text = " ".join(mechanism_findings(comparison))
    assert "toy mechanism" not in text  # the old label from a threshold alone
    verdict = next(line for line in mechanism_findings(comparison) if line.startswith("SmolLM2 beside the toy"))
    assert "0.408" in verdict and "0.0005" in verdict
    assert "816x the toy's" in verdict  # 0.408 / 0.0005
    assert "n = 1 model, no interval" in verdict  # one cancellation ratio per model
    assert verdict.count("n = 5 sink heads") == 2  # SmolLM2's and the toy's
    share = next(d for d in toy_distances(comparison) if d.quantity == SHARE)
    assert share.difference == pytest.approx(0.624 - 0.9875)
    assert f"[{share.difference_low:+.3f}, {share.difference_high:+.3f}]" in verdict  # the difference's interval
    assert share.difference_low <= share.difference <= share.difference_high < 0
    assert "far from the toy's" in verdict and f"So it is unlike the toy in {SHARE} and {CANCELLATION}." in verdict


def test_a_model_near_the_toy_is_called_like_it_from_its_numbers():
    near = ("near", "pretrained", 6, [0.97, 0.99, 0.96], 0.0011)  # within 0.1 and a factor of 3
    verdict = [line for line in mechanism_findings(comparison_of(TOY, near)) if line.startswith("near beside")][0]
    assert "2.2x the toy's" in verdict and "close to the toy's" in verdict
    assert f"So it is like the toy in {SHARE} and {CANCELLATION}." in verdict
    mixed = ("mixed", "pretrained", 6, [0.97, 0.99, 0.96], 0.4)
    line = [line for line in mechanism_findings(comparison_of(TOY, mixed)) if line.startswith("mixed beside")][0]
    assert f"So it is like the toy in {SHARE}, unlike it in {CANCELLATION}." in line


def test_fewer_than_five_sink_heads_have_no_interval():
    """The small-n rule (docs/metrics.md): from 4 heads a percentile bootstrap is about
    their range, so no interval is given; nor for the difference from the toy's."""
    four = ("four", "pretrained", 6, [0.3, 0.4, 0.35, 0.33], 0.5)
    verdict = [line for line in mechanism_findings(comparison_of(TOY, four)) if line.startswith("four beside")][0]
    assert "(n = 4 sink heads, no interval)" in verdict and "difference -0.643," in verdict
    share = next(d for d in toy_distances(comparison_of(TOY, four)) if d.quantity == SHARE)
    assert math.isnan(share.difference_low) and math.isnan(share.difference_high)
    lone = ("lone", "pretrained", 6, [0.3], 0.5)
    verdict = [line for line in mechanism_findings(comparison_of(TOY, lone)) if line.startswith("lone beside")][0]
    assert "0.3 (n = 1 sink head, no interval)" in verdict
    assert math.isnan(spread([0.3], "sink head").low)
    share = next(d for d in toy_distances(comparison_of(TOY, lone)) if d.quantity == SHARE)
    assert math.isnan(share.difference_low)  # no interval from one head


def test_a_model_without_sink_heads_is_measured_on_its_cancellation_only():
    quiet = ("quiet", "pretrained", 6, [], 0.539)
    verdict = [line for line in mechanism_findings(comparison_of(TOY, quiet)) if line.startswith("quiet beside")][0]
    assert "1.08e+03x the toy's" in verdict and SHARE not in verdict.split(":")[1]
    assert verdict.endswith(
        f"So it is unlike the toy in {CANCELLATION} (no sink head at this threshold: no share to compare)."
    )


def test_without_a_toy_there_is_no_distance():
    comparison = comparison_of(SMOL, ("other", "pretrained", 12, [0.2, 0.3], 0.7))
    assert toy_distances(comparison) == []
    assert not any("beside the toy" in line for line in mechanism_findings(comparison))


def test_the_report_shows_the_distances_and_says_what_each_quantity_means(tmp_path):
    comparison = comparison_of(TOY, SMOL)
    write_mechanism(comparison, tmp_path / "mech")
    document = mechanism_report(tmp_path / "mech", tmp_path / "figures")
    sections = {section.title: section for section in document.sections}
    (table,) = sections["Distance from the toy"].blocks
    assert [row[:2] for row in table.rows] == [("SmolLM2", SHARE), ("SmolLM2", CANCELLATION)]
    cancellation = table.rows[1]
    assert cancellation[2] == 0.408 and cancellation[5] == 0.0005 and cancellation[10] == pytest.approx(816.0)
    assert cancellation[3] == "none (n = 1)" and table.rows[0][3].startswith("[")
    meanings = [block for block in sections["How to read it"].blocks if getattr(block, "caption", "") == "Quantities"]
    assert {key for key, _ in meanings[0].items} >= {SHARE, CANCELLATION, "anchor mass"}
    assert DISTANCE_TABLE.caption in mechanism_markdown(comparison)
    assert html.escape(DISTANCE_TABLE.caption) in mechanism_html(comparison)
