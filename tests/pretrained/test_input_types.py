"""Input types (prompts, random tokens, one token repeated) in the audit, with known answers:
a planted BOS sink that every input type keeps (the BOS stays first by the anchor
convention), checked against transformers' eager attention on the very tokens; and a
model without position information, where one token repeated makes every key alike, so
every head attends uniformly and the sink disappears by construction (alpha = H_T / T)."""

from __future__ import annotations

import json

import pytest
import torch

from sinkscope.cli import main
from sinkscope.infra.errors import InputError
from sinkscope.pretrained_analysis.audit import AuditConfig, audit, read_audit, write_audit
from sinkscope.pretrained_analysis.input_types import input_type_tokens
from sinkscope.pretrained_analysis.loading import LoadSpec, load_model
from sinkscope.pretrained_analysis.prompts import ordinary_tokens, prompt_set, tokenize_prompts
from sinkscope.probes.sink_curves import prompt_sink_rates
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2, load_hf_model

# five prompts: the fewest that give a bootstrap interval (sinkscope.infra.intervals)
FIVE_PROMPTS = [
    *TINY_GPT2_PROMPTS,
    "Heads with nothing to do look at the start.",
    "Ten short words make a small prompt.",
]

TYPES = ("prompts", "random", "repeated")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return build_tiny_gpt2(tmp_path_factory.mktemp("planted"), bos_sink_head=(0, 1))


@pytest.fixture(scope="module")
def positionless(tmp_path_factory):
    """A tiny GPT-2 with a sink planted on the BOS token's embedding (head (0, 1)) and its
    position embeddings zeroed: it cannot tell positions apart."""
    directory = build_tiny_gpt2(tmp_path_factory.mktemp("positionless"), bos_sink_head=(0, 1))
    model = load_hf_model(directory)
    with torch.no_grad():
        model.transformer.wpe.weight.zero_()
    model.save_pretrained(directory)
    return directory


def eager_first_column(directory, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[prompt, layer, head, query]`` attention on position 0, from eager attention."""
    with torch.no_grad():
        out = load_hf_model(directory).eval()(tokens, attention_mask=mask.long(), output_attentions=True)
    return torch.stack([pattern[..., 0].double() for pattern in out.attentions], dim=1)


def per_prompt_means(column: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each prompt's alpha_0 and anchor mass ``[prompt, layer, head]`` over its real queries."""
    real = mask.double().view(mask.shape[0], 1, 1, -1)
    after = real.clone()
    after[..., 0] = 0.0
    return (column * real).sum(-1) / real.sum(-1), (column * after).sum(-1) / after.sum(-1)


def test_input_type_tokens_keep_lengths_padding_and_the_prepended_anchor():
    tokens = torch.tensor([[7, 11, 12, 13], [7, 21, 0, 0]])
    mask = tokens != 0
    candidates = torch.tensor([100, 101, 102])
    for prefixed in (True, False):
        random = input_type_tokens(tokens, mask, "random", candidates, prefixed, seed=0)
        repeated = input_type_tokens(tokens, mask, "repeated", candidates, prefixed, seed=0)
        body = slice(1 if prefixed else 0, None)
        for drawn in (random, repeated):
            assert bool((drawn[~mask] == 0).all())  # padding untouched
            assert bool(torch.isin(drawn[0, body], candidates).all()) and bool(
                torch.isin(drawn[1, body][:1], candidates).all()
            )
            assert (drawn[:, 0].tolist() == [7, 7]) == prefixed
        assert len(set(repeated[0, body].tolist())) == 1  # one token per row
    assert torch.equal(input_type_tokens(tokens, mask, "prompts", candidates, True, 0), tokens)
    assert torch.equal(
        input_type_tokens(tokens, mask, "random", candidates, True, 5),
        input_type_tokens(tokens, mask, "random", candidates, True, 5),
    )


def test_a_planted_bos_sink_stays_under_every_input_type_as_eager_attention_says(planted, tmp_path):
    texts = list(FIVE_PROMPTS)
    config = AuditConfig(input_types=TYPES, eps_curve=(0.3, 0.9), n_examples=0)
    result = audit(LoadSpec(str(planted)), texts, config, progress=False)
    curves = result.experiments
    assert curves is not None and [row.input_type for row in curves.input_types] == list(TYPES)
    assert curves.n_forwards == 2  # the prompts ride on the probe's own pass
    loaded = load_model(LoadSpec(str(planted)), progress=False)
    tokenized = tokenize_prompts(prompt_set(texts), loaded)
    assert tokenized.summary.anchor_how == "prepended"
    for row in curves.input_types:
        tokens = input_type_tokens(
            tokenized.tokens, tokenized.attention_mask, row.input_type, ordinary_tokens(loaded), True, 0
        )
        alpha, mass = per_prompt_means(
            eager_first_column(planted, tokens, tokenized.attention_mask), tokenized.attention_mask
        )
        assert bool((alpha[:, 0, 1] > 0.9).all())  # the planted head keeps its sink: BOS stays first
        assert row.sink_rate.mean == pytest.approx(float(prompt_sink_rates(alpha, 0.3).mean()), abs=1e-6)
        assert row.anchor_mass.mean == pytest.approx(float(mass.flatten(1).mean(1).mean()), abs=1e-6)
        assert row.sink_rate.n == len(texts) and row.sink_rate.ci_low <= row.sink_rate.mean <= row.sink_rate.ci_high
    html = result._repr_html_()  # the notebook shows the report's tables
    assert "Sink rate and anchor mass per input type" in html and "Sink rate against" in html
    assert set(curves.to_dataframe()["input_type"]) == set(TYPES)
    write_audit(result, tmp_path / "audit")
    assert read_audit(tmp_path / "audit").experiments == curves


def test_one_token_repeated_removes_the_sink_of_a_model_blind_to_position(positionless):
    # the prompts start with the sink's token as their own text, not as a BOS the convention
    # keeps (prepend_bos off): random and repeated rows replace it too
    texts = ["<|endoftext|>" + text for text in FIVE_PROMPTS]
    config = AuditConfig(input_types=TYPES, lengths=(8, 16), n_examples=0)
    spec = prompt_set(texts, prepend_bos=False, parse_special_tokens=True)
    curves = audit(LoadSpec(str(positionless)), spec, config, progress=False).experiments
    rows = {row.input_type: row for row in curves.input_types}
    loaded = load_model(LoadSpec(str(positionless)), progress=False)
    tokenized = tokenize_prompts(spec, loaded)
    lengths = tokenized.attention_mask.sum(dim=1).double()
    # identical keys and values at every position: uniform attention, A[i, 0] = 1 / (i + 1)
    harmonic = torch.tensor([sum(1.0 / (i + 1) for i in range(int(n))) for n in lengths])
    expected_alpha = harmonic / lengths
    expected_mass = (harmonic - 1.0) / (lengths - 1.0)
    assert rows["repeated"].anchor_mass.mean == pytest.approx(float(expected_mass.mean()), abs=1e-6)
    assert bool((expected_alpha < 0.3).all()) and rows["repeated"].sink_rate.mean == 0.0
    at = {(p.input_type, p.length): p for p in curves.length_curve}
    for length in (8, 16):
        h = sum(1.0 / (i + 1) for i in range(length))
        assert at[("repeated", length)].anchor_mass.mean == pytest.approx((h - 1.0) / (length - 1.0), abs=1e-6)
    assert tokenized.summary.anchor_how == "off"
    # on the prompts the planted head is a sink: 1 of 4 heads at least; the repeated token has none
    assert rows["prompts"].sink_rate.mean >= 25.0 and rows["prompts"].sink_rate.ci_low >= 25.0


def test_the_default_audit_runs_no_experiment(planted):
    result = audit(LoadSpec(str(planted)), list(TINY_GPT2_PROMPTS), AuditConfig(n_examples=0), progress=False)
    assert result.experiments is None


def test_the_cli_runs_the_experiments_into_the_report_and_refuses_an_unknown_type(planted, tmp_path, capsys):
    out = tmp_path / "audit"
    argv = ["audit", str(planted), "--prompt", TINY_GPT2_PROMPTS[0], "--prompt", TINY_GPT2_PROMPTS[1]]
    flags = ["--input-types", "prompts,repeated", "--eps-curve", "0.2,0.6", "--lengths", "4,8", "--examples", "0"]
    assert main([*argv, *flags, "--out", str(out)]) == 0
    saved = json.loads((out / "audit.json").read_text())
    assert saved["config"]["input_types"] == ["prompts", "repeated"]
    assert [row["input_type"] for row in saved["experiments"]["input_types"]] == ["prompts", "repeated"]
    assert main(["report", str(out)]) == 0
    markdown = (out / "report.md").read_text()
    assert "Sink rate and anchor mass per input type" in markdown and "sink_rate_eps.png" in markdown
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        main([*argv, "--input-types", "prompts,shuffled", "--out", str(tmp_path / "bad")])
    assert refused.value.code == 2
    error = capsys.readouterr().err.strip()  # refused while parsing: nothing loads
    assert "--input-types" in error and "shuffled" in error and "prompts, random, repeated" in error
    assert "\n" not in error


def test_experiment_settings_are_ordered_bounded_and_reachable(planted, tmp_path, capsys):
    assert AuditConfig(eps_curve=(0.9, 0.1, 0.5, 0.1)).eps_curve == (0.1, 0.5, 0.9)  # drawn in order, once each
    for bad, words in (
        ({"lengths": (10**30,)}, "every length must lie in 2..1,048,576"),
        ({"seed": -1, "input_types": ("random",)}, "seed must be >= 0"),
        ({"n_bootstrap": 1}, "n_bootstrap must be >= 20"),
    ):
        with pytest.raises(InputError, match=words):
            AuditConfig(**bad)
    longest = "The quick brown fox jumps over the lazy dog."
    with pytest.raises(InputError, match="no prompt reaches T = 500"):  # refused before the probe, not an empty point
        audit(LoadSpec(str(planted)), [longest], AuditConfig(n_examples=0, lengths=(4, 500)), progress=False)
    argv = ["audit", str(planted), "--prompt", longest, "--lengths", "8,9999", "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert "--lengths 9999 exceed --max-len" in error and "\n" not in error and not (tmp_path / "x").exists()
