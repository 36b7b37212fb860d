"""The eval queue's decisions: what an experiment still has to run, and whether it may start now.

One place answers both for the driver sensor, ``hangar experiment run --wait``
and the trials asset, so the three never disagree:

- ``pending`` lists the trial keys with no attempt yet and the infra-error
  keys the retry rules allow again (``retries.plan_retries``), leaving out
  every trial of a task its base check found invalid (``invalid_tasks``),
  and the finished attempts still waiting for a grade (``ungraded``);
- ``blocker`` says why no trial may start now: the eval window is closed
  (``eval_window``), a monthly budget or the experiment's own ``budget.max_cost_usd`` is
  spent (``budget``) or the outage breaker tripped (``outage``);
- ``window_fit`` says why one trial may not start although the window is open: it could not
  finish before the window closes (its ``timeout_s``, or the 90th percentile of its pin set's
  measured durations on its task: ``trial_needs``); ``fit_blocker`` says it for a whole
  experiment when none of its pending trials fits;
- ``schedule_grace`` says when the driver sensor leaves an experiment to the
  window's opening schedule (``<experiment_id>__eval_window_open``) for
  ``OPEN_GRACE`` after the window opens; ``waiting_reason`` is what a person
  is shown (``blocker``, else that grace);
- ``record_queue_notes`` stores the retry and breaker notes once each, as
  ``queue`` notes, when a trials run plans or stops;
- ``TokenThrottle`` holds trial starts while the provider tokens-per-minute
  budget (``HANGAR_EVAL_TPM_BUDGET``) is used up.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hangar_dagster.experiment.plan import ResolvedExperiment, TrialKey
from hangar_dagster.queue import budget
from hangar_dagster.queue.retries import (
    Retry,
    breaker_note,
    cap_room,
    plan_from_latest,
    plan_retries,
)
from hangar_dagster.queue.window import EvalWindow
from hangar_dagster.results.records import NoteRecord
from hangar_dagster.results.store import Store
from hangar_dagster.results.tally import Attempt, StartState
from hangar_dagster.settings import TPM_BUDGET_VAR, Settings

QUEUE_TAG = "hangar/queue"
EVAL_QUEUE = "eval"
# Eval runs queue behind interactive ones (higher priority runs dequeue first).
EVAL_PRIORITY = "-1"
# How long after the window opens the opening schedule alone may start an experiment that was
# waiting for it; then the driver sensor catches up (the daemon was down at the opening).
OPEN_GRACE = dt.timedelta(seconds=120)


@dataclass
class Pending:
    new: list[TrialKey] = field(default_factory=list)
    retries: dict[str, Retry] = field(default_factory=dict)  # trial key -> its next attempt
    notes: list[str] = field(default_factory=list)
    # Keys whose counting attempt finished but has no grade (a crash between the two):
    # grading starts no trial, so no blocker holds it back.
    grades: list[TrialKey] = field(default_factory=list)

    @property
    def keys(self) -> list[TrialKey]:
        """The trials to start (new keys and retries); not the grades."""
        return sorted(self.new + [TrialKey.parse(k) for k in self.retries])

    def __bool__(self) -> bool:
        return bool(self.new or self.retries or self.grades)

    def without(self, skip: Callable[[TrialKey], bool]) -> Pending:
        """This work less the keys ``skip`` names (those of a slice's run already going)."""
        return Pending(
            new=[k for k in self.new if not skip(k)],
            retries={k: r for k, r in self.retries.items() if not skip(TrialKey.parse(k))},
            notes=self.notes,
            grades=[k for k in self.grades if not skip(k)],
        )


def waiting_grades_note(n: int) -> str:
    """What the index, ``get`` and ``run --wait`` say while grades are missing."""
    return f"{n} trial{' waits' if n == 1 else 's wait'} for a grade; the pass rate is not final"


def ungraded(exp: ResolvedExperiment, store: Store) -> list[TrialKey]:
    """Planned keys whose highest attempt can be graded (it is not an infra error) and has none.

    The grades stage (``grading.stage.run_grades``) grades exactly the highest attempt of
    each key that has no grade; an infra error gets only a "not graded" placeholder there,
    and is retried or ends the key, so it never waits for a grade.
    """
    planned = {k.key: k for k in exp.trial_keys()}
    graded = store.graded_attempts(exp.experiment_id)
    latest: dict[str, Attempt] = {}
    for t in store.attempts(exp.experiment_id):  # by key, then attempt: the highest wins
        latest[t.trial_key] = t
    return sorted(
        planned[t.trial_key]
        for t in latest.values()
        if t.trial_key in planned
        and t.outcome_class != "infra_error"
        and (t.trial_key, t.attempt) not in graded
    )


def base_checks_stored(exp: ResolvedExperiment, store: Store) -> bool:
    """Whether every task's base check is stored: then a failed base_checks run is done all the same.

    Its blocking checks (orchestration/checks.py) fail the run when a task is
    invalid; that task's trials are left out by the queue (``pending``) and the
    experiment goes on with the others.
    """
    return set(exp.tasks) <= set(store.base_checks(exp.experiment_id))


def invalid_tasks(exp: ResolvedExperiment, store: Store) -> dict[str, str]:
    """Task -> why its base check found it invalid (the base_must_fail / reference_must_pass checks)."""
    return {
        t: c.reason or "invalid"
        for t, c in store.base_checks(exp.experiment_id).items()
        if c.invalid
    }


def planned_trials(exp: ResolvedExperiment) -> int:
    """How many trial keys ``exp`` plans (``len(exp.trial_keys())`` without building them)."""
    return sum(len(v.tasks) for v in exp.variants.values()) * exp.spec.trials


def pending(
    exp: ResolvedExperiment, store: Store, settings: Settings, grades: bool = True
) -> Pending:
    """The experiment's pending work; ``grades=False`` leaves ``Pending.grades`` empty (a trials
    step's plan and the queue notes need only the starts: reading every graded attempt of the
    experiment would make a relaunch cost the experiment's size)."""
    if exp.regrade_of is not None:  # it grades stored patches: it never starts a trial
        return Pending(grades=ungraded(exp, store) if grades else [])
    attempts = store.attempts(exp.experiment_id)
    tried = {t.trial_key for t in attempts}
    plan = plan_retries(attempts, planned_trials(exp), settings.infra_retries)
    # A trial of an invalid task can't be scored: it never starts (nor is retried), so isn't paid for.
    invalid = invalid_tasks(exp, store)
    new = [k for k in exp.trial_keys() if k.key not in tried]
    retries = {r.trial_key: r for r in plan.retries}
    left_out = {k.task for k in new if k.task in invalid} | {
        t for k in retries if (t := TrialKey.parse(k).task) in invalid
    }
    notes = list(plan.notes)
    if left_out:
        notes.append(
            "trials of invalid tasks are not started: "
            + "; ".join(f"{t} ({invalid[t]})" for t in sorted(left_out))
        )
    return Pending(
        new=[k for k in new if k.task not in invalid],
        retries={k: r for k, r in retries.items() if TrialKey.parse(k).task not in invalid},
        notes=notes,
        grades=ungraded(exp, store) if grades else [],
    )


def record_queue_notes(
    exp: ResolvedExperiment, store: Store, settings: Settings
) -> list[NoteRecord]:
    """Store the retry rules' notes and the breaker's as ``queue`` notes; returns the new ones.

    Each distinct message is stored once per experiment, however often the
    trials runs plan: a note says what happened, not that it is still true.
    """
    attempts = store.attempts(exp.experiment_id)
    said = [*pending(exp, store, settings, grades=False).notes]
    if outage := breaker_note(attempts, settings.breaker_streak):
        said.append(outage)
    known = {n.message for n in store.notes(exp.experiment_id) if n.kind == "queue"}
    new = [
        NoteRecord(experiment_id=exp.experiment_id, kind="queue", message=m)
        for m in dict.fromkeys(said)
        if m not in known
    ]
    for note in new:
        store.put(note)
    return new


def blocker(
    exp: ResolvedExperiment, store: Store, settings: Settings, now: dt.datetime
) -> str | None:
    """Why no trial of ``exp`` may start at ``now`` under ``settings``, or None.

    The start check: called before every trial start, so it reads only the tally's
    aggregates and index lookups (results/tally.py), never full trial rows; its cost does not
    grow with the attempts stored (benchmarks/start_check.py).
    """
    window = settings.window
    if not window.is_open(now):
        opens = window.next_open(now).astimezone(window.tz)
        return f"eval_window: trials start inside {window.describe()}; next opens {opens:%Y-%m-%d %H:%M %Z}"
    spent = budget.start_blocker(store, exp.author, now, settings.caps)
    if spent:
        return spent
    if exp.spec.budget is not None:  # the experiment's own cap: running trials finish
        cap = exp.spec.budget.max_cost_usd
        used = store.experiment_spent(exp.experiment_id)
        if used >= cap:
            return (
                f"budget: the experiment spent {used:.2f} of its budget.max_cost_usd "
                f"{cap:.2f}; no new trial starts (raise budget.max_cost_usd in a new experiment "
                "to run the rest)"
            )
    per_key = settings.infra_retries
    state = store.start_state(exp.experiment_id, per_key)
    outage = breaker_note(state.streak, settings.breaker_streak)
    if outage:
        return f"outage: {outage}"
    capped = cap_reached(store, exp.experiment_id, state, planned_trials(exp), per_key)
    if capped:
        return f"retry_cap: {capped}"
    return None


def cap_reached(
    store: Store, experiment_id: str, state: StartState, planned: int, per_key: int
) -> str | None:
    """``plan_retries(...).cap_reached`` from the tally: the open keys are read (to name them)
    only when they outnumber the counted retries the cap still allows."""
    if state.open_counted <= cap_room(state.counted_retries, planned):
        return None
    return plan_from_latest(
        store.open_infra(experiment_id, per_key), state.counted_retries, planned, per_key
    ).cap_reached


# A pin set's measured durations on a task stand in for its timeout_s from this many on: fewer
# make a 90th percentile that says little (docs/queue.md, "Starts that can finish").
FIT_MIN_MEASURED = 3


@dataclass(frozen=True)
class Need:
    """How long a trial must be expected to take, and from what (for the waiting reason)."""

    seconds: float
    basis: str


def trial_needs(
    exp: ResolvedExperiment, keys: list[TrialKey], store: Store
) -> dict[TrialKey, Need]:
    """Per key: the 90th percentile of its variant's pin set's measured durations on its task
    once FIT_MIN_MEASURED are stored (never above the timeout, which ends it), else the
    variant's ``timeout_s``."""
    measured = store.duration_p90s(sorted({exp.variants[k.variant].pin_set for k in keys}))
    out = {}
    for k in keys:
        variant = exp.variants[k.variant]
        timeout = float(variant.environment.resources.timeout_s)
        p90, n = measured.get((variant.pin_set, k.task), (timeout, 0))
        if n >= FIT_MIN_MEASURED and p90 < timeout:
            out[k] = Need(p90, f"the 90th percentile of {n} measured trials of its pin set")
        else:
            out[k] = Need(timeout, "its timeout_s")
    return out


def window_fit(need: Need, window: EvalWindow, now: dt.datetime) -> str | None:
    """Why a trial needing ``need`` may not start at ``now`` (it would outlast the window and
    be drained, paid for twice), or None: it fits, or the window is always open."""
    closes = window.closes_at(now)
    if closes is None:
        return None  # always open; a closed window is ``blocker``'s
    left = (closes - now).total_seconds()
    if need.seconds <= left:
        return None
    return (
        f"window_fit: needs {need.seconds:.0f} s ({need.basis}) and the eval window closes at "
        f"{closes.astimezone(window.tz):%H:%M %Z}, {left:.0f} s from now"
    )


def fit_blocker(
    exp: ResolvedExperiment,
    keys: list[TrialKey],
    store: Store,
    settings: Settings,
    now: dt.datetime,
) -> str | None:
    """Why none of the pending ``keys`` may start before the window closes, or None (one fits,
    there are none, or the window never closes)."""
    closes = settings.window.closes_at(now)
    if not keys or closes is None:
        return None
    longest = max(v.environment.resources.timeout_s for v in exp.variants.values())
    if (closes - now).total_seconds() >= longest:
        return None  # every trial fits in its timeout: no need to read the measured durations
    needs = trial_needs(exp, keys, store)
    key = min(keys, key=lambda k: needs[k].seconds)
    why = window_fit(needs[key], settings.window, now)
    if why is None:
        return None
    return (
        f"{why}: the shortest of the {len(keys)} pending trials ({key.key}) does not fit; "
        "they start when the window next opens"
    )


def open_schedule_name(experiment_id: str) -> str:
    return f"{experiment_id}__eval_window_open"


def schedule_grace(exp: ResolvedExperiment, window: EvalWindow, now: dt.datetime) -> str | None:
    """Why the driver sensor leaves ``exp``'s trials to the opening schedule at ``now``, or None.

    Only an experiment submitted before the window opened waits for the schedule,
    and only during ``OPEN_GRACE`` after the opening.
    """
    opened = window.opens_at(now)
    if opened is None or exp.submitted_at >= opened or now >= opened + OPEN_GRACE:
        return None
    takeover = (opened + OPEN_GRACE).astimezone(window.tz)
    return (
        f"eval_window_open: the window opened at {opened.astimezone(window.tz):%H:%M %Z}; "
        f"schedule {open_schedule_name(exp.experiment_id)} starts these trials "
        f"(the driver sensor starts them at {takeover:%H:%M:%S %Z} if it has not)"
    )


def waiting_reason(
    exp: ResolvedExperiment,
    store: Store,
    settings: Settings,
    now: dt.datetime,
    keys: list[TrialKey],
) -> str | None:
    """Why ``exp``'s pending ``keys`` are not started at ``now``: ``blocker``, else none of them
    fits before the window closes, else the opening grace."""
    return (
        blocker(exp, store, settings, now)
        or fit_blocker(exp, keys, store, settings, now)
        or schedule_grace(exp, settings.window, now)
    )


def parse_tpm_budget(raw: str) -> int | None:
    """``HANGAR_EVAL_TPM_BUDGET`` as written (``Settings.tpm_budget``); empty: no limit."""
    raw = raw.strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"{TPM_BUDGET_VAR}={raw!r}: write a whole number of tokens per minute"
        ) from None
    if value <= 0:
        raise ValueError(f"{TPM_BUDGET_VAR}={raw!r}: must be positive (unset it for no limit)")
    return value


class TokenThrottle:
    """Holds trial starts while the tokens used in the last minute reach the budget.

    ``recent_tokens`` (``Store.tokens_since``) counts the trials finished in that minute and
    the model answers of trials still running (the model proxy reports each answer's tokens
    as it passes: their live usage); trials already running are never stopped.
    """

    def __init__(
        self,
        recent_tokens: Callable[[dt.datetime], int],
        budget_tpm: int | None,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        sleep: Callable[[float], None] = time.sleep,
    ):
        self._recent = recent_tokens
        self._budget = budget_tpm
        self._clock = clock
        self._sleep = sleep

    def wait(self, cancelled: Callable[[], bool] = lambda: False) -> float:
        """Block until a start is allowed (or cancelled); returns the seconds waited."""
        waited = 0.0
        while self._budget is not None and not cancelled():
            if self._recent(self._clock() - dt.timedelta(minutes=1)) < self._budget:
                break
            self._sleep(1.0)
            waited += 1.0
        return waited
