"""Infra retries, the outage breaker and outcome classes: pure rules over trial records.

Nothing here reads the store, starts a run or writes a note: the sensors pass
in an experiment's trial attempts and act on the answer. docs/queue.md
("Infra retries, the outage breaker and outcome classes") explains each rule
and why; the variant_summary view in ``store_schema`` counts the three outcome
classes with the same rule as ``evidence_class`` (tests/test_retries.py checks
they agree).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from hangar_dagster.results.records import GradeRecord, TrialRecord
from hangar_dagster.settings import BREAKER_VAR, RETRIES_VAR

DEFAULT_INFRA_RETRIES = 2
DEFAULT_BREAKER_STREAK = 5

# Every infra_reason hangar knows, with what it means (docs/queue.md lists the same).
INFRA_REASONS: dict[str, str] = {
    "sandbox_create": "the sandbox could not be created or started",
    "clone": "the task's repository could not be cloned at its base",
    "harness": "the harness lock could not be loaded, or its agent CLI could not run",
    "agent_cli": "the variant's agent CLI cannot be found or used here (a configuration error)",
    "egress_unsupported": "the sandbox cannot give the egress policy the environment asks for",
    "build": "an environment build step failed",
    "patch": "the patch could not be taken from the trial's repository",
    "internal": "an unexpected error in hangar itself",
    "drift": "the first turn did not run what was pinned (harness or environment digest)",
    "power_down": "the end-of-window drain cancelled it",
    "interrupted": "SIGINT or SIGTERM stopped `hangar experiment run --wait` (or `resume`)",
    "preempted": "its node was preempted",
    "provider_5xx": "the model provider answered 5xx",
    "rate_limit": "the provider rate-limited it past its harness's own retries",
    "provider_stream": "the provider's answer was cut off mid-stream or malformed",
    "auth": "the provider refused the orchestrator's API key (401/403)",
    "control_plane_restart": "a restart of the Dagster daemon or run worker cut it off",
}
# A drifted trial did not run what was pinned; running it again would not either. A refused
# key fails every attempt alike until the operator fixes it (the breaker still counts it).
# A CLI that is not installed (or not usable) stays so until the operator installs it.
NEVER_RETRIED = frozenset({"drift", "auth", "agent_cli"})
# A drain, a restart or an interrupt cuts off every trial in flight at once, whatever their
# health: their retries leave the experiment's 10% cap alone (else one restart with `parallel`
# trials in flight would use it up). The per-key limit still bounds them.
CAP_EXEMPT = frozenset({"power_down", "control_plane_restart", "interrupted"})
# Infra errors that say nothing about the provider's or cluster's health: a scheduled drain,
# a pin mismatch, one restart that cuts off every trial in flight at once. They neither
# extend nor reset the breaker's streak; every other infra_error (unknown ones included)
# extends it.
BREAKER_NEUTRAL = frozenset(
    {"drift", "agent_cli", "power_down", "control_plane_restart", "interrupted"}
)

# Said with the cap's note: the seed's rule that past the cap nothing more starts, and why.
CAP_SENTENCE = (
    "That many infra errors usually mean a provider or cluster outage: no further trial of "
    "this experiment starts"
)

EvidenceClass = Literal["execution_failure", "evidence_failure", "admissible"]


class AttemptLike(Protocol):
    """What these rules read of an attempt: a TrialRecord, or the tally's narrow
    ``results.tally.Attempt`` (the start check reads no full rows)."""

    @property
    def experiment_id(self) -> str: ...
    @property
    def trial_key(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def finished_at(self) -> dt.datetime: ...
    @property
    def outcome_class(self) -> str: ...
    @property
    def infra_reason(self) -> str | None: ...
    @property
    def run_id(self) -> str: ...


class RetryConfigError(ValueError):
    """A retry or breaker environment variable holds something that is not a valid count."""


def parse_count(variable: str, raw: str, default: int, minimum: int) -> int:
    """``raw`` (the value of ``variable``) as a count >= ``minimum``; empty: ``default``."""
    raw = raw.strip()
    if not raw:
        return default
    fix = f"set {variable} to a whole number >= {minimum}, or unset it for {default}"
    try:
        value = int(raw)
    except ValueError:
        raise RetryConfigError(f"{variable}={raw!r} is not a whole number: {fix}") from None
    if value < minimum:
        raise RetryConfigError(f"{variable}={raw!r} is below {minimum}: {fix}")
    return value


def experiment_retry_cap(planned_trials: int) -> int:
    """Counted retries an experiment may start: 10% of its trials rounded down, at least one.

    Rounded down because the cap is a ceiling: 2 retries of 11 trials would be
    18%. The floor of one lets a small experiment absorb one blip.
    """
    if planned_trials < 1:
        raise ValueError(
            f"planned_trials must be >= 1 (the experiment's trials), got {planned_trials}"
        )
    return max(1, planned_trials // 10)


@dataclass(frozen=True)
class Retry:
    trial_key: str
    attempt: int  # the new attempt's number
    retry_of: str  # run id of the excluded attempt it replaces
    counts_toward_cap: bool  # False for a retry of a power_down or control_plane_restart


@dataclass(frozen=True)
class RetryPlan:
    retries: list[Retry]
    notes: list[str]
    # Set once the experiment's counted retries are used up and an infra error is left
    # unretried: past that no further trial starts (first attempts included), this says why.
    cap_reached: str | None = None


def cap_room(counted: int, planned_trials: int) -> int:
    """Counted retries the experiment may still start: ``plan_from_latest`` stops (and the
    cap is reached) exactly when more keys wait for a counted retry than this."""
    return max(0, experiment_retry_cap(planned_trials) - counted)


def _by_key(attempts: Sequence[AttemptLike]) -> dict[str, dict[int, AttemptLike]]:
    """Attempts per trial key; refuses attempts of several experiments or a repeated attempt."""
    experiments = sorted({t.experiment_id for t in attempts})
    if len(experiments) > 1:
        raise ValueError(f"attempts of one experiment expected, got {', '.join(experiments)}")
    out: dict[str, dict[int, AttemptLike]] = {}
    for t in attempts:
        seen = out.setdefault(t.trial_key, {})
        if t.attempt in seen:
            raise ValueError(f"trial {t.trial_key} attempt {t.attempt} is given twice")
        seen[t.attempt] = t
    return out


def _reason(t: AttemptLike) -> str:
    return t.infra_reason or "no reason recorded"


def plan_retries(attempts: Sequence[AttemptLike], planned_trials: int, per_key: int) -> RetryPlan:
    """The retries to start now, given every attempt of one experiment so far.

    Only each key's highest attempt is looked at: an infra_error there is retried
    unless it drifted, the key has used its ``per_key`` retries (``HANGAR_TRIAL_INFRA_RETRIES``
    power-down retries included), or the experiment's counted retries reached
    ``experiment_retry_cap`` (power-down and restart retries are not counted). Earlier
    failures are retried first. Each note is a full sentence, the same on every
    call for the same attempts.
    """
    keys = _by_key(attempts)
    # Retries already started: every attempt after the first, but those replacing a drained
    # or restarted one.
    counted = sum(
        1
        for by_attempt in keys.values()
        for n in by_attempt
        if n > 1 and not (n - 1 in by_attempt and by_attempt[n - 1].infra_reason in CAP_EXEMPT)
    )
    latest = [by_attempt[max(by_attempt)] for by_attempt in keys.values()]
    return plan_from_latest(latest, counted, planned_trials, per_key)


def plan_from_latest(
    latest: Sequence[AttemptLike], counted: int, planned_trials: int, per_key: int
) -> RetryPlan:
    """``plan_retries`` from each key's highest attempt (only the infra errors matter) and the
    retries already started that count toward the cap: what the tally keeps (results/tally.py)."""
    cap = experiment_retry_cap(planned_trials)
    failed = sorted(latest, key=lambda t: (t.finished_at, t.trial_key))
    retries: list[Retry] = []
    notes: list[str] = []
    stopped: list[str] = []
    for t in failed:
        if t.outcome_class != "infra_error":
            continue
        if t.infra_reason in NEVER_RETRIED:
            notes.append(f"{t.infra_reason} is never retried: {t.trial_key}")
        elif t.attempt - 1 >= per_key:
            notes.append(
                f"no retry left for {t.trial_key}: attempt {t.attempt} ended as infra_error / "
                f"{_reason(t)} after {t.attempt - 1} of {per_key} retries ({RETRIES_VAR})"
            )
        elif t.infra_reason in CAP_EXEMPT:
            retries.append(Retry(t.trial_key, t.attempt + 1, t.run_id, counts_toward_cap=False))
        elif counted >= cap:
            stopped.append(t.trial_key)
        else:
            retries.append(Retry(t.trial_key, t.attempt + 1, t.run_id, counts_toward_cap=True))
            counted += 1
    cap_reached = None
    if stopped:
        cap_reached = (
            f"retries stopped: {counted} of {cap} allowed (10% of {planned_trials} trials, "
            f"at least 1); not retried: {', '.join(stopped)}. {CAP_SENTENCE}"
        )
        notes.append(cap_reached)
    return RetryPlan(retries, notes, cap_reached)


def _streak(attempts: Sequence[AttemptLike]) -> list[AttemptLike]:
    _by_key(attempts)  # the same checks as plan_retries
    ordered = sorted(attempts, key=lambda t: (t.finished_at, t.trial_key, t.attempt))
    streak: list[AttemptLike] = []
    for t in reversed(ordered):
        if t.outcome_class != "infra_error":
            break
        if t.infra_reason not in BREAKER_NEUTRAL:
            streak.append(t)
    return streak[::-1]


def outage_streak(attempts: Sequence[AttemptLike]) -> tuple[int, list[str]]:
    """How many systemic failures end the experiment's attempts, by ``finished_at``, and their keys.

    The keys are in time order, one per failed attempt (a key retried within the
    streak appears once per attempt). Any outcome other than infra_error (a
    measurement, whatever its grade) ends the streak; a neutral infra error
    (``BREAKER_NEUTRAL``) is stepped over.
    """
    streak = _streak(attempts)
    return len(streak), [t.trial_key for t in streak]


def breaker_note(attempts: Sequence[AttemptLike], limit: int) -> str | None:
    """A note naming the streak once ``limit`` systemic failures in a row end the attempts.

    ``limit`` is ``Settings.breaker_streak`` (``HANGAR_OUTAGE_BREAKER_STREAK``, 5). None while
    the breaker holds.
    """
    if limit < 1:
        raise ValueError(f"breaker limit must be >= 1, got {limit}")
    streak = _streak(attempts)
    if len(streak) < limit:
        return None
    reasons = Counter(_reason(t) for t in streak)
    named = ", ".join(f"{t.trial_key} (attempt {t.attempt}, {_reason(t)})" for t in streak)
    return (
        f"outage breaker tripped: {len(streak)} systemic infra failures in a row (limit {limit}, "
        f"{BREAKER_VAR}): {named}; by reason: "
        f"{', '.join(f'{r} x{n}' for r, n in sorted(reasons.items()))}. "
        "No further trial of this experiment starts."
    )


def _executed(grade: GradeRecord) -> int:
    """Hidden tests that ran to a verdict (passed, failed or errored), per the grade's JUnit."""
    return sum(grade.hidden_tests.get(k, 0) for k in ("passed", "failed", "errors"))


def evidence_class(
    trial: TrialRecord, grade: GradeRecord | None, *, base_check_invalid: bool = False
) -> EvidenceClass:
    """Which of the three outcome classes a trial attempt (with its grade, if any) falls in.

    execution_failure: infrastructure ended it (``infra_error``, any reason).
    evidence_failure: it ran, but nothing can be scored: no grade, a task found
    invalid (by the grade's ``task_invalid`` or by the task's stored base check,
    ``base_check_invalid``: a base check stored after the grade still counts), or a grade
    in which no hidden test ran to a verdict (not graded, no usable JUnit, none
    collected, all skipped, the patch did not apply, the grader timed out before its
    report).
    admissible: everything else, passing or failing.
    """
    if trial.outcome_class == "infra_error":
        return "execution_failure"
    if grade is None:
        return "evidence_failure"
    ours = (trial.experiment_id, trial.trial_key, trial.attempt)
    theirs = (grade.experiment_id, grade.trial_key, grade.attempt)
    if ours != theirs:
        raise ValueError(f"grade {theirs} is not the grade of trial {ours}")
    if grade.task_invalid or base_check_invalid or _executed(grade) == 0:
        return "evidence_failure"
    return "admissible"
