"""An audit of a Gemma 2-style checkpoint (windows of 6 tokens on layers 0 and 2) with prompts
several windows long: ``audit.json`` records each layer's window and the share of queries that
cannot see the anchor, the sink rate over both sets of queries, the ablations (sink removal
and its matched control) run on the local layers' sink heads, and the report says which
layers hide the anchor, in every medium, with no ``--max-len`` limit from the window."""

from __future__ import annotations

import json

import pytest
import torch

from sinkscope.cli import main
from sinkscope.pretrained_analysis.audit import read_audit
from windowed_models import build_windowed

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def window_audit(tmp_path_factory):
    directory = build_windowed(tmp_path_factory.mktemp("gemma2"), "gemma2")
    out = tmp_path_factory.mktemp("audit") / "out"
    arguments = ["audit", str(directory), "--n-prompts", "4", "--max-len", "40", "--ablate", "--examples", "1"]
    # sink heads at anchor mass >= 0.2: the local layers' heads (about 0.3 over the queries that see it)
    code = main([*arguments, "--sink-eps", "0.8", "--out", str(out), "--no-progress"])
    assert code == 0
    return out


def test_the_audit_records_windows_and_hidden_shares(window_audit):
    result = read_audit(window_audit)
    probe = result.probe
    assert probe.model.sliding_windows == (6, 0, 6) and probe.model.attention_chunks == ()
    shares = [layer.anchor_hidden_share for layer in probe.layers]
    assert shares[1] == 0.0 and shares[0] == shares[2] > 0.5  # prompts of about 40 tokens, window 6
    assert all(layer.anchor_mass > layer.anchor_mass_all_queries for layer in (probe.layers[0], probe.layers[2]))
    assert all(rate.percent_all_queries == rate.percent_all_queries for rate in probe.sink_rates)  # not NaN
    sinks = result.sink_heads()
    assert sinks and {layer for layer, _ in sinks} <= {0, 2}
    assert result.ablation is not None and result.ablation.default_state.rows
    raw = json.loads((window_audit / "audit.json").read_text())
    assert raw["probe"]["layers"][1]["anchor_mass_all_queries"] is None  # equal to anchor_mass there


def test_the_report_names_the_layers_that_hide_the_anchor(window_audit):
    assert main(["report", str(window_audit), "--overwrite"]) == 0
    markdown = (window_audit / "report.md").read_text()
    assert "In 2 layers (L0, L2) a sliding window or chunk hides the anchor from" in markdown
    assert "queries not seeing the anchor" in markdown and "over every query)" in markdown
    assert "queries not seeing the anchor" in (window_audit / "report.html").read_text()


def test_the_findings_give_each_layer_s_span_and_where_the_sink_heads_sit(window_audit):
    from sinkscope.pretrained_analysis.findings import audit_findings

    result = read_audit(window_audit)
    (spans,) = [line for line in audit_findings(result) if line.startswith("Attention spans:")]
    local = sum(1 for layer, _ in result.sink_heads() if layer in (0, 2))
    assert "sliding window of 6 in layers 0, 2 (2)" in spans and "global in layer 1;" in spans
    assert f"the shortest span (6) is below the longest prompt ({result.prompts.max_tokens} tokens)" in spans
    assert f"{len(result.sink_heads()) - local} sit in global layers and {local} in windowed or chunked ones" in spans
    assert main(["report", str(window_audit), "--overwrite"]) == 0  # an audit writes no report itself
    markdown = (window_audit / "report.md").read_text()
    assert "Attention spans:" in markdown
    assert "| attention spans | sliding window of 6 in layers 0, 2 (2); global in layer 1 |" in markdown
    assert "| 1 | global |" in markdown and "| 0 | sliding window of 6 |" in markdown
