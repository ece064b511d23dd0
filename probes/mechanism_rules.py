"""How the side-by-side comparison reads its numbers: the two kinds of model, and the
thresholds for "writes the anchor's value" and "the layers cancel" (shared by the result,
its findings and its displays)."""

KINDS = ("toy", "pretrained")
# a sink head "writes the anchor's value" when at least half of its output norm comes from
# the anchor: above it the anchor's value dominates what the head writes, below it the
# other keys do although the anchor holds >= 1 - sink_eps of the attention
WRITES_ANCHOR_SHARE = 0.5
# the layers "cancel" when the norm of their summed output is under half the sum of their
# norms: most of what they write is undone by other layers at the same positions
CANCELS_BELOW = 0.5
