"""The training step of a checkpoint, so that a suite over revisions of one model is drawn
against the step rather than as categories.

A step comes from a mapping the user gives (``--steps REV=STEP,...``), else from the
revision's name where it says the step: Pythia's ``step143000``, OLMo's
``stepXXXX-tokensYYYB``, the Hugging Face Trainer's ``checkpoint-1000`` and
``global_step1000``. A revision that says nothing of its step has none, and its suite is
drawn as checkpoints in the given order, as before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from sinkscope.infra.bounds import MAX_INT
from sinkscope.infra.errors import InputError

# "step" or "checkpoint" then digits, not inside a longer word ("nonstep12", "step10k" say nothing exact)
STEP_PATTERN = re.compile(r"(?:^|[^a-z])(?:global_?)?(?:step|checkpoint)[-_]?(\d+)(?![0-9a-z])", re.IGNORECASE)


def step_from_revision(revision: str | None) -> int | None:
    """The training step a revision's name states, or None."""
    if not revision:
        return None
    found = STEP_PATTERN.search(revision)
    return int(found.group(1)) if found else None


MAX_STEP = MAX_INT  # the largest integer a result file holds: COUNT's cap


def parse_steps(text: str) -> dict[str, int]:
    """``--steps``: comma-separated ``REVISION=STEP`` pairs, each step a whole number >= 0."""
    steps: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        revision, equals, step = item.partition("=")
        revision, step = revision.strip(), step.strip()
        if not equals or not revision or not step.isdecimal():  # isdigit takes "²", which int() does not
            raise InputError(
                f"--steps takes REVISION=STEP pairs separated by commas (e.g. main=143000,step1000=1000), got {item!r}",
                field="steps",
            )
        if revision in steps:
            raise InputError(f"--steps names revision {revision!r} twice; give each revision one step", field="steps")
        steps[revision] = int(step)
    return check_steps(steps)


def check_steps(steps: object) -> dict[str, int]:
    """A mapping given in Python: revision names to whole-number steps >= 0."""
    if not isinstance(steps, Mapping):
        raise InputError(f"steps must map revision names to training steps, got {type(steps).__name__}", field="steps")
    for revision, step in steps.items():
        if not isinstance(revision, str) or not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise InputError(
                f"steps maps revision names (str) to whole-number steps >= 0, got {revision!r}: {step!r}",
                field="steps",
            )
        if step > MAX_STEP:  # a result file keeps steps as 64-bit integers
            raise InputError(
                f"the step of {revision!r} is {step}, beyond any training run; give its step", field="steps"
            )
    return dict(steps)


def training_step(revision: str | None, steps: Mapping[str, int] | None) -> int | None:
    """The step of ``revision``: the user's mapping first, else what its name states."""
    if steps and revision is not None and revision in steps:
        return int(steps[revision])
    return step_from_revision(revision)


def check_steps_used(steps: Mapping[str, int] | None, revisions: set[str]) -> None:
    """A mapped revision that no audit has is a typo: refused, naming what there is."""
    unknown = sorted(set(steps or {}) - revisions)
    if unknown:
        known = ", ".join(sorted(revisions)) or "none (no audit has a revision)"
        raise InputError(
            f"--steps names revision(s) {', '.join(unknown)} that no audit has; the audits' revisions: {known}",
            field="steps",
        )
