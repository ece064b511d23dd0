"""How the side-by-side comparison reads its numbers, in one place: the two kinds of model,
the quantities that decide the mechanism, what each means, the absolute thresholds of the
per-model columns, and how close to the toy's a pretrained model's value must lie to be
called like the toy's (shared by the result, its findings, distances and displays)."""

KINDS = ("toy", "pretrained")
SHARE = "value-weighted anchor share"
CANCELLATION = "cancellation"
MEANINGS = (
    (
        "anchor mass",
        "mean attention a head puts on the anchor (BOS, the first token or [CLS]) over the probe's queries",
    ),
    (
        SHARE,
        "share of a sink head's output norm that comes from the anchor: ||A[i,a] v_a W_O|| / sum_j ||A[i,j] v_j W_O||; "
        "near 1 the head writes the anchor's value, near 0 the anchor takes the attention but its value is small",
    ),
    ("anchor value norm", "||v_a||, the size of the anchor's value vector in the head (before W_O)"),
    (
        CANCELLATION,
        "||sum over layers of the attention output|| / sum over layers of ||attention output||: 1 when the layers "
        "add up, near 0 when they undo each other at the same positions (the toy's default state)",
    ),
    (
        "distance from the toy",
        "share: the difference of the means (with a bootstrap interval over sink heads); cancellation: the ratio "
        "to the toy's (one number per model, no interval)",
    ),
)
# a sink head "writes the anchor's value" when at least half of its output norm comes from
# the anchor: above it the anchor's value dominates what the head writes, below it the
# other keys do although the anchor holds >= 1 - sink_eps of the attention
WRITES_ANCHOR_SHARE = 0.5
# the layers "cancel" when the norm of their summed output is under half the sum of their
# norms: most of what they write is undone by other layers at the same positions
CANCELS_BELOW = 0.5
# like the toy's: a share within 0.1 of the toy's mean (a tenth of the share's range), a
# cancellation within a factor of 3 of the toy's (it spans orders of magnitude, so the
# distance is a ratio: 0.408 against the toy's 0.0005 is 816 times, far)
SHARE_CLOSE = 0.1
CANCELLATION_CLOSE_FACTOR = 3.0
N_BOOTSTRAP = 2000
