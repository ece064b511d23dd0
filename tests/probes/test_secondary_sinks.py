"""Secondary sinks and massive activations against transformers' eager attention and hidden
states: a tiny GPT-2 whose "." token is planted as a secondary sink of L0H0 by hand-set
weights (its embedding has one huge coordinate, which is also a massive activation, and
the head's keys read that coordinate), each prompt run alone with no padding."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
import torch

from sinkscope.infra.codec import read_result, write_result
from sinkscope.probes.probe import SECONDARY_MIN_MASS, SECONDARY_MIN_QUERIES, ProbeConfig, ProbeResult
from sinkscope.probes.runner import probe_model
from tiny_models import build_tiny_gpt2, load_bridge, load_hf_model, toy_sink_model, train_byte_level_tokenizer

PROMPTS = [
    "The fox ran. The dog sat on the mat and slept",
    "Sinks park mass. Then the rest follows on",
    "A short one. Ends here now",
    "No delimiter in this prompt at all",
]
MASSIVE_COORDINATE, MASSIVE_VALUE = 5, 1.0e4
CONFIG = ProbeConfig(with_secondary_sinks=True, batch_size=3)


def plant_delimiter_sink(model, token_id: int, layer: int = 0, head: int = 0, strength: float = 10.0) -> None:
    """Token ``token_id`` gets a huge embedding coordinate; ``(layer, head)``'s keys read it and
    its query is a constant, so every later query of that head attends to the token."""
    width = model.config.n_embd
    d_head = width // model.config.n_head
    c_attn = model.transformer.h[layer].attn.c_attn
    q, k = slice(head * d_head, (head + 1) * d_head), slice(width + head * d_head, width + (head + 1) * d_head)
    with torch.no_grad():
        model.transformer.wte.weight[token_id, MASSIVE_COORDINATE] = MASSIVE_VALUE
        for cols in (q, k):
            c_attn.weight[:, cols] = 0.0
            c_attn.bias[cols] = 0.0
        c_attn.bias[q.start] = strength
        c_attn.weight[MASSIVE_COORDINATE, k.start] = 3.0


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    tokenizer = train_byte_level_tokenizer()
    dot = tokenizer.convert_tokens_to_ids(".")
    directory = build_tiny_gpt2(tmp_path_factory.mktemp("gpt2") / "m")
    hf = load_hf_model(directory)
    plant_delimiter_sink(hf, dot)
    hf.save_pretrained(directory)
    rows = [[tokenizer.bos_token_id, *tokenizer(text)["input_ids"]] for text in PROMPTS]
    width = max(len(row) for row in rows)
    ids = torch.tensor([row + [tokenizer.bos_token_id] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    result = probe_model(load_bridge(directory), ids, attention_mask=mask, config=CONFIG)
    return result, hf, rows, dot


def reference_hits(model, rows: list[list[int]], later_only: bool = True) -> dict[int, dict]:
    """Per token id: occurrences, sink occurrences, head hits and summed mass, from eager attention."""
    tallies: dict[int, dict] = defaultdict(
        lambda: {"occ": 0, "sink": 0, "pos": 0, "hits": 0, "mass": 0.0, "heads": Counter()}
    )
    for row in rows:
        with torch.no_grad():
            attentions = model(torch.tensor([row]), output_attentions=True).attentions
        n = len(row)
        for pos, token in enumerate(row):
            tallies[token]["occ"] += 1
            hit = False
            for layer, pattern in enumerate(attentions):
                queries = range(pos + 1, n) if later_only else range(max(pos, 1), n)
                if pos == 0 or len(queries) < SECONDARY_MIN_QUERIES:
                    continue
                for head in range(pattern.shape[1]):
                    mass = float(pattern[0, head, list(queries), pos].mean())
                    if mass >= SECONDARY_MIN_MASS:
                        hit = True
                        tallies[token]["hits"] += 1
                        tallies[token]["mass"] += mass
                        tallies[token]["heads"][f"L{layer}H{head}"] += 1
            tallies[token]["sink"] += hit
            tallies[token]["pos"] += pos if hit else 0  # the anchor is position 0 here
    return tallies


def reference_massive(model, rows: list[list[int]]) -> dict[int, tuple[int, int]]:
    """Per token id: (occurrences with a massive residual entry after some block, first block)."""
    found: dict[int, tuple[int, int]] = {}
    for row in rows:
        outputs: list[torch.Tensor] = []
        handles = [
            block.register_forward_hook(
                lambda _m, _i, out, seen=outputs: seen.append(out[0] if isinstance(out, tuple) else out)
            )
            for block in model.transformer.h
        ]
        with torch.no_grad():
            model(torch.tensor([row]))
        for handle in handles:
            handle.remove()
        first_layer = {}
        for layer, resid in enumerate(outputs):
            magnitude = resid[0].abs()
            massive = ((magnitude > 100.0) & (magnitude > 1000.0 * magnitude.median())).any(dim=-1)
            for pos in massive.nonzero().flatten().tolist():
                first_layer.setdefault(pos, layer)
        for pos, layer in first_layer.items():
            count, first = found.get(row[pos], (0, layer))
            found[row[pos]] = (count + 1, min(first, layer))
    return found


def test_every_secondary_sink_matches_eager_attention(planted):
    result, hf, rows, _ = planted
    sinks = result.secondary_sinks
    expected = {token: tally for token, tally in reference_hits(hf, rows).items() if tally["hits"]}
    assert {row.token_id for row in sinks.tokens} == set(expected)
    for row in sinks.tokens:
        tally = expected[row.token_id]
        assert (row.occurrences, row.sink_occurrences, row.head_hits) == (tally["occ"], tally["sink"], tally["hits"])
        assert row.mean_mass == pytest.approx(tally["mass"] / tally["hits"], abs=1e-5)
        assert row.mean_position == pytest.approx(tally["pos"] / tally["sink"])
        assert set(row.heads) <= set(tally["heads"]) and row.n_heads == len(tally["heads"])


def test_the_planted_delimiter_is_the_top_secondary_sink_and_carries_the_massive_activation(planted):
    result, _, rows, dot = planted
    top = result.secondary_sinks.tokens[0]
    n_dots = sum(row.count(dot) for row in rows)
    assert top.token_id == dot and top.sink_occurrences == n_dots and "L0H0" in top.heads
    assert top.mean_mass > 0.9
    assert top.massive_share == 1.0 and top.first_massive_layer == 0


def test_massive_tokens_match_the_hidden_states(planted):
    result, hf, rows, dot = planted
    expected = reference_massive(hf, rows)
    got = {row.token_id: (row.occurrences, row.first_layer) for row in result.secondary_sinks.massive}
    assert got == expected and dot in got


def test_counting_the_key_s_own_query_would_change_the_tally(planted):
    """Mutation check: queries at the key itself must not count ("later" queries only)."""
    result, hf, rows, _ = planted
    with_own = {token: tally for token, tally in reference_hits(hf, rows, later_only=False).items() if tally["hits"]}
    got = {row.token_id: (row.head_hits, round(row.mean_mass, 4)) for row in result.secondary_sinks.tokens}
    assert got != {token: (t["hits"], round(t["mass"] / t["hits"], 4)) for token, t in with_own.items()}


def test_the_result_persists_and_shows(planted, tmp_path):
    result, _, _, dot = planted
    write_result(tmp_path / "probe.json", result)
    again = read_result(tmp_path / "probe.json", ProbeResult)
    assert again.secondary_sinks == result.secondary_sinks
    sinks = result.secondary_sinks.with_token_text(lambda token_id: "DOT" if token_id == dot else str(token_id))
    frame = sinks.to_dataframe()
    assert frame.iloc[0]["token"] == "DOT" and {"mean_mass", "heads", "massive_share"} <= set(frame)
    html = sinks._repr_html_()
    assert "DOT" in html and "Tokens carrying massive activations" in html and "0.3" in html


def test_toy_inputs_are_tallied_by_position():
    torch.manual_seed(0)
    tokens = torch.randn(5, 8, 8)
    result = probe_model(toy_sink_model(), tokens, config=CONFIG)
    sinks = result.secondary_sinks
    assert sinks.by_position and all(row.token == f"position {row.token_id}" for row in sinks.tokens)
    assert all(row.token_id != 0 for row in sinks.tokens)  # the anchor is never a secondary sink
    assert probe_model(toy_sink_model(), tokens).secondary_sinks is None
