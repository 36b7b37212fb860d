"""What the asset checks say about a stored base check or grade: pass or fail, and why.

Dagster-free: ``orchestration/checks.py`` turns each ``Verdict`` into an asset
check result on its partition. A base check has two verdicts (the hidden tests
must fail on the base, and pass on the reference patch when one is given); a
task is invalid exactly when one of them fails. A grade has one verdict per
signal an eval engineer scans for (``GRADE_SIGNALS``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hangar_dagster.results.records import BaseCheckRecord, GradeRecord

MetadataValue = bool | int | str | list[str] | dict[str, int]


@dataclass(frozen=True)
class Verdict:
    passed: bool
    description: str
    metadata: dict[str, MetadataValue] = field(default_factory=dict)


def _counts(counts: dict[str, int]) -> str:
    return (
        f"{counts.get('passed', 0)} passed, {counts.get('failed', 0)} failed, "
        f"{counts.get('errors', 0)} error(s) of {counts.get('total', 0)}"
    )


def base_must_fail(check: BaseCheckRecord) -> Verdict:
    """The hidden tests must collect something on the unpatched base, and fail there."""
    meta: dict[str, MetadataValue] = {
        "base_sha": check.base_sha,
        "base_counts": check.base_counts,
        "checked_in_run": check.run_id,
    }
    if check.base_passed:
        why = "hidden tests pass on base: they can't tell a fix from no fix"
        return Verdict(False, f"invalid task: {why} ({_counts(check.base_counts)})", meta)
    if check.base_counts.get("total", 0) == 0:
        return Verdict(False, "invalid task: no hidden tests were collected on base", meta)
    return Verdict(True, f"hidden tests fail on base ({_counts(check.base_counts)})", meta)


def reference_must_pass(check: BaseCheckRecord) -> Verdict:
    """The hidden tests must pass on the task's reference_patch; passed (with a note) without one."""
    meta: dict[str, MetadataValue] = {"reference_given": check.reference_given}
    if not check.reference_given:
        return Verdict(True, "no reference_patch given: nothing to check", meta)
    counts = check.reference_counts or {}
    meta["reference_counts"] = counts
    if check.reference_passed:
        return Verdict(True, f"hidden tests pass on reference_patch ({_counts(counts)})", meta)
    return Verdict(
        False, f"invalid task: hidden tests fail on reference_patch ({_counts(counts)})", meta
    )


def grade_passed(g: GradeRecord) -> Verdict:
    counts = _counts(g.hidden_tests)
    if g.passed:
        return Verdict(True, f"hidden tests pass ({counts})")
    return Verdict(False, f"grade failed: {g.reason or counts}", {"reason": g.reason or counts})


def trust_isolated(g: GradeRecord) -> Verdict:
    if g.trust == "isolated":
        return Verdict(True, "graded isolated", {"trust": g.trust})
    return Verdict(False, f"trust {g.trust}, below isolated", {"trust": g.trust})


def _listed(name: str, items: list[str], none: str, some: str) -> Verdict:
    if not items:
        return Verdict(True, none, {name: []})
    return Verdict(False, f"{some}: {', '.join(items)}", {name: list(items)})


def no_tamper_signals(g: GradeRecord) -> Verdict:
    return _listed("tamper_signals", g.tamper_signals, "no tamper signals", "tamper signals")


def no_contamination(g: GradeRecord) -> Verdict:
    return _listed("contamination", g.contamination, "no contamination", "contamination")


def no_touched_tests(g: GradeRecord) -> Verdict:
    return _listed(
        "touched_tests", g.touched_tests, "the patch touches no test file", "touched tests"
    )


# Check name -> (what it asks, its verdict); one asset check per entry on every grades asset.
GRADE_SIGNALS: dict[str, tuple[str, Callable[[GradeRecord], Verdict]]] = {
    "grade_passed": ("The hidden tests pass on the trial's patch.", grade_passed),
    "trust_isolated": ("The grader ran isolated (trust below isolated warns).", trust_isolated),
    "no_tamper_signals": ("The grader saw no sign of tampering.", no_tamper_signals),
    "no_contamination": (
        "The canary is in neither the patch nor the trial's trace and artifacts.",
        no_contamination,
    ),
    "no_touched_tests": ("The patch changes no test file of the base.", no_touched_tests),
}
