"""The readback: each line a reader would need appears when its cause is there, and goes away
when it is fixed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from hangar_dagster.results.readback import Arm, Number, Page, readback

pytestmark = pytest.mark.unit


def rate(what: str, value: float = 44.4) -> Number:
    return Number(what, value, low=9.2, high=86.3, n_tasks=3, n_trials=9)


def clean() -> Page:
    """A page a teammate can read: nothing to say."""
    return Page(
        question="Does the skill help?",
        hypothesis="It steers the agent to the general fix.",
        min_effect_pts=20,
        baseline="plain",
        arms=(
            Arm("plain", changes="the base playbook only", numbers=(rate("plain pass rate"),)),
            Arm(
                "skill",
                changes="adds the general-fix skill",
                numbers=(rate("skill pass rate", 77.8), rate("skill - plain", 33.3)),
                mde_pts=15.0,
                tasks_needed=8,
                n_tasks=12,
                trials_per_task=3,
            ),
        ),
    )


def with_arm(page: Page, arm: str, /, **change: object) -> Page:
    arms = tuple(dataclasses.replace(a, **change) if a.name == arm else a for a in page.arms)  # type: ignore[arg-type]
    return dataclasses.replace(page, arms=arms)


def with_number(page: Page, what: str, **change: object) -> Page:
    arms = tuple(
        dataclasses.replace(
            a,
            numbers=tuple(
                dataclasses.replace(n, **change) if n.what == what else n  # type: ignore[arg-type]
                for n in a.numbers
            ),
        )
        for a in page.arms
    )
    return dataclasses.replace(page, arms=arms)


CASES: dict[str, tuple[Callable[[Page], Page], str]] = {
    "no question": (lambda p: dataclasses.replace(p, question=None), "no question: "),
    "no hypothesis": (lambda p: dataclasses.replace(p, hypothesis=None), "no hypothesis: "),
    "no decision rule": (
        lambda p: dataclasses.replace(p, min_effect_pts=None),
        "no decision rule: give the smallest effect",
    ),
    "no baseline": (
        lambda p: dataclasses.replace(p, baseline=None),
        "no baseline: name the variant the others are compared with in `baseline:`",
    ),
    "a fraction": (
        lambda p: with_number(p, "skill pass rate", value=0.75),
        "skill pass rate: 0.75 reads as a fraction; show points out of 100 (75.0)",
    ),
    "no interval": (
        lambda p: with_number(p, "skill - plain", low=None),
        "skill - plain: no interval; show its 95% interval",
    ),
    "no n": (
        lambda p: with_number(p, "plain pass rate", n_trials=None),
        "plain pass rate: no n; show the tasks and trials it rests on",
    ),
    "no changes": (
        lambda p: with_arm(p, "skill", changes=None),
        "variant skill: no `changes:` saying in words what it changes",
    ),
    "an effect this n cannot detect": (
        lambda p: with_arm(
            p, "skill", mde_pts=57.5, n_tasks=3, tasks_needed=31, trials_needed=None
        ),
        "variant skill: the spec seeks 20 pts but 3 task(s) x 3 trial(s) detect only 57.5 pts "
        "at 80% power; run 31 tasks, or seek a larger effect",
    ),
    "no effect detectable at all": (
        lambda p: with_arm(p, "skill", mde_pts=None, n_tasks=1),
        "variant skill: the spec seeks 20 pts but 1 task(s) x 3 trial(s) cannot detect any "
        "effect at 80% power",
    ),
    "flagged passes in the headline": (
        lambda p: with_arm(p, "skill", flagged_in_headline=2),
        "variant skill: 2 flagged pass(es) counted in the headline",
    ),
    "an invalid task": (
        lambda p: dataclasses.replace(p, invalid_tasks={"durations": "passes on base"}),
        "task durations is invalid (passes on base): its trials are left out of every rate",
    ),
    # last: the later cases find the arm by its name
    "named by a setting": (
        lambda p: with_arm(p, "skill", name="dapo-lr5e-05-s17-30st"),
        "variant 'dapo-lr5e-05-s17-30st' is named by a setting: name it by what it changes",
    ),
}


def test_a_readable_page_reads_clean() -> None:
    assert readback(clean()) == []


@pytest.mark.parametrize("case", CASES)
def test_each_line_appears_with_its_cause_and_goes_with_it(case: str) -> None:
    breaks, expected = CASES[case]
    lines = readback(breaks(clean()))
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    assert readback(clean()) == []  # fixed: the line is gone


def test_every_problem_is_listed_at_once() -> None:
    page = clean()
    for breaks, _ in CASES.values():
        page = breaks(page)
    lines = readback(page)
    for case, (_, expected) in CASES.items():
        # power is read against the decision rule, which "no decision rule" took away
        if case not in ("an effect this n cannot detect", "no effect detectable at all"):
            # the renamed arm's lines name it by its new name: match past the name
            tail = expected.split(": ", 1)[1] or expected
            assert any(line.startswith(expected) or tail in line for line in lines), case
    assert len(lines) == len(CASES) - 2


@pytest.mark.parametrize(
    "name", ["lr5e-05-s17", "plain-seed3", "v2", "h-0123456789ab", "skill-s17", "0123abcd4567"]
)
def test_names_made_of_settings_are_caught(name: str) -> None:
    page = dataclasses.replace(with_arm(clean(), "skill", name=name), baseline="plain")
    assert any("is named by a setting" in line for line in readback(page))


@pytest.mark.parametrize("name", ["plain", "skill", "general-fix", "sonnet-4", "no-skills"])
def test_names_in_words_are_not_taken_for_settings(name: str) -> None:
    page = dataclasses.replace(with_arm(clean(), "skill", name=name), baseline="plain")
    assert readback(page) == []


def test_a_zero_or_a_hundred_is_not_a_fraction() -> None:
    for value in (0.0, 100.0, 1.0):
        assert readback(with_number(clean(), "skill pass rate", value=value)) == []


def test_the_baseline_needs_no_changes_line_and_no_power() -> None:
    page = with_arm(clean(), "plain", changes=None, mde_pts=None, n_tasks=None)
    assert readback(page) == []


def test_no_baseline_names_the_variants_to_choose_from() -> None:
    (line,) = readback(dataclasses.replace(clean(), baseline=None))
    assert line.endswith("(one of plain, skill)")


def test_one_variant_needs_no_baseline() -> None:
    page = dataclasses.replace(clean(), baseline=None, arms=clean().arms[:1])
    assert readback(page) == []
