"""decide(): a pass needs exit 0 and a readable report of passing tests with no failure."""

from __future__ import annotations

import pytest

from hangar_dagster.grading.grader import decide
from hangar_dagster.grading.junit import JunitResult

pytestmark = pytest.mark.unit


def report(
    total: int, passed: int, failed: int = 0, errors: int = 0, skipped: int = 0
) -> JunitResult:
    counts = {
        "total": total,
        "passed": passed,
        "failed": failed,
        "errors": errors,
        "skipped": skipped,
    }
    return JunitResult(True, None, counts)


BROKEN = JunitResult(False, "junit.xml: not a JUnit XML report (syntax error)")


@pytest.mark.parametrize(
    ("exit_code", "timed_out", "junit", "passed", "reason_has"),
    [
        (0, False, report(3, 3), True, None),
        (0, False, report(3, 2, skipped=1), True, None),
        (1, False, report(3, 2, failed=1), False, None),  # plain failing tests: no reason
        (1, False, report(3, 2, errors=1), False, None),
        (0, False, report(3, 2, failed=1), False, "exited 0"),
        (1, False, report(3, 3), False, "exited 1"),
        (2, False, report(3, 3), False, "exited 2"),
        (0, False, report(0, 0), False, "no hidden tests"),
        (5, False, report(0, 0), False, "no hidden tests"),
        (0, False, report(2, 0, skipped=2), False, "skipped"),
        (0, False, BROKEN, False, "no usable JUnit report"),
        (None, True, report(3, 3), False, "timed out"),
        (None, True, BROKEN, False, "timed out"),
    ],
)
def test_decide_table(
    exit_code: int | None, timed_out: bool, junit: JunitResult, passed: bool, reason_has: str | None
) -> None:
    got_passed, reason = decide(exit_code, timed_out, junit)
    assert got_passed is passed
    if reason_has is None:
        assert reason is None
    else:
        assert reason is not None and reason_has in reason


def test_decide_never_passes_an_unreadable_report_even_with_exit_zero() -> None:
    # The report's own error is carried into the reason, so a reader sees why.
    assert decide(0, False, BROKEN) == (False, f"no usable JUnit report: {BROKEN.error}")
