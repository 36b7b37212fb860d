"""The verdicts the asset checks report, decided from stored base checks and grades alone."""

from __future__ import annotations

import pytest

from hangar_dagster.grading.verdicts import (
    GRADE_SIGNALS,
    base_must_fail,
    grade_passed,
    no_contamination,
    no_tamper_signals,
    no_touched_tests,
    reference_must_pass,
    trust_isolated,
)
from hangar_dagster.results.records import BaseCheckRecord
from tests import factories as f

EMPTY = {"total": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0}
BOTH_PASS = {"total": 2, "passed": 2, "failed": 0, "errors": 0, "skipped": 0}
ONE_FAILS = {"total": 2, "passed": 1, "failed": 1, "errors": 0, "skipped": 0}

pytestmark = pytest.mark.unit


def test_a_valid_task_fails_on_base_and_passes_on_its_reference() -> None:
    check = f.base_check(base_counts=ONE_FAILS, reference_counts=BOTH_PASS)
    base, ref = base_must_fail(check), reference_must_pass(check)
    assert (base.passed, base.description) == (
        True,
        "hidden tests fail on base (1 passed, 1 failed, 0 error(s) of 2)",
    )
    assert (
        base.metadata["base_counts"] == ONE_FAILS and base.metadata["checked_in_run"] == "run-base"
    )
    assert (ref.passed, ref.description) == (
        True,
        "hidden tests pass on reference_patch (2 passed, 0 failed, 0 error(s) of 2)",
    )


def test_tests_that_pass_on_base_or_collect_nothing_fail_base_must_fail() -> None:
    passing = base_must_fail(f.base_check(base_passed=True, base_counts=BOTH_PASS, invalid=True))
    assert not passing.passed
    assert passing.description.startswith("invalid task: hidden tests pass on base")
    empty = base_must_fail(f.base_check(base_counts=EMPTY, invalid=True))
    assert (empty.passed, empty.description) == (
        False,
        "invalid task: no hidden tests were collected on base",
    )


def test_a_failing_reference_fails_and_no_reference_passes_with_a_note() -> None:
    failing = reference_must_pass(
        f.base_check(reference_passed=False, reference_counts=ONE_FAILS, invalid=True)
    )
    assert (failing.passed, failing.description) == (
        False,
        "invalid task: hidden tests fail on reference_patch (1 passed, 1 failed, 0 error(s) of 2)",
    )
    none = reference_must_pass(
        f.base_check(reference_given=False, reference_passed=None, reference_counts=None)
    )
    assert (none.passed, none.description) == (True, "no reference_patch given: nothing to check")
    assert none.metadata == {"reference_given": False}


@pytest.mark.parametrize(
    "check",
    [
        f.base_check(base_counts=ONE_FAILS),
        f.base_check(base_passed=True, base_counts=BOTH_PASS, invalid=True, reason="r"),
        f.base_check(base_counts=EMPTY, invalid=True, reason="r"),
        f.base_check(reference_passed=False, invalid=True, reason="r"),
        f.base_check(reference_given=False, reference_passed=None, reference_counts=None),
    ],
)
def test_a_task_is_invalid_exactly_when_one_of_its_checks_fails(check: BaseCheckRecord) -> None:
    assert check.invalid == (
        not base_must_fail(check).passed or not reference_must_pass(check).passed
    )


def test_a_clean_passing_grade_passes_every_signal() -> None:
    grade = f.grade("base", "t1", passed=True)
    verdicts = {name: decide(grade) for name, (_what, decide) in GRADE_SIGNALS.items()}
    assert all(v.passed for v in verdicts.values()), verdicts
    assert set(verdicts) == {
        "grade_passed",
        "trust_isolated",
        "no_tamper_signals",
        "no_contamination",
        "no_touched_tests",
    }


def test_each_signal_fails_on_its_own_field_and_names_what_it_saw() -> None:
    failed = f.grade("base", "t1", passed=False)
    assert grade_passed(failed).description == "grade failed: 1 passed, 2 failed, 0 error(s) of 3"
    why = grade_passed(f.grade("base", "t1", passed=False, reason="no JUnit report"))
    assert (why.passed, why.description) == (False, "grade failed: no JUnit report")
    low = trust_isolated(f.grade("base", "t1", trust="best_effort"))
    assert (low.passed, low.description) == (False, "trust best_effort, below isolated")
    tamper = no_tamper_signals(f.grade("base", "t1", tamper_signals=["conftest.py", "run: x"]))
    assert (tamper.passed, tamper.description) == (False, "tamper signals: conftest.py, run: x")
    assert tamper.metadata == {"tamper_signals": ["conftest.py", "run: x"]}
    leaked = no_contamination(f.grade("base", "t1", contamination=["patch"]))
    assert (leaked.passed, leaked.description) == (False, "contamination: patch")
    touched = no_touched_tests(f.grade("base", "t1", touched_tests=["tests/test_calc.py"]))
    assert (touched.passed, touched.description) == (False, "touched tests: tests/test_calc.py")
