"""The audit report's key-geometry and secondary-sink sections and their findings, made from
the numbers (``sinkscope.probes.geometry_result``, ``sinkscope.probes.secondary_result``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from sinkscope.pretrained_analysis.audit_figures import GEOMETRY_FIGURE
from sinkscope.probes.geometry_result import GEOMETRY_SUMMARY_TABLE, summary_rows
from sinkscope.probes.secondary_result import MASSIVE_TABLE, SECONDARY_TABLE, SecondarySinks, SecondarySinkToken
from sinkscope.reports.document import Block, Paragraph, Section, result_figures
from sinkscope.reports.formatting import plural

if TYPE_CHECKING:
    from sinkscope.pretrained_analysis.audit import AuditResult

TOP_TOKENS = 5  # tokens named in a finding


def has_geometry(result: AuditResult) -> bool:
    return any(not math.isnan(head.anchor_key_norm_ratio) for head in result.probe.heads)


def geometry_sections(source: Path, result: AuditResult) -> list[Section]:
    """The key-geometry figure and summary, and the secondary-sink tables, where measured."""
    sections = []
    if has_geometry(result):
        figure = result_figures(
            source,
            [(GEOMETRY_FIGURE, "key geometry per head: sink heads (red) against the others (grey)")],
            "re-run the audit to draw it",
        )
        sections.append(
            Section("Key geometry", (*figure, GEOMETRY_SUMMARY_TABLE.table(summary_rows(result.probe.heads))))
        )
    sinks = result.probe.secondary_sinks
    if sinks is not None:
        blocks: list[Block] = [Paragraph(f"Thresholds: {sinks.rule()}.")]
        if sinks.tokens:
            kept = f"{len(sinks.tokens)} tokens kept of the {sinks.n_sink_tokens:,} found, most frequent first"
            note = f"{SECONDARY_TABLE.note} {kept}." if len(sinks.tokens) < sinks.n_sink_tokens else None
            blocks.append(SECONDARY_TABLE.table(sinks.tokens, limit=20, note=note))
        else:
            blocks.append(Paragraph("No key other than the anchor passes the threshold in any head."))
        if sinks.residuals_read and sinks.massive:
            blocks.append(MASSIVE_TABLE.table(sinks.massive, limit=20))
        elif sinks.residuals_read:
            blocks.append(Paragraph("No token carries a massive activation."))
        sections.append(Section("Secondary sinks", tuple(blocks)))
    return sections


def _geometry_finding(result: AuditResult) -> str | None:
    rows = {(row.metric, row.group): row.spread for row in summary_rows(result.probe.heads)}
    stage = "after RoPE" if ("cos(q, k_anchor) after RoPE", "sink heads") in rows else ""
    cosine = "cos(q, k_anchor)" + (f" {stage}" if stage else "")
    other = "cos(q, k_other)" + (f" {stage}" if stage else "")
    sink, rest = rows[(cosine, "sink heads")], rows[(cosine, "other heads")]
    if sink.n == 0:
        return None
    key, value = "\u2016k_anchor\u2016 / median \u2016k\u2016", "\u2016v_anchor\u2016 / median \u2016v\u2016"
    return (
        f"Key geometry{f' ({stage})' if stage else ''}: sink heads' queries have mean cosine {sink.text()} with the "
        f"anchor's key and {rows[(other, 'sink heads')].text()} with the other keys; the other heads "
        f"{rest.text()} and {rows[(other, 'other heads')].text()}. The anchor's key norm over the median key's: "
        f"{rows[(key, 'sink heads')].text()} in sink heads, {rows[(key, 'other heads')].text()} in the others; its "
        f"value norm over the median value's: {rows[(value, 'sink heads')].text()} and "
        f"{rows[(value, 'other heads')].text()}. Means over heads; each head's cosine is a mean over every query, "
        "its norm ratio a mean over prompts."
    )


def _quoted(token: str) -> str:
    """A token's text in quotes: "," or " the" read as tokens, not as punctuation of the sentence."""
    return f"\u201c{token}\u201d"


def _token_list(rows: tuple[SecondarySinkToken, ...]) -> str:
    return "; ".join(
        f"{_quoted(row.token)} ({row.sink_occurrences} of {plural(row.occurrences, 'occurrence')}, mean position "
        f"{row.mean_position:.1f}, in {plural(row.n_heads, 'head')}, mean mass {row.mean_mass:.2f})"
        for row in rows[:TOP_TOKENS]
    )


def _recurring(rows: tuple[SecondarySinkToken, ...]) -> str:
    if not rows:
        return "no token is a secondary sink more than once"
    shown = f"the {min(TOP_TOKENS, len(rows))} most frequent" if len(rows) > TOP_TOKENS else "all of them"
    return f"{plural(len(rows), 'token')} in more than one occurrence ({shown}: {_token_list(rows)})"


def _one_offs(rows: tuple[SecondarySinkToken, ...], n_once: int) -> str:
    """The tokens that are a sink in one occurrence only, as a count: listed one by one they
    read as a finding about the token, while most are the first word after the anchor.
    ``rows``: those kept in the result; ``n_once``: all of them."""
    after_anchor = sum(row.mean_position == 1.0 for row in rows)
    where = f"{after_anchor} of the {len(rows)} kept sit right after the anchor, at position 1"
    return f"{plural(n_once, 'token')} in one occurrence only ({where})"


def _secondary_findings(sinks: SecondarySinks) -> list[str]:
    if not sinks.tokens:
        return [f"No secondary sinks: no key other than the anchor passes the threshold ({sinks.rule()})."]
    recurring = tuple(row for row in sinks.tokens if row.sink_occurrences >= 2)
    once = tuple(row for row in sinks.tokens if row.sink_occurrences < 2)
    # the result keeps the most frequent tokens: those beyond it are one-offs once any kept one is
    n_once = sinks.n_sink_tokens - len(recurring) if once else 0
    named = _recurring(recurring)
    rest = f"; {_one_offs(once, n_once)}" if once else ""
    findings = [
        f"Secondary sinks ({plural(sinks.n_sink_tokens, 'token')} over {plural(sinks.n_prompts, 'prompt')}; mean "
        f"attention from later queries \u2265 {sinks.min_mass:g}): {named}{rest}."
    ]
    if sinks.residuals_read and sinks.massive:
        carriers = "; ".join(
            f"{_quoted(row.token)} ({plural(row.occurrences, 'occurrence')}, {row.at_anchor} as the anchor, from layer {row.first_layer}, "
            f"max |x| {row.max_abs:,.0f})"
            for row in sinks.massive[:TOP_TOKENS]
        )
        tied = [row for row in (recurring or sinks.tokens)[:TOP_TOKENS] if row.massive_share > 0]
        tie = (
            "; of the top secondary sinks, "
            + ", ".join(f"{_quoted(row.token)} {row.massive_share:.0%}" for row in tied)
            + " of sink occurrences carry one"
            if tied
            else "; none of the top secondary sinks carries one"
        )
        findings.append(
            f"Massive activations (|x| > {sinks.massive_abs:g} and > {sinks.massive_ratio:g} x the prompt's median) "
            f"sit on: {carriers}{tie}."
        )
    return findings


def geometry_findings(result: AuditResult) -> list[str]:
    """The key-geometry sentence and the secondary-sink sentences, where measured."""
    findings = []
    if has_geometry(result):
        sentence = _geometry_finding(result)
        if sentence:
            findings.append(sentence)
    if result.probe.secondary_sinks is not None:
        findings.extend(_secondary_findings(result.probe.secondary_sinks))
    return findings


def geometry_parts(result: AuditResult) -> list[str]:
    """The same tables for the inline notebook display (no figure: it lives beside audit.json)."""
    from sinkscope.reports.html import inline_table

    parts = []
    if has_geometry(result):
        parts.append(inline_table(GEOMETRY_SUMMARY_TABLE.table(summary_rows(result.probe.heads))))
    sinks = result.probe.secondary_sinks
    if sinks is not None:
        parts.append(inline_table(SECONDARY_TABLE.table(sinks.tokens, note=sinks.rule(), limit=20)))
    return parts
