"""The rows hangar stores: one pydantic model per table (docs/data.md documents each column).

Every record is written once, whole, to Parquet and DuckDB by ``store``; the
models are the single definition of those tables' columns. Nested values
(counts, lists, manifests, traces) are plain JSON-able types; ``store`` turns
them into JSON text columns.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

OutcomeClass = Literal[
    "completed",  # the agent finished and left a patch: an admissible measurement
    "empty_patch",  # the agent finished and changed nothing: admissible, it fails
    "agent_error",  # the agent exited non-zero: admissible, it fails
    "timeout",  # the agent hit the trial's time limit: admissible, it fails
    "budget_exceeded",  # the agent hit trial_job_budget.max_cost_usd: admissible, it fails
    "infra_error",  # infrastructure ended it (see infra_reason): excluded and retried
]

Trust = Literal["isolated", "best_effort", "low"]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExperimentRecord(Record):
    experiment_id: str
    name: str
    author: str
    submitted_at: dt.datetime
    spec_path: str
    spec_digest: str  # sha256 of the resolved spec with the canary masked
    spec_json: str  # the resolved spec, canary masked
    variants: list[str]
    tasks: list[str]
    trials_per_task: int
    trials_planned: int
    parallel: int
    # Planned trials reused from earlier experiments at submit (experiment/reuse.py): neither
    # run nor paid; the budget projects trials_planned - trials_reused. None: before reuse.
    trials_reused: int | None = None


class PinSetRecord(Record):
    pin_set: str  # pin-<hash>; the hash is over every other field but created_at
    harness_lock: str  # name@sha256:<digest>
    harness_digest: str
    environment_digest: str
    model: str
    model_concrete: bool
    model_concrete_basis: str | None = (
        None  # list | pattern: what vouched for the id (model_policy.py)
    )
    task_bases: dict[str, str]  # task id -> full base SHA
    grader_digest: str
    egress: str
    # What a trial's turn 1 must report (drift.harness_fingerprint) and the environment's fields
    # (drift.environment_pins): compared with each trial to name what drifted.
    harness_fingerprint: dict[str, Any] = Field(default_factory=dict)
    environment: dict[str, Any] = Field(default_factory=dict)
    created_at: dt.datetime


class ExperimentPinRecord(Record):
    """Which pin set a variant of an experiment runs under (pin sets are shared across experiments)."""

    experiment_id: str
    variant: str
    pin_set: str
    run_id: str


class BaseCheckRecord(Record):
    experiment_id: str
    task: str
    base_sha: str
    grader_digest: str
    base_passed: bool  # hidden tests passed on the unpatched base (bad: the task can't tell)
    base_counts: dict[str, int]
    reference_given: bool
    reference_passed: bool | None
    reference_counts: dict[str, int] | None
    invalid: bool
    reason: str | None
    checked_at: dt.datetime
    run_id: str
    # Test ids collected on base or the reference patch: every grade's report must have them.
    expected_tests: list[str] = Field(default_factory=list)
    # Each hidden test's outcome on the unpatched base ({test id: TestOutcome}); None in checks
    # stored before it was recorded.
    base_outcomes: dict[str, str] | None = None
    # The environment build the check ran with (environment/build.py): its digest and how long
    # it took to build (0 when it was cached); its log is builds/<key>/build.log. None: no build.
    build_digest: str | None = None
    build_s: float | None = None
    # Where the base run's modules were loaded from (grading/provenance.py): {module: {from, path}}.
    provenance: dict[str, dict[str, str]] = Field(default_factory=dict)
    # The check could not judge the task: a module of the repo was loaded from another copy
    # (``reason`` names it and both places). The task is left out like an invalid one.
    setup_error: bool = False


class TrialRecord(Record):
    experiment_id: str
    trial_key: str  # variant/task/replicate
    variant: str
    task: str
    replicate: int
    attempt: int
    retry_of: str | None  # run id of the excluded attempt this one replaces
    run_id: str  # the Dagster run that materialized this attempt
    pin_set: str
    harness_digest: str
    environment_digest: str
    model: str
    model_concrete: bool = False  # a concrete, dated id; false for an alias (ordinary jobs only)
    model_concrete_basis: str | None = None  # list | pattern (model_policy.py); None for an alias
    agent: str  # adapter name
    agent_is_standin: bool  # true for the scripted stand-in agent: not a real model
    base_sha: str
    started_at: dt.datetime
    finished_at: dt.datetime
    duration_s: float
    outcome_class: OutcomeClass
    infra_reason: str | None
    # Which half moved and how (harness / environment, field old -> new); set with infra_reason drift.
    drift: str | None = None
    agent_exit_code: int | None
    verify_passed: bool | None
    verify_exit_code: int | None
    patch_sha256: str
    patch_bytes: int
    changed_files: list[str]
    turns: int
    tokens_in: int
    tokens_out: int
    cost_usd: float | None  # None: unknown (the process that knew it died, or no list price)
    error: str | None
    manifest: dict[str, Any]
    trace: dict[str, Any]
    artifacts_dir: str
    # The environment build (environment/build.py): its digest, and what this attempt spent on
    # it (building, waiting for another's build, or a cache hit); None without a build.
    build_digest: str | None = None
    build_s: float | None = None
    # Set only when cost_usd is None: what the budget counts instead, and how it was reached
    # (queue/restarts.py estimate_cost, trials/agents/prices.py upper_estimate; docs/data.md).
    cost_estimate_usd: float | None = None
    cost_basis: str | None = None
    # Set on a trial reused from an earlier experiment (experiment/reuse.py): the measurement it
    # is, {experiment_id, trial_key, attempt, run_id, finished_at}. The row keeps that
    # measurement's own times and cost; it was not run, and is not paid, again.
    reused_from: dict[str, Any] | None = None
    # experiment, or shadow: a candidate run on a merge (shadow/), graded against what was
    # merged, delivering nothing. None in rows stored before it was recorded (experiment).
    source: Literal["experiment", "shadow"] | None = None
    shadow_of: str | None = None  # a shadow trial's merge SHA


class GradeRecord(Record):
    experiment_id: str
    trial_key: str
    variant: str
    task: str
    replicate: int
    attempt: int
    run_id: str
    graded_at: dt.datetime
    passed: bool
    hidden_tests: dict[str, int]  # total, passed, failed, errors, skipped (from JUnit)
    exit_code: int | None
    reason: str | None  # why a grade failed when it isn't simply failing tests
    trust: Trust
    files_mode: Literal["hidden", "in_repo"]
    network: Literal["none", "mirror"]
    runner: Literal["hangar-grade", "command"]
    tamper_signals: list[str]
    touched_tests: list[str]
    contamination: list[str]
    task_invalid: bool
    grader_digest: str
    duration_s: float
    canary_files: int = 0  # hidden files that carried the canary line in this grader run
    # Where the hidden tests' modules were loaded from: {module: {from, path}} (docs/grading.md).
    provenance: dict[str, dict[str, str]] = Field(default_factory=dict)
    # A regrade's grade (experiment/regrade.py): the grade it replaces, {experiment_id,
    # trial_key, attempt, grader_digest}; that grade stays in its experiment, readable.
    regrade_of: dict[str, Any] | None = None
    # Not a column: the grade's per-test rows, which Store.put writes to grade_tests with it.
    _tests: list[GradeTestRecord] = PrivateAttr(default_factory=list)

    @property
    def tests(self) -> list[GradeTestRecord]:
        return self._tests

    def with_tests(self, tests: list[GradeTestRecord]) -> GradeRecord:
        self._tests = list(tests)
        return self

    def __eq__(self, other: object) -> bool:
        # A grade is its columns: one read back from the store (no per-test rows attached)
        # equals the one that was stored.
        if not isinstance(other, GradeRecord):
            return NotImplemented
        return self.model_dump() == other.model_dump()

    __hash__ = None  # type: ignore[assignment]  # mutable, as pydantic models are


TestOutcome = Literal["passed", "failed", "error", "skipped", "xfailed", "xpassed"]


class GradeTestRecord(Record):
    """One hidden test of one grade (table grade_tests; written with its grade)."""

    experiment_id: str
    trial_key: str
    variant: str
    task: str
    replicate: int
    attempt: int
    test_id: str  # as the JUnit report names it: module.Class::test
    outcome: TestOutcome
    duration_s: float  # the report's time for the test
    message: str | None  # the first line of its failure / skip message, short, redacted
    # fail_to_pass: failed or errored on the base check, so the fix must turn it; pass_to_pass:
    # passed there. None when the base check did not run it to a pass or a fail.
    on_base: Literal["fail_to_pass", "pass_to_pass"] | None


class NoteRecord(Record):
    experiment_id: str
    at: dt.datetime = Field(default_factory=utcnow)
    kind: str  # e.g. deprecation, infra, contamination, budget
    message: str
