"""What became of each merge a shadow looked at, and the candidate's pass rate over them.

A merge is dropped by the sensor (its decision says why), by its task's base check
(``base_passes``: the merged tests pass without the change; ``reference_fails``: they fail
with the merged change; ``no_tests_on_base``: none was collected; ``base_check_error``: the
check could not judge it), or else it is
``queued`` until its trial is graded, then ``passed`` or ``failed`` against what was merged,
or ``not_counted`` where the report would leave the trial out of its rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hangar_dagster.results.records import BaseCheckRecord
from hangar_dagster.results.stats import Rate, pass_rate
from hangar_dagster.results.store import Store
from hangar_dagster.shadow.policy import MergeDecision, ShadowState

CANDIDATE = "candidate"  # the one variant of a shadow experiment (shadow/tick.py)


@dataclass(frozen=True)
class MergeRow:
    sha: str
    subject: str
    night: str
    state: str  # dropped, queued, passed, failed, not_counted
    reason: str | None  # a drop's reason code, or what holds a counted trial back
    detail: str | None
    experiment_id: str | None
    trial_key: str | None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _check_drop(check: BaseCheckRecord) -> str:
    """The gate a merge's task failed, from its base check (grading/grader.py)."""
    if check.setup_error:
        return "base_check_error"
    if check.base_passed:
        return "base_passes"
    if check.reference_passed is False:
        return "reference_fails"
    if not check.base_counts.get("total"):
        return "no_tests_on_base"
    return "base_check_error"  # e.g. its environment build failed


def _trial_state(row: dict[str, Any] | None) -> tuple[str, str | None]:
    if row is None:
        return "queued", "its trial has not run (eval window, budget or queue)"
    if row["outcome_class"] == "infra_error":
        return "queued", f"infra_error / {row['infra_reason']}: retried"
    if row["passed"] is None:
        return "queued", "its trial waits for a grade"
    # Left out of the rate as the report leaves them out (docs/report.md, "What counts in a rate").
    if row.get("task_invalid"):
        return "not_counted", "its task is invalid"
    ran = sum((row.get(k) or 0) for k in ("hidden_passed", "hidden_failed", "hidden_errors"))
    if not ran:
        return "not_counted", "no hidden test ran"
    if row["passed"] and row.get("tamper_signals") not in (None, "[]", []):
        return "not_counted", "a pass with tamper signals"
    return ("passed", None) if row["passed"] else ("failed", None)


def merge_rows(state: ShadowState, store: Store) -> list[MergeRow]:
    checks: dict[str, dict[str, Any]] = {}
    index: dict[str, dict[str, dict[str, Any]]] = {}
    rows: list[MergeRow] = []
    for d in state.merges:
        if d.kept and d.experiment_id is None:  # kept, submitted when the window is open
            rows.append(_row(d, "queued", None, "kept; submitted inside the eval window", None))
            continue
        if not d.kept or d.experiment_id is None or d.task is None:
            rows.append(_row(d, "dropped", d.reason, d.detail, None))
            continue
        eid = d.experiment_id
        if eid not in checks:
            checks[eid] = dict(store.base_checks(eid))
            index[eid] = {r["trial_key"]: r for r in store.index(eid)}
        key = f"{CANDIDATE}/{d.task}/1"
        check = checks[eid].get(d.task)
        if check is not None and (check.invalid or check.setup_error):
            reason = _check_drop(check)
            rows.append(_row(d, "dropped", reason, check.reason, key))
            continue
        state_, why = _trial_state(index[eid].get(key))
        rows.append(_row(d, state_, None, why, key))
    return rows


def _row(
    d: MergeDecision, state: str, reason: str | None, detail: str | None, key: str | None
) -> MergeRow:
    return MergeRow(d.sha, d.subject, d.night, state, reason, detail, d.experiment_id, key)


def shadow_rate(rows: list[MergeRow]) -> Rate | None:
    """The candidate's pass rate over the merges whose trial counted (one trial per merge,
    each merge a task of the interval), or None before any did."""
    outcomes = {r.sha: [r.state == "passed"] for r in rows if r.state in ("passed", "failed")}
    return pass_rate(outcomes) if outcomes else None
