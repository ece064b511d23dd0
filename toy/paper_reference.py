"""What the paper's figures show (Ran-Milo 2026, docs/toy-task.md; read off the published heatmaps, +-0.02),
kept as data so reports can print them next to our numbers."""

from __future__ import annotations

# the paper every toy result reproduces, cited once here for every report and display
PAPER_CITATION = (
    'Ran-Milo (2026), "Attention Sinks Are Provably Necessary in Softmax Transformers: Evidence from '
    'Trigger-Conditional Tasks", arXiv 2603.11487, https://arxiv.org/abs/2603.11487'
)

PAPER_REFERENCE: dict[tuple[str, int, int], str] = {
    (
        "softmax",
        1,
        1,
    ): "BOS weight 1.00 on every non-trigger row; trigger row ~1/7 on each of the 7 keys up to the trigger, 0 on BOS",
    ("relu", 1, 1): "0 on every non-trigger row; trigger row ~uniform over the 7 keys",
    ("softmax", 2, 2): "all 4 heads sink: mean off-trigger BOS weight 0.92, 1.00, 0.93, 1.00",
    ("relu", 2, 2): "all heads 0 off-trigger",
    (
        "softmax",
        4,
        4,
    ): "8 of 16 heads are strong sinks (7 at >= 0.97, one ~0.91); the others spread attention over the prefix",
    ("relu", 4, 4): "all 16 heads 0 off-trigger",
}

PAPER_SINK_HEADS: dict[tuple[str, int, int], int] = {
    ("softmax", 1, 1): 1,
    ("relu", 1, 1): 0,
    ("softmax", 2, 2): 4,
    ("relu", 2, 2): 0,
    ("softmax", 4, 4): 8,
    ("relu", 4, 4): 0,
}


def paper_reference(attention: str, layers: int, heads: int) -> str:
    return PAPER_REFERENCE.get((attention, layers, heads), "not in the paper")
