"""`sinkscope report` on every kind of result directory, built here from real (small)
runs: a toy reproduction, a toy probe, a toy trade-off, an audit with ablations and a
comparison of two audits (tiny GPT-2 and GPT-NeoX checkpoints with planted BOS sinks), a
comparison of attention kinds (softmax beside a learned sink), the sink-circuit battery on
the GPT-2, and a toy run beside an audit in one side-by-side (mechanism) comparison.

Run names, file names and prompts carry ``<script>alert(1)</script>``: the reports must
show it as text. The browser tests open each report in headless Chromium (see
``browser.py``) and check that it renders, every image decodes, tables sort and the
console stays clean; they are skipped only when Debian's ``chromium`` is not installed.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import pytest
from matplotlib.figure import Figure as MplFigure

from browser import Chromium, find_chromium
from sinkscope.cli import main
from sinkscope.reporting import REPORT_KINDS, report
from sinkscope.reports.document import Column, Figure, ReportDocument, Section, Table
from sinkscope.reports.html import render_html
from sinkscope.reports.markdown import md_escape, render_markdown
from sinkscope.reports.plots import save_figure
from sinkscope.reports.png_text import TEXT_PX_KEY, png_text
from sinkscope.toy.mitigations import MitigationsConfig, compare_mitigations
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.patching import patch_run
from sinkscope.toy.probe_run import probe_run
from sinkscope.toy.reproduce import ReproduceConfig, reproduce
from sinkscope.toy.run_dir import RunConfig, TrainConfig
from sinkscope.toy.sweep import SweepConfig, sweep
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.tradeoff import write_tradeoff
from sinkscope.toy.train import train
from tiny_models import build_tiny_gpt2, build_tiny_gpt_neox

XSS = "<script>alert(1)</script>"
XSS_IMG = "<img src=x onerror=alert(2)>"
PROMPTS = [
    f"A prompt that says {XSS} to the model.",
    "Attention sinks park mass on the first token.",
    "The quick brown fox jumps over the lazy dog.",
    "A trigger switches the model out of its default state.",
]


def xss_dir(root: Path, leaf: str = "") -> Path:
    """A path whose text contains ``<script>alert(1)</script>`` (a file name cannot hold
    the slash, so the string spans two directory levels) and an ``<img onerror>``."""
    return root / "<script>alert(1)<" / f"script>{XSS_IMG}{leaf}"


@pytest.fixture(scope="module")
def result_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("results")
    dirs: dict[str, Path] = {}
    # toy reproduction: the 1x1 models converge in ~800 steps; reproduce adds the trade-off
    config = ReproduceConfig(seeds=1, architectures=((1, 1),), max_steps=1200, n_sequences=100, workers=1)
    reproduce(config, root / "reproduction", progress=False)
    dirs["toy reproduction"] = root / "reproduction"
    run = xss_dir(root, "-run")
    shutil.copytree(root / "reproduction" / "softmax-1x1-seed0", run)
    probe_run(run, run / "probe", n_sequences=100)
    dirs["toy probe with a sink"] = run / "probe"
    wide = xss_dir(root, "-2x2")  # briefly trained: four heads to sort, no sinks yet
    train(
        RunConfig(ToyModelConfig(n_layers=2, n_heads=2), TaskConfig(), TrainConfig(max_steps=200)), wide, progress=False
    )
    probe_run(wide, wide / "probe", n_sequences=100)
    dirs["toy probe"] = wide / "probe"
    write_tradeoff(root / "tradeoff", [run], n_sequences=100)
    dirs["toy tradeoff"] = root / "tradeoff"
    patch_run(run, run / "patch", n_inputs=32)
    dirs["toy patch"] = run / "patch"
    grid = SweepConfig(
        seq_lens=(6, 8), d_models=(6, 8), attentions=("softmax",), seeds=1, max_steps=300, n_sequences=50, workers=1
    )
    sweep(grid, xss_dir(root, "-sweep"), progress=False)
    dirs["toy sweep"] = xss_dir(root, "-sweep")
    # a mitigation comparison: a null-slot kind beside softmax, converged 1x1 models
    kinds = MitigationsConfig(
        kinds=("softmax", "learned_sink"), architectures=((1, 1),), seeds=1, max_steps=1200, n_sequences=100, workers=1
    )
    compare_mitigations(kinds, xss_dir(root, "-mitigations"), progress=False)
    dirs["toy mitigations"] = xss_dir(root, "-mitigations")
    # audits: tiny causal models with a planted sink, prompts from a file named with the XSS string
    prompts = xss_dir(root, ".txt")
    prompts.parent.mkdir(parents=True, exist_ok=True)
    prompts.write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    gpt2 = build_tiny_gpt2(root / "models" / "tiny-gpt2", bos_sink_head=(0, 0))
    neox = build_tiny_gpt_neox(root / "models" / "tiny-neox", bos_sink_head=(1, 1))
    fast = ["--prompts", str(prompts), "--max-len", "24", "--ablate", "--no-progress", "--json"]
    assert main(["audit", str(gpt2), "--out", str(root / "audit"), *fast]) == 0
    dirs["audit"] = root / "audit"
    assert main(["audit", str(gpt2), str(neox), "--out", str(root / "comparison"), *fast]) == 0
    dirs["comparison"] = root / "comparison"
    window = ["window-test", str(gpt2), "--windows", "8", "--sinks", "1", "--chunk-tokens", "64", "--max-chunks", "2"]
    assert main([*window, "--out", str(xss_dir(root, "-window")), "--no-progress", "--json"]) == 0
    dirs["window test"] = xss_dir(root, "-window")
    circuit = ["circuit", str(gpt2), "--prompts", str(prompts), "--max-len", "24", "--no-progress", "--json"]
    assert main([*circuit, "--out", str(xss_dir(root, "-circuit"))]) == 0
    dirs["circuit"] = xss_dir(root, "-circuit")
    # toy and pretrained side by side: the audit first, so the models table's layers column is out of order
    assert main(["compare", str(root / "audit"), str(run), "--out", str(xss_dir(root, "-mechanism")), "--json"]) == 0
    dirs["mechanism"] = xss_dir(root, "-mechanism")
    return dirs


@pytest.fixture(scope="module")
def reports(result_dirs, tmp_path_factory) -> dict[str, Path]:
    """Every kind's report.html, written next to its result (the default) or to --out."""
    out = tmp_path_factory.mktemp("reports")
    written = {}
    for label, directory in result_dirs.items():
        result = report(directory, out / label.replace(" ", "-"))
        assert label.startswith(result.kind)
        written[label] = result.html
    return written


def test_every_kind_is_reported(reports):
    assert {label for label in reports if label in {kind.name for kind in REPORT_KINDS}} == {
        kind.name for kind in REPORT_KINDS
    }


def test_findings_are_sentences_from_the_numbers(result_dirs, tmp_path):
    result = report(result_dirs["toy reproduction"], tmp_path / "r")
    findings = " ".join(result.findings)
    assert "2 models trained" in findings
    assert "checks against the paper pass" in findings
    assert "softmax-1x1-seed0: Removing the sinks of the sink head raises default-position MSE from" in findings
    assert "matched control leaves it at" in findings
    audit = report(result_dirs["audit"], tmp_path / "a")
    assert any("is a sink head" in line and "L0H0" in line for line in audit.findings)
    assert any("next-token loss" in line for line in audit.findings)


def test_markdown_has_the_findings_and_tables_escaped(reports):
    for kind, html_path in reports.items():
        text = html_path.with_name("report.md").read_text(encoding="utf-8")
        assert "## Summary of findings" in text and "|---" in text, kind
        assert "<script>" not in text and "<img" not in text, kind
    probe_md = reports["toy probe with a sink"].with_name("report.md").read_text(encoding="utf-8")
    assert "&lt;script>alert(1)&lt;/script>" in probe_md
    assert "](<" in probe_md  # figures are linked by relative path


def test_html_is_self_contained_and_escaped(reports):
    for kind, html_path in reports.items():
        page = html_path.read_text(encoding="utf-8")
        assert page.count("<script>") == 1, kind  # the table-sorting script and nothing else
        assert "<img src=x" not in page, kind
        assert 'src="http' not in page and 'href="http' not in page and "@import" not in page, kind
        assert "data:image/png;base64," in page, kind
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in reports["toy probe"].read_text(encoding="utf-8")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in reports["audit"].read_text(encoding="utf-8")


def test_existing_report_is_refused_without_overwrite(result_dirs, tmp_path, capsys):
    source = result_dirs["toy tradeoff"]
    out = tmp_path / "out"
    assert main(["report", str(source), "--out", str(out), "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["kind"] == "toy tradeoff" and Path(written["html"]).is_file()
    before = (out / "report.html").read_bytes()
    assert main(["report", str(source), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert (out / "report.html").read_bytes() == before
    assert main(["report", str(source), "--out", str(out), "--overwrite"]) == 0


def test_directories_without_a_result_get_a_one_line_fix(result_dirs, tmp_path, capsys):
    run_dir = result_dirs["toy reproduction"] / "relu-1x1-seed0"
    assert main(["report", str(run_dir), "--out", str(tmp_path / "x")]) == 2
    assert "sinkscope toy probe" in capsys.readouterr().err
    probed = result_dirs["toy probe"].parent  # a run already probed into its default probe/
    assert main(["report", str(probed), "--out", str(tmp_path / "x")]) == 2
    assert f"`sinkscope report {probed / 'probe'}`" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "holds no sinkscope result" in err and len(err.strip().splitlines()) == 1
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert not (tmp_path / "x").exists()


def test_renderers_escape_every_string():
    table = Table(XSS, (Column(XSS), Column("n", ".2f", numeric=True)), ((XSS_IMG, 1.5), ("a|b", float("nan"))), XSS)
    document = ReportDocument(XSS, XSS, (XSS,), (Section(XSS, (table,)),))
    page = render_html(document, footer=XSS)
    assert page.count("<script>") == 1 and "<img src=x" not in page
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 7
    assert 'data-sort=""' in page  # NaN sorts last, shown as an en dash
    markdown = render_markdown(document, link=lambda path: path.name)
    assert "<" not in markdown.replace("](<", "")
    assert "a\\|b" in markdown
    assert md_escape("line one\nline two [x](y)") == "line one line two \\[x\\](y)"


def test_terminal_escapes_in_a_prompt_are_shown_not_sent():
    """A prompt holding ESC [2J (clear the screen) reached report.md raw: `cat report.md`
    cleared the terminal. Both media show every control character as a code."""
    prompt = "cat\x1b[2J sat\x07"
    table = Table("prompts", (Column("prompt"),), ((prompt,),), prompt)
    document = ReportDocument(prompt, prompt, (prompt,), (Section(prompt, (table,)),))
    for text in (render_markdown(document, link=lambda path: path.name), render_html(document, footer=prompt)):
        assert "\x1b" not in text and "\x07" not in text
        assert "x1b" in text and "x07" in text


# the browser -------------------------------------------------------------------------

needs_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="Debian's chromium is not installed (apt-get install -y chromium); the browser tests need it",
)

IMAGES = "Promise.all(Array.from(document.images).map(i => i.decode().then(() => i.naturalWidth, () => 0)))"
COLUMN = (
    "Array.from(document.querySelectorAll('table.sortable')[{table}].tBodies[0].rows)"
    ".map(r => r.cells[{column}].getAttribute('data-sort'))"
)


def _check_sorting(page, kind: str) -> None:
    """Click the header of a numeric column whose rows are out of order: ascending, then
    descending."""
    found = page.evaluate(
        "(() => { const tables = document.querySelectorAll('table.sortable');"
        " for (let t = 0; t < tables.length; t++) { const heads = tables[t].tHead.rows[0].cells;"
        "  for (let c = 0; c < heads.length; c++) { if (!heads[c].hasAttribute('data-numeric')) continue;"
        "   const v = Array.from(tables[t].tBodies[0].rows).map(r => parseFloat(r.cells[c].getAttribute('data-sort')));"
        "   if (v.some(Number.isNaN)) continue;"
        "   if (v.some((x, i) => i > 0 && x < v[i - 1])) { heads[c].id = 'sort-target'; return [t, c]; } } }"
        " return null; })()"
    )
    assert found is not None, f"{kind}: no numeric column out of order to sort"
    column = COLUMN.format(table=found[0], column=found[1])
    before = [float(value) for value in page.evaluate(column)]
    page.click("#sort-target")
    assert [float(value) for value in page.evaluate(column)] == sorted(before), kind
    assert page.evaluate("document.getElementById('sort-target').getAttribute('aria-sort')") == "ascending"
    page.click("#sort-target")
    assert [float(value) for value in page.evaluate(column)] == sorted(before, reverse=True), kind
    assert page.evaluate("document.getElementById('sort-target').getAttribute('aria-sort')") == "descending"


LEGIBLE_PX = 9.0  # CSS px: the smallest text a reader can still make out on a screen
SHOWN = "Array.from(document.images).map(i => [i.naturalWidth, i.getBoundingClientRect().width])"


def _illegible_figures(page, html_path: Path) -> list[str]:
    """Figures whose smallest text is shown below ``LEGIBLE_PX``: the size each PNG records
    for its smallest text (in image pixels) times the scale the page shows the image at."""
    images = re.findall(r'<img src="data:image/png;base64,([^"]+)"', html_path.read_text(encoding="utf-8"))
    shown = page.evaluate(SHOWN)
    assert len(shown) == len(images)
    small = []
    for index, (data, (natural, width)) in enumerate(zip(images, shown)):
        recorded = png_text(base64.b64decode(data)).get(TEXT_PX_KEY)
        if recorded is None:
            small.append(f"figure {index}: no {TEXT_PX_KEY} (not written by save_figure)")
        elif float(recorded) * width / natural < LEGIBLE_PX:
            small.append(f"figure {index}: {float(recorded) * width / natural:.1f} px text ({width:.0f}/{natural} px)")
    return small


@needs_chromium
def test_a_shrunk_figure_is_caught(tmp_path):
    """The legibility check fails on a figure drawn wider than the page, which the page
    then shrinks (as the 4x4 attention grids used to be), and on two ordinary figures
    side by side passes."""
    figures = []
    for name, width in (("wide", 20.0), ("small", 4.0), ("small2", 4.0)):
        fig = MplFigure(figsize=(width, 3))
        fig.subplots().set_title("title", fontsize=8)
        save_figure(fig, tmp_path / f"{name}.png")
        figures.append(Figure(tmp_path / f"{name}.png", name, tmp_path))
    page_path = tmp_path / "page.html"
    page_path.write_text(
        render_html(ReportDocument("t", "s", ("a", "b"), (Section("Figures", tuple(figures)),))), encoding="utf-8"
    )
    with Chromium() as browser:
        small = _illegible_figures(browser.open(page_path), page_path)
    assert len(small) == 1 and small[0].startswith("figure 0:"), small


@needs_chromium
def test_reports_render_in_headless_chromium(reports):
    with Chromium() as browser:
        for label, html_path in reports.items():
            page = browser.open(html_path)
            assert page.evaluate("document.querySelector('h1').textContent.length") > 0, label
            assert page.evaluate("document.querySelectorAll('#findings li').length") >= 2, label
            assert page.evaluate("document.documentElement.scrollHeight") > 800, label
            widths = page.evaluate(IMAGES)
            assert widths and all(width > 0 for width in widths), (label, widths)
            assert _illegible_figures(page, html_path) == [], label
            repeated = page.evaluate(
                "Array.from(document.querySelectorAll('section')).flatMap(s => Array.from(s.querySelectorAll("
                "'caption')).map(c => c.textContent).filter(t => t === s.querySelector('h2').textContent))"
            )
            assert repeated == [], (label, repeated)  # a table is not titled like its section
            assert page.evaluate("Array.from(document.images).every(i => i.src.startsWith('data:image/png;base64,'))")
            assert page.evaluate("performance.getEntriesByType('resource').length") == 0, label  # nothing fetched
            # "toy probe with a sink": one head, one row per table ("toy probe" sorts four heads);
            # "circuit": its intervals are text in the battery's order (edit beside control), and its
            # one numeric column, the transplant's, has two rows whose order the model decides
            if label not in ("toy probe with a sink", "circuit"):
                _check_sorting(page, label)
            page.settle()
            assert page.events.errors() == [], (label, page.events.errors())
            assert page.events.dialogs == [], label
            assert page.evaluate("document.scripts.length") == 1, label
            if label != "toy reproduction":  # every other result carries the string in a path or a name
                assert page.evaluate(f"document.body.innerText.includes({json.dumps(XSS)})"), label
