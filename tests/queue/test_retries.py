"""Infra retries, the outage breaker and outcome classes, at their edges (hangar_dagster.queue.retries)."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

import factories as f
import pytest

from hangar_dagster.grading.grader import decide
from hangar_dagster.grading.junit import parse_junit_bytes
from hangar_dagster.queue.retries import (
    CAP_SENTENCE,
    INFRA_REASONS,
    EvidenceClass,
    Retry,
    RetryConfigError,
    breaker_note,
    evidence_class,
    experiment_retry_cap,
    outage_streak,
    plan_retries,
)
from hangar_dagster.results.records import GradeRecord, TrialRecord
from hangar_dagster.settings import Settings

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "hangar_dagster"
MANY = 1000  # planned trials when a test is not about the 10% cap


def _infra(
    task: str, attempt: int = 1, reason: str = "rate_limit", minute: int = 0, variant: str = "v"
) -> TrialRecord:
    return f.trial(
        variant,
        task,
        attempt=attempt,
        outcome_class="infra_error",
        infra_reason=reason,
        finished_at=f.T0 + dt.timedelta(minutes=minute),
    )


def _ok(task: str, attempt: int = 1, minute: int = 0, **kw: Any) -> TrialRecord:
    return f.trial(
        "v", task, attempt=attempt, finished_at=f.T0 + dt.timedelta(minutes=minute), **kw
    )


# --- settings -------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "want"), [(None, 2), ("", 2), ("0", 0), (" 3 ", 3)])
def test_max_infra_retries_reads_the_environment(raw: str | None, want: int) -> None:
    env = {} if raw is None else {"HANGAR_TRIAL_INFRA_RETRIES": raw}
    assert Settings.from_env(env).infra_retries == want


@pytest.mark.parametrize("raw", ["two", "1.5", "-1"])
def test_a_bad_retry_count_names_the_variable_and_the_fix(raw: str) -> None:
    with pytest.raises(RetryConfigError, match=r"HANGAR_TRIAL_INFRA_RETRIES=.*whole number >= 0"):
        _ = Settings.from_env({"HANGAR_TRIAL_INFRA_RETRIES": raw}).infra_retries


def test_the_breaker_limit_defaults_to_5_and_refuses_0() -> None:
    assert Settings.from_env({}).breaker_streak == 5
    with pytest.raises(RetryConfigError, match="HANGAR_OUTAGE_BREAKER_STREAK='0' is below 1"):
        _ = Settings.from_env({"HANGAR_OUTAGE_BREAKER_STREAK": "0"}).breaker_streak


@pytest.mark.parametrize(
    ("planned", "cap"), [(1, 1), (9, 1), (10, 1), (11, 1), (19, 1), (20, 2), (21, 2), (100, 10)]
)
def test_the_experiment_cap_is_10_percent_rounded_down_and_at_least_one(
    planned: int, cap: int
) -> None:
    assert experiment_retry_cap(planned) == cap


def test_the_cap_refuses_an_experiment_without_trials() -> None:
    with pytest.raises(ValueError, match="planned_trials must be >= 1"):
        experiment_retry_cap(0)


# --- retries per key ------------------------------------------------------------------------


def test_the_second_retry_is_planned_and_the_third_is_not() -> None:
    env = {"HANGAR_TRIAL_INFRA_RETRIES": "2"}
    two = [_infra("t1", 1), _infra("t1", 2, minute=1)]
    assert plan_retries(two, MANY, Settings.from_env(env).infra_retries) == plan_retries(
        two, MANY, Settings.from_env(env).infra_retries
    )  # deterministic
    plan = plan_retries(two, MANY, Settings.from_env(env).infra_retries)
    assert plan.retries == [Retry("v/t1/1", 3, "run-v-t1-1-2", counts_toward_cap=True)]
    assert plan.notes == []

    plan = plan_retries(
        [*two, _infra("t1", 3, reason="preempted", minute=2)],
        MANY,
        Settings.from_env(env).infra_retries,
    )
    assert plan.retries == []
    assert plan.notes == [
        "no retry left for v/t1/1: attempt 3 ended as infra_error / preempted "
        "after 2 of 2 retries (HANGAR_TRIAL_INFRA_RETRIES)"
    ]


def test_zero_retries_per_key_retries_nothing() -> None:
    plan = plan_retries(
        [_infra("t1")], MANY, Settings.from_env({"HANGAR_TRIAL_INFRA_RETRIES": "0"}).infra_retries
    )
    assert plan.retries == [] and "after 0 of 0 retries" in plan.notes[0]


def test_only_the_highest_attempt_of_a_key_is_looked_at() -> None:
    attempts = [_infra("t1", 1), _ok("t1", 2, minute=1), _ok("t2")]
    assert plan_retries(attempts, MANY, Settings.from_env({}).infra_retries).retries == []


def test_drift_is_never_retried() -> None:
    plan = plan_retries([_infra("t1", reason="drift")], MANY, Settings.from_env({}).infra_retries)
    assert plan.retries == []
    assert plan.notes == ["drift is never retried: v/t1/1"]


def test_attempts_of_two_experiments_or_a_repeated_attempt_are_refused() -> None:
    with pytest.raises(ValueError, match="one experiment expected, got exp-0001, exp-2"):
        plan_retries(
            [_infra("t1"), f.trial(experiment_id="exp-2")],
            MANY,
            Settings.from_env({}).infra_retries,
        )
    with pytest.raises(ValueError, match="v/t1/1 attempt 1 is given twice"):
        outage_streak([_infra("t1"), _infra("t1")])


# --- the experiment's 10% cap ---------------------------------------------------------------


@pytest.mark.parametrize(("planned", "allowed"), [(9, 1), (10, 1), (11, 1), (20, 2)])
def test_the_cap_stops_retries_with_a_note(planned: int, allowed: int) -> None:
    failed = [_infra(f"t{i}", minute=i) for i in range(3)]
    plan = plan_retries(failed, planned, Settings.from_env({}).infra_retries)
    # the earliest failures go first
    assert [r.trial_key for r in plan.retries] == [f"v/t{i}/1" for i in range(allowed)]
    blocked = ", ".join(f"v/t{i}/1" for i in range(allowed, 3))
    assert plan.notes == [
        f"retries stopped: {allowed} of {allowed} allowed (10% of {planned} trials, "
        f"at least 1); not retried: {blocked}. {CAP_SENTENCE}"
    ]


def test_retries_already_started_use_the_cap() -> None:
    # t0 was retried once (attempt 2 passed): that used the one retry 10 trials allow
    attempts = [_infra("t0", 1, reason="preempted"), _ok("t0", 2, minute=1), _infra("t1", minute=2)]
    plan = plan_retries(attempts, 10, Settings.from_env({}).infra_retries)
    assert plan.retries == []
    assert plan.notes == [
        "retries stopped: 1 of 1 allowed (10% of 10 trials, at least 1); not retried: v/t1/1. "
        + CAP_SENTENCE
    ]


def test_power_down_retries_are_exempt_from_the_cap() -> None:
    # the cap is used up by t0's retry; a drained t1 is still retried, a rate-limited t2 is not
    attempts = [
        _infra("t0", 1, reason="preempted"),
        _ok("t0", 2, minute=1),
        _infra("t1", reason="power_down", minute=2),
        _infra("t2", reason="rate_limit", minute=3),
    ]
    plan = plan_retries(attempts, 9, Settings.from_env({}).infra_retries)
    assert plan.retries == [Retry("v/t1/1", 2, "run-v-t1-1-1", counts_toward_cap=False)]
    assert plan.notes[0].endswith(f"not retried: v/t2/1. {CAP_SENTENCE}")


def test_interrupted_trials_are_retried_like_power_downs() -> None:
    # SIGINT to `run --wait` cut off t1 and t2 at once: both come back, the cap (1) untouched,
    # and the breaker (streak 1) is not tripped by them.
    attempts = [
        _infra("t1", reason="interrupted", minute=1),
        _infra("t2", reason="interrupted", minute=1),
        _infra("t3", reason="preempted", minute=2),
    ]
    plan = plan_retries(attempts, 9, Settings.from_env({}).infra_retries)
    assert [(r.trial_key, r.counts_toward_cap) for r in plan.retries] == [
        ("v/t1/1", False),
        ("v/t2/1", False),
        ("v/t3/1", True),
    ]
    assert outage_streak(attempts[:2]) == (0, [])


def test_earlier_power_down_retries_leave_the_cap_unused() -> None:
    attempts = [
        _infra("t0", 1, reason="power_down"),
        _ok("t0", 2, minute=1),
        _infra("t1", reason="sandbox_create", minute=2),
    ]
    plan = plan_retries(attempts, 9, Settings.from_env({}).infra_retries)
    assert plan.retries == [Retry("v/t1/1", 2, "run-v-t1-1-1", counts_toward_cap=True)]


def test_control_plane_restart_retries_are_exempt_from_the_cap() -> None:
    # one restart cut off three trials of a 9-trial experiment (cap 1): all three are retried
    cut = [_infra(t, reason="control_plane_restart", minute=1) for t in ("t1", "t2", "t3")]
    plan = plan_retries(
        [*cut, _infra("t4", reason="preempted", minute=2)], 9, Settings.from_env({}).infra_retries
    )
    assert [(r.trial_key, r.counts_toward_cap) for r in plan.retries] == [
        ("v/t1/1", False),
        ("v/t2/1", False),
        ("v/t3/1", False),
        ("v/t4/1", True),
    ]
    assert plan.notes == []
    # ...but each still uses one of its key's retries
    again = [_infra("t1", n, reason="control_plane_restart", minute=n) for n in (1, 2, 3)]
    assert plan_retries(again, MANY, Settings.from_env({}).infra_retries).retries == []


def test_power_down_retries_still_count_toward_the_per_key_limit() -> None:
    drained = [_infra("t1", n, reason="power_down", minute=n) for n in (1, 2, 3)]
    plan = plan_retries(drained, MANY, Settings.from_env({}).infra_retries)
    assert plan.retries == [] and plan.notes[0].startswith("no retry left for v/t1/1")


# --- the outage breaker ---------------------------------------------------------------------


def test_the_breaker_trips_at_its_limit_not_one_before() -> None:
    failures = [
        _infra("t1", reason="sandbox_create", minute=1),
        _infra("t2", reason="provider_5xx", minute=2),
        _infra("t1", 2, reason="rate_limit", minute=3),
    ]
    assert outage_streak(failures) == (3, ["v/t1/1", "v/t2/1", "v/t1/1"])
    assert breaker_note(failures[:2], limit=3) is None
    note = breaker_note(failures, limit=3)
    assert note == (
        "outage breaker tripped: 3 systemic infra failures in a row (limit 3, "
        "HANGAR_OUTAGE_BREAKER_STREAK): v/t1/1 (attempt 1, sandbox_create), "
        "v/t2/1 (attempt 1, provider_5xx), v/t1/1 (attempt 2, rate_limit); by reason: "
        "provider_5xx x1, rate_limit x1, sandbox_create x1. "
        "No further trial of this experiment starts."
    )


def test_the_breaker_limit_comes_from_the_environment() -> None:
    failures = [_infra(f"t{i}", minute=i) for i in range(4)]
    assert breaker_note(failures, Settings.from_env({}).breaker_streak) is None  # 4 < 5
    assert (
        breaker_note(
            failures, Settings.from_env({"HANGAR_OUTAGE_BREAKER_STREAK": "4"}).breaker_streak
        )
        is not None
    )
    with pytest.raises(ValueError, match="limit must be >= 1"):
        breaker_note(failures, limit=0)


def test_a_measurement_resets_the_streak_whatever_its_result() -> None:
    before = [_infra(f"t{i}", minute=i) for i in range(3)]
    # an agent error is a real measurement: the provider and the sandbox worked
    reset = [*before, _ok("t9", minute=10, outcome_class="agent_error", agent_exit_code=1)]
    assert outage_streak(reset) == (0, [])
    after = [*reset, _infra("t4", minute=11)]
    assert outage_streak(after) == (1, ["v/t4/1"])
    # finished_at decides the order, not the order given
    assert outage_streak(list(reversed(after))) == (1, ["v/t4/1"])


def test_drift_power_down_and_restarts_neither_extend_nor_reset_the_streak() -> None:
    attempts = [
        _infra("t1", minute=1),
        _infra("t2", reason="power_down", minute=2),
        _infra("t3", reason="drift", minute=3),
        _infra("t4", reason="control_plane_restart", minute=4),
        _infra("t5", reason="preempted", minute=5),
    ]
    assert outage_streak(attempts) == (2, ["v/t1/1", "v/t5/1"])
    assert outage_streak(attempts[1:4]) == (0, [])


# --- outcome classes ------------------------------------------------------------------------

_JUNIT = """<testsuite name="hidden">{}</testsuite>"""
_PASS = '<testcase classname="t" name="ok"/>'
_FAIL = '<testcase classname="t" name="bad"><failure message="no"/></testcase>'
_SKIP = '<testcase classname="t" name="later"><skipped/></testcase>'
_NONE_RAN = dict.fromkeys(("total", "passed", "failed", "errors", "skipped"), 0)


def _graded(
    variant: str, exit_code: int | None, timed_out: bool, junit: str, **kw: Any
) -> GradeRecord:
    """A grade as the grader makes it: verdict and reason from grader.decide on real JUnit."""
    parsed = parse_junit_bytes(junit.encode())
    passed, reason = decide(exit_code, timed_out, parsed)
    counts = parsed.counts
    return f.grade(
        variant, passed=passed, reason=reason, exit_code=exit_code, hidden_tests=counts, **kw
    )


# Each case is its own variant (task t1): the trial's fields, its grade or None, its class.
CASES: list[tuple[str, dict[str, Any], GradeRecord | None, EvidenceClass]] = [
    ("pass", {}, _graded("pass", 0, False, _JUNIT.format(_PASS * 3)), "admissible"),
    ("fail", {}, _graded("fail", 1, False, _JUNIT.format(_PASS + _FAIL)), "admissible"),
    ("exit0-fail", {}, _graded("exit0-fail", 0, False, _JUNIT.format(_FAIL)), "admissible"),
    (
        "agent-error",
        {"outcome_class": "agent_error", "agent_exit_code": 2},
        _graded("agent-error", 1, False, _JUNIT.format(_FAIL * 3)),
        "admissible",
    ),
    (
        "empty",
        {"outcome_class": "empty_patch", "patch_bytes": 0, "changed_files": []},
        _graded("empty", 1, False, _JUNIT.format(_FAIL * 3)),
        "admissible",
    ),
    ("no-grade", {}, None, "evidence_failure"),
    ("malformed", {}, _graded("malformed", 1, False, "<testsuite"), "evidence_failure"),
    ("no-tests", {}, _graded("no-tests", 5, False, _JUNIT.format("")), "evidence_failure"),
    ("skipped", {}, _graded("skipped", 0, False, _JUNIT.format(_SKIP * 2)), "evidence_failure"),
    ("grader-timeout", {}, _graded("grader-timeout", None, True, ""), "evidence_failure"),
    (
        "patch-rejected",
        {"outcome_class": "timeout"},
        f.grade(
            "patch-rejected",
            passed=False,
            reason="patch does not apply: error: corrupt patch",
            exit_code=None,
            hidden_tests=_NONE_RAN,
        ),
        "evidence_failure",
    ),
    (
        "invalid-task",
        {},
        _graded("invalid-task", 0, False, _JUNIT.format(_PASS), task_invalid=True),
        "evidence_failure",
    ),
    (
        "preempted",
        {"outcome_class": "infra_error", "infra_reason": "preempted"},
        f.grade(
            "preempted",
            passed=False,
            reason="not graded: infra_error (preempted)",
            hidden_tests=_NONE_RAN,
        ),
        "execution_failure",
    ),
    (
        "drift",
        {"outcome_class": "infra_error", "infra_reason": "drift"},
        None,
        "execution_failure",
    ),
]


@pytest.mark.parametrize(("variant", "trial_kw", "grade", "want"), CASES, ids=[c[0] for c in CASES])
def test_evidence_class(
    variant: str, trial_kw: dict[str, Any], grade: GradeRecord | None, want: EvidenceClass
) -> None:
    assert evidence_class(f.trial(variant, **trial_kw), grade) == want


def test_evidence_class_refuses_another_attempts_grade() -> None:
    with pytest.raises(ValueError, match="is not the grade of trial"):
        evidence_class(f.trial("v", "t1", attempt=2), f.grade("v", "t1", attempt=1))


def test_variant_summary_counts_the_classes_with_the_same_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    store.put(f.experiment())
    want: dict[str, str] = {}
    for variant, trial_kw, grade, _ in CASES:
        trial = f.trial(variant, **trial_kw)
        store.put(trial)
        if grade is not None:
            store.put(grade)
        want[variant] = evidence_class(trial, grade)
    columns = {
        "execution_failures": "execution_failure",
        "evidence_failures": "evidence_failure",
        "admissible": "admissible",
    }
    got: dict[str, str] = {}
    for row in store.summary(f.EXP):
        counts = {cls: row[col] for col, cls in columns.items()}
        assert sum(counts.values()) == row["trials"] == 1, row
        (got[row["variant"]],) = (cls for cls, n in counts.items() if n)
    assert got == want
    assert set(want.values()) == set(columns.values())  # the table covers every class


def test_a_base_check_stored_after_the_grade_makes_the_trial_an_evidence_failure_in_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The grade was made before the task was checked (task_invalid = false); its base check,
    # stored later, finds the task invalid. Python and the view read the same rule.
    store = f.make_store(tmp_path, monkeypatch)
    store.put(f.experiment())
    trial = f.trial("late", task="t1")
    grade = _graded("late", 0, True, _JUNIT.format(_PASS))
    assert grade.task_invalid is False
    store.put(trial)
    store.put(grade)
    assert evidence_class(trial, grade) == "admissible"
    (row,) = store.summary(f.EXP)
    assert (row["admissible"], row["evidence_failures"], row["invalid_task"]) == (1, 0, 0)
    store.put(f.base_check("t1", invalid=True, reason="the hidden tests pass on base"))
    assert evidence_class(trial, grade, base_check_invalid=True) == "evidence_failure"
    (row,) = store.summary(f.EXP)
    assert (row["admissible"], row["evidence_failures"], row["invalid_task"]) == (0, 1, 1)
    assert (row["graded"], row["passed"]) == (0, 0)


# --- the documented reason list -------------------------------------------------------------


def test_every_infra_reason_the_package_writes_is_known_and_documented() -> None:
    written = set()
    for source in PACKAGE.rglob("*.py"):
        text = source.read_text()
        written |= set(re.findall(r'InfraError\(\s*"(\w+)"', text))
        written |= set(re.findall(r'infra_reason(?:,\s*[\w.]+)?\s*=\s*"(\w+)"', text))
    assert {"sandbox_create", "drift", "internal"} <= written  # the search finds them
    assert written <= INFRA_REASONS.keys()
    doc = (PACKAGE.parent / "docs" / "queue.md").read_text()
    section = doc.split("## Infra retries, the outage breaker and outcome classes", 1)[1]
    for reason in INFRA_REASONS:
        assert f"`{reason}`" in section, f"docs/queue.md does not list infra_reason {reason}"


def test_an_auth_failure_is_never_retried_and_counts_for_the_breaker() -> None:
    # A refused key fails every attempt the same way: retrying spends nothing useful, but a
    # streak of them is an outage of the operator's credentials, which the breaker must stop.
    failed = [_infra(f"t{i}", minute=i, reason="auth") for i in range(5)]
    plan = plan_retries(failed, MANY, Settings.from_env({}).infra_retries)
    assert plan.retries == []
    assert "auth is never retried: v/t0/1" in plan.notes
    assert "auth" in INFRA_REASONS
    note = breaker_note(failed, 5)
    assert note is not None and "auth x5" in note
