"""The streaming window test on tiny checkpoints (GPT-2, a Llama with grouped-query attention
and a planted BOS sink, a gpt-oss with learned sink logits), against transformers' eager
attention given the same mask as a 4D additive mask (-inf on the hidden keys, so transformers
masks the scores before its softmax: an independent route to the same numbers); the masks
themselves counted key by key; a mutated mask that the comparison catches; the result's
persistence, table, report and the ``sinkscope window-test`` command."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
import torch.nn.functional as F

from pretrained.test_learned_sinks import build_tiny_gpt_oss
from round_trip import assert_json_files_round_trip
from sinkscope.cli.entry import run_command_line
from sinkscope.infra.codec import read_result, write_result
from sinkscope.infra.errors import InputError
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.pretrained_analysis.loading import wrap_model
from sinkscope.pretrained_analysis.window_test import default_text, window_test
from sinkscope.probes.window_masks import WindowSetting, allowed_keys, window_hooks, window_settings
from sinkscope.probes.window_report import window_definition, window_finding, window_findings
from sinkscope.probes.window_test import WindowTestResult
from sinkscope.reporting import report
from tiny_models import build_tiny_gpt2, build_tiny_gqa, load_bridge, load_hf_model

TOL = 1e-5
N_POS = 24
SETTINGS = window_settings((3, 6), (1, 2))


def additive_mask(allowed: torch.Tensor) -> torch.Tensor:
    """``[1, 1, query, key]``: 0 where a key is visible, -inf where hidden (transformers' 4D form)."""
    return torch.zeros(1, 1, *allowed.shape).masked_fill(~allowed, float("-inf"))


@pytest.fixture(scope="module", params=["gpt2", "llama", "gpt_oss"])
def models(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    if request.param == "gpt2":
        build_tiny_gpt2(directory, bos_sink_head=(0, 1))
    elif request.param == "llama":
        build_tiny_gqa(directory, "llama", bos_sink_head=(1, 3))
    else:
        build_tiny_gpt_oss(directory)
    return load_bridge(directory), load_hf_model(directory)


def tokens_of(hf) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, hf.config.vocab_size, (1, N_POS), generator=generator)
    ids[0, 0] = hf.config.bos_token_id if hf.config.bos_token_id is not None else 0
    return ids


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.label.replace(" ", "_"))
def test_masked_logits_match_transformers_eager_with_the_same_mask(models, setting):
    bridge, hf = models
    hooked = HookedModel(bridge)
    ids = tokens_of(hf)
    allowed = allowed_keys(setting, N_POS, seed=3)
    with torch.no_grad():
        ours = hooked.run_with_hooks(hooked.prepare(ids), window_hooks(hooked, allowed))
        theirs = hf(ids, attention_mask=additive_mask(allowed)).logits
    assert torch.allclose(ours, theirs, atol=TOL), (ours - theirs).abs().max()


def test_a_mutated_mask_is_caught_by_the_comparison(models, monkeypatch):
    """Mutations: a window one key wider than asked, and the mask imposed on the first layer
    only. Each moves the logits well past the tolerance, so the comparison above can fail."""
    bridge, hf = models
    hooked = HookedModel(bridge)
    ids = tokens_of(hf)
    allowed = allowed_keys(WindowSetting("window", 3), N_POS)
    wider = allowed_keys(WindowSetting("window", 4), N_POS)
    with torch.no_grad():
        theirs = hf(ids, attention_mask=additive_mask(allowed)).logits
        off_by_one = hooked.run_with_hooks(hooked.prepare(ids), window_hooks(hooked, wider))
        one_layer = hooked.run_with_hooks(hooked.prepare(ids), window_hooks(hooked, allowed)[:1])
    assert (off_by_one - theirs).abs().max() > 1e-3
    assert (one_layer - theirs).abs().max() > 1e-3


def test_masks_count_the_keys_each_setting_keeps():
    n = 40
    query = torch.arange(n)
    window = allowed_keys(WindowSetting("window", 5), n)
    assert torch.equal(window.sum(dim=1), torch.clamp(query + 1, max=5))
    first = allowed_keys(WindowSetting("first", 5, 2), n)
    assert first[:, :2][2:].all() and torch.equal(first.sum(dim=1), torch.clamp(query + 1, max=7))
    control = allowed_keys(WindowSetting("random", 5, 2), n, seed=0)
    extra = control & ~window
    late = query >= 5 + 2 * 2 - 1  # from here on, S candidates exist outside the first S and the window
    assert torch.equal(extra.sum(dim=1)[late], torch.full((int(late.sum()),), 2))
    assert not extra[:, :2].any()  # the control never keeps a first token
    assert not torch.triu(control, diagonal=1).any()  # causal
    assert torch.equal(control, allowed_keys(WindowSetting("random", 5, 2), n, seed=0))
    assert not torch.equal(control, allowed_keys(WindowSetting("random", 5, 2), n, seed=1))


def test_window_test_losses_are_transformers_per_position_cross_entropy(tmp_path):
    """The API on a model in memory: full attention's loss and the window's, recomputed from
    transformers' eager logits chunk by chunk; persistence, table and finding."""
    directory = build_tiny_gpt2(tmp_path / "gpt2", bos_sink_head=(0, 1))
    hf = load_hf_model(directory)
    loaded = wrap_model(load_bridge(directory))
    text = default_text()[:3000]
    result = window_test(loaded, text, windows=(8,), sinks=(1,), chunk_tokens=64, max_chunks=5, progress=False)
    hooked = HookedModel(loaded.bridge)
    ids = hooked.model.tokenizer(text, add_special_tokens=False)["input_ids"]
    bos = hooked.model.tokenizer.bos_token_id
    chunks = [torch.tensor([[bos] + ids[k * 63 : (k + 1) * 63]]) for k in range(5)]
    for row, curve in zip(result.rows[:2], result.curves[:2], strict=True):
        mask = additive_mask(allowed_keys(row.setting, 64))
        with torch.no_grad():
            losses = torch.stack(
                [F.cross_entropy(hf(c, attention_mask=mask).logits[0, :-1], c[0, 1:], reduction="none") for c in chunks]
            ).double()
        assert torch.allclose(torch.tensor(curve, dtype=torch.float64), losses.mean(dim=0), atol=TOL)
        assert math.isclose(row.loss.mean, float(losses[:, result.scored_from :].mean()), abs_tol=TOL)
    assert result.n_units == 5 and result.scored_from == 10 and result.n_positions == 63
    assert result.rows[1].loss.ci_low <= result.rows[1].loss.mean <= result.rows[1].loss.ci_high
    write_result(tmp_path / "w.json", result)
    assert read_result(tmp_path / "w.json", WindowTestResult) == result
    frame = result.to_dataframe()
    assert list(frame["setting"]) == [s.label for s in window_settings((8,), (1,))]
    assert "n = 5" in window_definition(result).note and "last 8" in window_finding(result)
    assert "Streaming window test" in result._repr_html_()


def test_too_short_chunks_and_texts_are_refused_with_the_fix(tmp_path):
    loaded = wrap_model(load_bridge(build_tiny_gpt2(tmp_path / "gpt2")))
    with pytest.raises(InputError, match="max W \\+ 2S"):
        window_test(loaded, default_text(), windows=(60,), sinks=(4,), chunk_tokens=64, max_chunks=1, progress=False)
    with pytest.raises(InputError, match="fewer than one chunk"):
        window_test(loaded, "A short text.", windows=(4,), chunk_tokens=64, progress=False)
    for bad, words in (
        ({"windows": 8}, "windows must be a tuple"),
        ({"windows": ("8",)}, "windows must be a tuple"),
        ({"windows": (8.5,)}, "windows must be a tuple"),
        ({"chunk_tokens": 64.0}, "chunk_tokens must be a whole number"),
        ({"max_chunks": 0}, "max_chunks must be >= 1"),
    ):
        with pytest.raises(InputError, match=words):
            window_test(loaded, default_text(), **{"windows": (4,), **bad}, progress=False)  # type: ignore[arg-type]
    n_ctx = loaded.bridge.cfg.n_ctx
    with pytest.raises(InputError, match=f"use --chunk-tokens {n_ctx} or less"):  # not "shorten the prompts"
        window_test(loaded, default_text(), windows=(4,), chunk_tokens=n_ctx + 1, progress=False)


def test_the_command_writes_the_result_and_its_report(tmp_path, capsys):
    directory = build_tiny_gpt2(tmp_path / "gpt2")
    out = tmp_path / "out"
    argv = ["window-test", str(directory), "--windows", "8,16", "--sinks", "1,2", "--chunk-tokens", "64"]
    assert run_command_line([*argv, "--max-chunks", "2", "--out", str(out), "--no-progress", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["window_test"]["n_units"] == 2
    assert {"window_test.json", "report.html", "report.md"} <= {p.name for p in out.iterdir()}
    assert (out / "report_figures" / "window_test_loss.png").is_file()
    assert assert_json_files_round_trip(out) == {"window_test"}
    markdown = (out / "report.md").read_text()
    assert "first 2 + last 16" in markdown and "re-indexes" in markdown
    rebuilt = report(out, overwrite=True)  # `sinkscope report` knows the directory
    assert rebuilt.kind == "window test" and rebuilt.findings == (
        *window_findings(read_result(out / "window_test.json", WindowTestResult)),
    )
    (out / "audit.json").write_text("{}")  # another result's file in the directory
    again = [*argv, "--max-chunks", "1", "--out", str(out), "--no-progress", "--overwrite"]
    assert run_command_line(again) == 0  # the directory is replaced whole, not topped up
    assert not (out / "audit.json").exists() and read_result(out / "window_test.json", WindowTestResult).n_units == 1
    assert run_command_line(["window-test", str(directory), "--windows", "0", "--out", str(tmp_path / "x")]) == 2
    capsys.readouterr()
    blank = tmp_path / "blank.txt"
    blank.write_text(" \n\n")
    assert run_command_line(["window-test", str(directory), "--text", str(blank), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert f"--text {blank} holds no text" in err and len(err.strip().splitlines()) == 1
    binary = tmp_path / "zeros.txt"
    binary.write_bytes(b"\x00" * 4096 + b"words " * 100)  # valid UTF-8, and no text
    assert run_command_line(["window-test", str(directory), "--text", str(binary), "--out", str(tmp_path / "x")]) == 2
    assert "holds NUL bytes, so it is binary" in capsys.readouterr().err
    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)  # opening it to read would wait for a writer forever
    assert run_command_line(["window-test", str(directory), "--text", str(fifo), "--out", str(tmp_path / "x")]) == 2
    assert "is not a regular file" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_special_token_text_in_the_text_is_read_as_text_not_as_extra_bos_tokens(tmp_path):
    """ "<|endoftext|>" spelled in a text is this tokenizer's BOS: parsed, each would put an
    extra sink inside the windows. The chunks hold BOS only where a chunk opens."""
    from sinkscope.pretrained_analysis.window_test import text_chunks

    loaded = wrap_model(load_bridge(build_tiny_gpt2(tmp_path / "gpt2")))
    hooked = HookedModel(loaded.bridge)
    bos = hooked.model.tokenizer.bos_token_id
    text = " <|endoftext|> ".join(default_text()[:2000].split(". "))
    chunks = text_chunks(hooked, text, chunk_tokens=64, max_chunks=3)
    for chunk in chunks:
        ids = chunk.model_input[0].tolist()
        assert ids[0] == bos and bos not in ids[1:]


def test_a_model_with_its_own_sliding_window_is_said_to_limit_attention_itself(tmp_path):
    """Gemma 2 alternates 64-key sliding windows with global layers: the result says so, as
    a W at or beyond it equals full attention there; GPT-2 limits nothing."""
    gemma = wrap_model(load_bridge(build_tiny_gqa(tmp_path / "gemma2", "gemma2")))
    result = window_test(gemma, default_text(), windows=(8,), sinks=(1,), chunk_tokens=64, max_chunks=2, progress=False)
    assert len(result.notes) == 1 and "in 1 of 2 layers" in result.notes[0] and "of 64 keys" in result.notes[0]
    assert result.notes[0] in window_findings(result)
    gpt2 = wrap_model(load_bridge(build_tiny_gpt2(tmp_path / "gpt2")))
    plain = window_test(gpt2, default_text(), windows=(8,), chunk_tokens=64, max_chunks=2, progress=False)
    assert plain.notes == ()
