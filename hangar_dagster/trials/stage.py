"""The trials stage: one run over the trial keys it is given, without Dagster.

Before anything starts it closes the attempts a dead run left behind
(``queue.restarts``), plans the keys (``queue.partitions``: run the pending
ones, keep the finished ones, skip the rest) and stores the queue's notes.
Keys to run start concurrently, at most the spec's ``parallel``, each once the
tokens-per-minute throttle allows it and only while nothing blocks a start
(window, budget, breaker), the trial can finish before the window closes
(``queue.starts.window_fit``) and no drain was asked for; each finished attempt is
stored the moment it ends and graded at once in the same slot (the grades step
of the run then reports those grades and grades any a failure left). Keys start
longest expected work first (a trial and its grade, from earlier runs of the
same pin set and task). The result says per key what happened; the trials
asset turns it into partition metadata.
"""

from __future__ import annotations

import datetime as dt
import itertools
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hangar_dagster.experiment.overlay import record_pins as record_overlay_pins
from hangar_dagster.experiment.plan import ResolvedExperiment, TrialKey
from hangar_dagster.grading.grader import work_removed_behind
from hangar_dagster.grading.stage import grade_and_store
from hangar_dagster.queue.drain import DrainWatcher, drain_marker, interrupted
from hangar_dagster.queue.partitions import NOT_PENDING, longest_first, plan_partitions
from hangar_dagster.queue.restarts import StartedMarker, close_interrupted
from hangar_dagster.queue.slots import experiment_slots, next_run_due
from hangar_dagster.queue.starts import (
    TokenThrottle,
    blocker,
    pending,
    record_queue_notes,
    trial_needs,
    window_fit,
)
from hangar_dagster.results.records import TrialRecord
from hangar_dagster.results.store import DuplicateRecordError, Store
from hangar_dagster.settings import Settings
from hangar_dagster.trials.trial import TrialRequest, run_trial
from hangar_dagster.util.background import concurrently
from hangar_dagster.util.log import Log


@dataclass(frozen=True)
class TrialPartition:
    """What the run did for one key: exactly one of ``record``, ``not_started``, ``skipped``."""

    key: TrialKey
    record: TrialRecord | None = None  # the attempt stored by this run, or the one kept
    reused: bool = False  # ``record`` is a finished attempt of an earlier run
    not_started: str | None = None  # due, but not started (a later run picks it up)
    skipped: str | None = None  # not this stage's work (queue.partitions)


def _started(record: TrialRecord) -> str:
    infra = f" / {record.infra_reason}" if record.infra_reason else ""
    return (
        f"trial {record.trial_key} attempt {record.attempt}: {record.outcome_class}{infra} "
        f"({record.duration_s:.1f}s)"
    )


def _remove_leftover_containers(exp: ResolvedExperiment, log: Log, settings: Settings) -> None:
    """On Docker and Kubernetes: remove the containers (pods) a crashed run left (their owner
    process is gone)."""
    backends = {v.environment.sandbox for v in exp.variants.values()}
    backends |= {exp.spec.environment.sandbox}
    from hangar_dagster.trials.sandbox import SandboxUnavailable

    for backend in sorted(backends & {"docker", "k8s"}):
        try:
            if backend == "docker":
                from hangar_dagster.trials.sandbox.docker import cleanup_leftovers

                removed = cleanup_leftovers()
            else:
                from hangar_dagster.trials.sandbox import k8s

                removed = k8s.cleanup_leftovers(settings.sandbox_runtime.k8s)
        except SandboxUnavailable as err:
            log.warning(f"could not look for leftover {backend} sandboxes: {err}")
            continue
        if removed:
            log.info(f"removed {removed} {backend} sandbox(es) a crashed run left behind")


def _names(keys: list[TrialKey]) -> list[str]:
    return [k.key for k in keys]


def run_trials(
    exp: ResolvedExperiment,
    store: Store,
    settings: Settings,
    run_id: str,
    keys: Iterable[TrialKey],
    *,
    in_flight: Callable[[StartedMarker], bool],
    log: Log,
) -> dict[TrialKey, TrialPartition]:
    """Run the due trials among ``keys`` as run ``run_id``; returns what happened per key.

    ``in_flight(marker)`` says whether the run that wrote a started marker may still record
    it (else the attempt is closed as ``control_plane_restart``).
    """
    paths, window = settings.paths, settings.window
    keys = list(keys)
    for cut in close_interrupted(exp, store, settings, run_id, in_flight):
        log.warning(f"trial {cut.trial_key} attempt {cut.attempt}: {cut.error}")
    _remove_leftover_containers(exp, log, settings)
    work = pending(exp, store, settings, grades=False)  # the starts: grades are the grades step's
    for note in record_queue_notes(exp, store, settings):
        log.warning(note.message)
    # Only the run's own keys are read: a relaunch of a few keys costs those keys.
    latest = {t.trial_key: t for t in store.trials(exp.experiment_id, keys=_names(keys))}
    # A finished attempt is kept (a resumed run loses and repeats nothing), and so is an infra
    # error the retry rules refuse (the notes say why).
    plan = plan_partitions(exp, keys, {k.key for k in work.keys}, latest, NOT_PENDING)
    by_work = store.work_durations(sorted({v.pin_set for v in exp.variants.values()}))
    expected = {
        k: s for k in plan.run if (s := by_work.get((exp.variants[k.variant].pin_set, k.task)))
    }
    checks = store.base_checks(exp.experiment_id)
    out: dict[TrialKey, TrialPartition] = {
        k: TrialPartition(k, skipped=why) for k, why in plan.skipped.items()
    }
    out |= {k: TrialPartition(k, record=t, reused=True) for k, t in plan.kept.items()}
    for said in record_overlay_pins(exp, store, run_id):  # a crash may have left one
        log.info(said)
    throttle = TokenThrottle(store.tokens_since, settings.tpm_budget)
    # What each trial must be given before the window closes (a window that never closes asks
    # for nothing): one that would outlast it waits for the next window rather than be drained.
    needs = trial_needs(exp, plan.run, store) if not window.always else {}

    def drain_reason(now: dt.datetime) -> str | None:
        if cut := interrupted():  # a signal to this process: its trials end, not drain
            return cut
        if drain_marker(paths, run_id).exists():
            return "power_down: drain requested"
        return (
            None
            if window.is_open(now)
            else f"power_down: the eval window {window.describe()} closed"
        )

    slots = experiment_slots(paths.experiment_dir(exp.experiment_id), exp.spec.parallel)
    turn = slots.turn()
    next_due = slots.next_due(run_id)
    marked = threading.Event()  # next_due written: no look at the file on each hand-out
    order = longest_first(plan.run, expected)
    handed = itertools.count(1)  # keys handed to a slot so far (its __next__ is atomic)
    with DrainWatcher(drain_reason) as watcher:

        def stop() -> str | None:
            return interrupted() or watcher.why

        def one(key: TrialKey) -> TrialRecord | str:
            # A slot of the experiment's ``parallel``, shared with an overlapping run of the
            # next or previous slice (queue/slots.py); within this run there is always one.
            with slots.hold(stop) as stopped:
                if stopped:  # a drain or an interrupt: no hand-out to count, no next run due
                    return stopped
                n = next(handed)
                if n == len(order):
                    # Every key of this run holds its slot (given up only now, else the next
                    # run's threads could take the slot this last key waits for).
                    turn.give_up()
                if not marked.is_set() and next_run_due(
                    n, len(order), exp.spec.parallel, time.monotonic() - began
                ):
                    marked.set()
                    next_due.touch()  # the daemon's driver may make the next slice's run now
                return one_in_slot(key)

        def one_in_slot(key: TrialKey) -> TrialRecord | str:
            throttle.wait(cancelled=watcher.cancel.is_set)
            # An interrupt stops starts at once, not at the watcher's next look.
            now = dt.datetime.now(dt.UTC)
            why = (
                interrupted()
                or watcher.why
                or blocker(exp, store, settings, now)
                or (window_fit(needs[key], window, now) if key in needs else None)
            )
            if why:
                return why  # not started; a later run picks it up
            retry = work.retries.get(key.key)
            request = TrialRequest(
                experiment=exp,
                key=key,
                attempt=retry.attempt if retry else store.next_attempt(exp.experiment_id, key.key),
                retry_of=retry.retry_of if retry else None,
                run_id=run_id,
                cancel=watcher.trial_cancel(),
            )
            record, _patch = run_trial(request, settings)
            try:
                store.put(record)  # stored the moment it finishes: a crash later loses nothing
            except DuplicateRecordError:
                return "another run stored this attempt first"  # two runs raced: one counts
            if interrupted() is None:  # else the next run grades it (it is pending)
                # Graded at once in the same slot: no barrier between trials and grades. A
                # grade that fails here is left to the grades step of this run, which grades
                # every finished attempt without one.
                try:
                    grade_and_store(exp, store, record, checks, run_id, paths, settings)
                except Exception as err:
                    log.warning(f"trial {key.key}: its grade is left to the grades step: {err}")
            return record

        # An overlapping run of the slice before starts its keys first (queue/slots.py, Turn).
        waited = turn.take(stop) if order else None
        began = time.monotonic()  # the pace of hand-outs counts from the turn (next_run_due)
        # The slots' puts leave their DuckDB rows to the store's committer thread: a slot goes
        # on to its grade and its next trial once the record is safe (Store.rows_behind), and
        # its grades' work dirs to a remover thread (grader.work_removed_behind).
        try:
            with store.rows_behind(), work_removed_behind():
                for key, result in concurrently(
                    order if waited is None else [], one, exp.spec.parallel
                ):
                    if isinstance(result, str):
                        log.info(f"trial {key.key} not started: {result}")
                        out[key] = TrialPartition(key, not_started=result)
                        continue
                    log.info(_started(result))
                    out[key] = TrialPartition(key, record=result)
                    for said in record_overlay_pins(exp, store, run_id):
                        log.info(said)
        finally:
            turn.give_up()
            next_due.unlink(missing_ok=True)
        if waited is not None:
            log.info(f"{len(order)} trial(s) not started: {waited}")
            out |= {k: TrialPartition(k, not_started=waited) for k in order}
    for note in record_queue_notes(exp, store, settings):  # what this run's failures led to
        log.warning(note.message)
    return out
