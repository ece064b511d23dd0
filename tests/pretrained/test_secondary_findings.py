"""The secondary-sink finding: recurring tokens named, one-off tokens counted, and the
counts adding up to the tokens found."""

from __future__ import annotations


def test_the_finding_names_recurring_tokens_and_counts_one_off_ones_so_they_add_up():
    """40 kept of 172 found: 23 recur, the 17 kept one-offs and the 132 beyond are one-offs
    (the kept list is the most frequent first); tokens quoted, a comma included."""
    import math

    from sinkscope.pretrained_analysis.geometry_sections import _secondary_findings
    from sinkscope.probes.secondary_result import SecondarySinks, SecondarySinkToken

    def token(text: str, sinks: int, position: float) -> SecondarySinkToken:
        return SecondarySinkToken(0, text, 10, sinks, sinks, 0.4, 2, ("L0H0",), math.nan, -1, position)

    recurring = [token(",", 45, 9.7), token("the", 58, 9.4)] + [token(f"w{k}", 2, 5.0) for k in range(21)]
    once = [token(f"first{k}", 1, 1.0 if k < 14 else 3.0) for k in range(17)]
    sinks = SecondarySinks(0.3, 4, 100.0, 1000.0, 64, False, False, 172, tuple(recurring + once), ())
    finding = _secondary_findings(sinks)[0]
    assert "172 tokens over 64 prompts" in finding
    assert "23 tokens in more than one occurrence (the 5 most frequent: \u201c,\u201d (45 of 10 occurrences" in finding
    assert "149 tokens in one occurrence only (14 of the 17 kept sit right after the anchor" in finding  # 23 + 149
    few = SecondarySinks(0.3, 4, 100.0, 1000.0, 2, False, False, 2, (token("the", 3, 2.0), token("x", 1, 1.0)), ())
    assert "1 token in more than one occurrence (all of them: \u201cthe\u201d" in _secondary_findings(few)[0]
    assert "1 token in one occurrence only (1 of the 1 kept" in _secondary_findings(few)[0]
