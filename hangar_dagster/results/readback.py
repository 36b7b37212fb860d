"""The readback: what a teammate opening the report could not read, one line each with its fix.

A pure function over a ``Page``: what the report shows (the question, the variants by name and
words, every number with its interval and n, what this design can detect, the flagged passes and
invalid tasks). ``results.report`` builds the page from a stored experiment; the tests build
pages by hand to show each line appear and disappear. An empty list means the page reads clean.
docs/report.md lists the lines.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

# A name that encodes a setting instead of saying what changed: a learning rate, an exponent,
# a seed, a bare version or a hash (the seed's `dapo-lr5e-05-s17-30st`).
SETTING = re.compile(
    r"(lr\d|\de-0?\d|(^|[-_])s\d+([-_]|$)|seed\d+|(^|[-_])v\d+$|^h-[0-9a-f]{12}$|"
    r"[-_]\d+st([-_]|$)|^[0-9a-f]{8,}$)"
)


@dataclass(frozen=True)
class Number:
    """One number the page shows, as shown."""

    what: str  # e.g. "skill pass rate"
    value: float | None
    low: float | None = None
    high: float | None = None
    n_tasks: int | None = None
    n_trials: int | None = None


@dataclass(frozen=True)
class Arm:
    """A variant as the page shows it."""

    name: str
    changes: str | None = None  # the spec's words for what it changes
    numbers: tuple[Number, ...] = ()
    flagged_in_headline: int = 0  # flagged passes the headline rate counts as passes
    mde_pts: float | None = None  # what the paired test against the baseline can detect
    tasks_needed: int | None = None  # for the spec's min_effect_pts, at this many trials
    trials_needed: int | None = None  # for it at this many tasks (None: trials alone cannot)
    n_tasks: int | None = None  # tasks paired with the baseline
    trials_per_task: float | None = None


@dataclass(frozen=True)
class Page:
    question: str | None
    hypothesis: str | None
    min_effect_pts: float | None  # decide.min_effect_pts
    baseline: str | None
    arms: tuple[Arm, ...]
    invalid_tasks: Mapping[str, str | None] = field(default_factory=dict)  # task -> reason


def readback(page: Page) -> list[str]:
    """One line per thing a reader could not read, each ending in its fix. Empty: clean."""
    out: list[str] = []
    if not page.question:
        out.append("no question: say what the experiment asks in the spec's `question:`")
    if not page.hypothesis:
        out.append("no hypothesis: write the expected answer and why in `hypothesis:`")
    if page.min_effect_pts is None:
        out.append(
            "no decision rule: give the smallest effect that matters in "
            "`decide: {min_effect_pts: N}` (points out of 100)"
        )
    names = [a.name for a in page.arms]
    if page.baseline is None and len(names) > 1:
        out.append(
            "no baseline: name the variant the others are compared with in `baseline:` "
            f"(one of {', '.join(names)})"
        )
    for arm in page.arms:
        out += _arm_lines(arm, page)
    for task, reason in sorted(page.invalid_tasks.items()):
        out.append(
            f"task {task} is invalid ({reason or 'its base check failed'}): its trials are left "
            "out of every rate; fix its hidden tests or reference_patch and run it again"
        )
    return out


def _arm_lines(arm: Arm, page: Page) -> list[str]:
    out: list[str] = []
    if SETTING.search(arm.name):
        out.append(
            f"variant {arm.name!r} is named by a setting: name it by what it changes, in words, "
            "and keep the setting in its harness lock"
        )
    if arm.changes is None and arm.name != page.baseline:
        out.append(f"variant {arm.name}: no `changes:` saying in words what it changes")
    for n in arm.numbers:
        if n.value is None:
            continue
        if 0 < abs(n.value) < 1:
            out.append(
                f"{n.what}: {n.value:g} reads as a fraction; show points out of 100 "
                f"({100 * n.value:.1f})"
            )
        if n.low is None or n.high is None:
            out.append(f"{n.what}: no interval; show its 95% interval")
        if n.n_tasks is None or n.n_trials is None:
            out.append(f"{n.what}: no n; show the tasks and trials it rests on")
    if arm.flagged_in_headline:
        out.append(
            f"variant {arm.name}: {arm.flagged_in_headline} flagged pass(es) counted in the "
            "headline; count passes with a tamper or run signal apart and leave them out of it"
        )
    sought = page.min_effect_pts
    if arm.name != page.baseline and sought is not None and arm.n_tasks is not None:
        if arm.mde_pts is None or arm.mde_pts > sought:
            can = (
                "cannot detect any effect"
                if arm.mde_pts is None or arm.mde_pts >= 100
                else f"detect only {arm.mde_pts:.1f} pts"
            )
            design = f"{arm.n_tasks} task(s) x {arm.trials_per_task or 0:.3g} trial(s)"
            more = (
                f"run {arm.tasks_needed} tasks" if arm.tasks_needed else "run far more tasks"
            ) + (f", or {arm.trials_needed} trials per task" if arm.trials_needed else "")
            out.append(
                f"variant {arm.name}: the spec seeks {sought:g} pts but {design} {can} at 80% "
                f"power; {more}, or seek a larger effect"
            )
    return out
