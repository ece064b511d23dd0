"""A training-step axis: where a quantity measured at checkpoints is drawn against the step
(a pretrained model's revisions, a toy run's logged steps)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from matplotlib.axes import Axes

STEP_AXIS = "training step"
LOG_SPAN = 100  # steps spanning this factor or more get a logarithmic axis


def set_step_scale(ax: Axes, steps: Sequence[int]) -> None:
    """Logarithmic where the positive steps span ``LOG_SPAN`` or more; symmetric-log when
    step 0 is among them (log would drop it), linear up to the first positive step. The
    ticks are 0 and the decades the steps reach, nothing below 0."""
    positive = [step for step in steps if step > 0]
    if len(positive) < 2 or max(positive) / min(positive) < LOG_SPAN:
        return
    low, high = min(positive), max(positive)
    decades = [10**k for k in range(math.ceil(math.log10(low)), math.floor(math.log10(high)) + 1)]
    if min(steps) == 0:
        ax.set_xscale("symlog", linthresh=low, linscale=0.5)
        ax.set_xlim(-0.2 * low, high * 1.6)
        ax.set_xticks([0, *decades], ["0", *(f"$10^{{{round(math.log10(d))}}}$" for d in decades)])
    else:
        ax.set_xscale("log")
        ax.set_xlim(low / 1.6, high * 1.6)
