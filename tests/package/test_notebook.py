"""The tutorial notebook (examples/tutorial.ipynb) runs from top to bottom in a real
Jupyter kernel, offline, and shows what its text says it shows."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "tutorial.ipynb"


# what the tutorial's prose says its cells show, checked on its own variables
CLAIMS = """
assert softmax_probe.sink_heads() == [(0, 0)] and relu_probe.sink_heads() == []
assert max(row.row_mass for row in relu_probe.heads) < 0.01  # the ReLU head attends to nothing off-trigger
removal = sinkscope.default_state_test(softmax_model, batch.tokens, softmax_probe.sink_heads(), default_error).all_sink_heads
assert removal.error_after_remove > 1000 * removal.error_before  # without its sink the model fails
assert removal.error_after_control < 10 * removal.error_before  # the matched control does not
effect = patching.per_position.matrix()[0]
trigger = softmax_config.task.eval_trigger_position
assert abs(effect[trigger] - 1) < 1e-3 and float(effect.abs().sum() - effect[trigger].abs()) < 1e-3
deep = side_by_side.model("softmax-2x2")
assert deep.writes_anchor and deep.layers_cancel  # the toy mechanism: the anchor's value, cancelled
assert side_by_side.model(minilm.model.label).writes_anchor is False  # MiniLM: its [CLS] value is small
"""


def _html_outputs(notebook) -> list[str]:
    return [
        output["data"]["text/html"]
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if "text/html" in output.get("data", {})
    ]


@pytest.mark.slow  # SmolLM2's GGUF file is dequantised on load: about a minute on two cores
def test_the_tutorial_notebook_runs_offline(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert not any(cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), "commit it unexecuted"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    n_tutorial = len(notebook.cells)
    notebook.cells.append(nbformat.v4.new_code_cell(CLAIMS))  # run in the tutorial's own kernel
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on any error
    notebook.cells = notebook.cells[:n_tutorial]
    html = _html_outputs(notebook)
    printed = "".join(
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "stream"
    )
    # MiniLM's missing masked-LM head is explained in one line, not transformers' red load report
    assert "seem corrupted" not in printed and "LOAD REPORT" not in printed, printed
    assert "encoder checkpoint without a masked-LM head" in printed, printed
    assert "position 8 (1 = BOS)" in printed, printed  # positions count from 1, as the reports do
    titles = ["Toy model softmax-1x1", "Attention-sink probe", "Default-state test", "Activation patching"]
    titles += ["Attention-sink audit: ", "Attention-sink audit: SmolLM2", "Attention-sink comparison"]
    titles += ["Toy and pretrained side by side"]
    for title in titles:
        assert any(title in markup for markup in html), title
    assert (tmp_path / "tutorial-out" / "audit-smollm2" / "report.html").is_file()
    assert (tmp_path / "tutorial-runs" / "relu-1x1" / "result.json").is_file()
