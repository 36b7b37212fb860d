"""The base-check and grades stages, without Dagster.

``run_base_checks`` checks each task once per experiment (hidden tests must
fail on the base and pass on the reference patch); a stored check is reused.
It is also where environment builds run, before any trial starts: the
experiment's (the check's own) and each variant's that differs, once per
(environment, task base); a trial only builds when that cache is missing.
``run_grades`` grades the latest attempt of each trial key that has no grade
yet, reading the trial's raw patch; a graded attempt keeps its grade. Both
run concurrently up to the spec's ``parallel`` and store each result as it
finishes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hangar_dagster.environment.build import BuildFailed, ensure_build
from hangar_dagster.experiment.plan import ResolvedExperiment, TrialKey
from hangar_dagster.grading.grader import (
    GraderRun,
    base_check_log,
    build_settings,
    check_base,
    check_environment,
    contamination_notes,
    grade_trial,
    grader_run,
    task_build,
)
from hangar_dagster.queue.drain import interrupted
from hangar_dagster.queue.partitions import NO_TRIAL, plan_partitions
from hangar_dagster.queue.slots import experiment_slots
from hangar_dagster.results.records import BaseCheckRecord, GradeRecord, Record, TrialRecord
from hangar_dagster.results.store import Store
from hangar_dagster.settings import HangarPaths, Settings
from hangar_dagster.trials.trial import RAW_PATCH
from hangar_dagster.util.background import concurrently
from hangar_dagster.util.log import Log


@dataclass(frozen=True)
class BaseCheckPartition:
    task: str
    check: BaseCheckRecord
    reused: bool  # checked by an earlier run of this experiment
    log: Path  # the grader's output on the base and on the reference patch


def run_base_checks(
    exp: ResolvedExperiment,
    store: Store,
    paths: HangarPaths,
    run_id: str,
    tasks: Iterable[str],
    log: Log,
    settings: Settings | None = None,
) -> dict[str, BaseCheckPartition]:
    """The base check of every task in ``tasks``, running those not checked yet."""
    wanted = list(tasks)
    done = store.base_checks(exp.experiment_id)
    todo = [t for t in wanted if t not in done]
    fresh: dict[str, BaseCheckRecord] = {}

    def one(task: str) -> BaseCheckRecord:
        check = check_base(exp, task, run_id, paths, settings)
        if not check.invalid:
            _prebuild_variants(exp, task, paths, settings, log)
        return check

    for task, check in concurrently(todo, one, exp.spec.parallel):
        store.put(check)
        fresh[task] = check
    out: dict[str, BaseCheckPartition] = {}
    for task in wanted:
        check = fresh.get(task) or done[task]
        if check.invalid:
            log.warning(f"task {task} is invalid: {check.reason}")
        log_path = base_check_log(paths, exp.experiment_id, task)
        out[task] = BaseCheckPartition(task, check, reused=task not in fresh, log=log_path)
    return out


def _prebuild_variants(
    exp: ResolvedExperiment, task: str, paths: HangarPaths, settings: Settings | None, log: Log
) -> None:
    """Build each variant environment of ``task`` other than the experiment's, so its trials
    find the cache; a failure here is left to the trials (infra_error / build, retried)."""
    own = task_build(exp, task, check_environment(exp, task))
    plans = {
        p.key: p
        for v in exp.variants.values()
        if task in v.tasks and (p := task_build(exp, task, v.environment)) is not None
    }
    for key, plan in sorted(plans.items()):
        if own is not None and key == own.key:
            continue
        try:
            ensure_build(plan, build_settings(paths, settings))
        except BuildFailed as err:
            log.warning(f"task {task}: a variant's environment build failed: {err}")


@dataclass(frozen=True)
class GradePartition:
    """What the run did for one key: a grade (new or kept), or why there is none."""

    key: TrialKey
    grade: GradeRecord | None = None
    reused: bool = False  # the attempt was graded by an earlier run (not by this one's trials step)
    skipped: str | None = None


def grade_and_store(
    exp: ResolvedExperiment,
    store: Store,
    trial: TrialRecord,
    checks: dict[str, BaseCheckRecord],
    run_id: str,
    paths: HangarPaths,
    settings: Settings | None,
    run: GraderRun | None = None,
) -> GradeRecord:
    """Grade one stored attempt from its raw patch and store the grade (and its notes);
    ``run``: the grader's run of the same patch, when it was already made."""
    return grade_all_and_store(exp, store, [trial], checks, run_id, paths, settings, run)[0]


def grade_all_and_store(
    exp: ResolvedExperiment,
    store: Store,
    trials: list[TrialRecord],
    checks: dict[str, BaseCheckRecord],
    run_id: str,
    paths: HangarPaths,
    settings: Settings | None,
    run: GraderRun | None = None,
) -> list[GradeRecord]:
    """``grade_and_store`` of each of ``trials`` (one patch's group, given ``run``), their
    grades and notes stored in one batch (``Store.put_many``: one DuckDB connection)."""
    grades: list[GradeRecord] = []
    records: list[Record] = []
    for trial in trials:
        patch = (Path(trial.artifacts_dir) / RAW_PATCH).read_text()
        grade = grade_trial(exp, trial, patch, checks.get(trial.task), run_id, paths, settings, run)
        grades.append(grade)
        # the grade first, then its notes (the experiment note and the audit entry)
        records += [grade, *contamination_notes(grade)]
    store.put_many(records)
    return grades


def patch_groups(exp: ResolvedExperiment, trials: list[TrialRecord]) -> list[list[TrialRecord]]:
    """``trials`` grouped by what the grader is given: the task, its environment build and the
    byte-identical raw patch (the grader's digest is the experiment's), so one grader run
    stands for a whole group. An infra error is a group of its own (it is not run at all)."""
    groups: dict[tuple[str, str | None, str], list[TrialRecord]] = {}
    alone: list[list[TrialRecord]] = []
    for t in trials:
        if t.outcome_class == "infra_error":
            alone.append([t])
            continue
        variant = exp.variants.get(t.variant)
        plan = task_build(exp, t.task, variant.environment if variant else None)
        raw = (Path(t.artifacts_dir) / RAW_PATCH).read_bytes()
        key = (t.task, plan.key if plan is not None else None, hashlib.sha256(raw).hexdigest())
        groups.setdefault(key, []).append(t)
    return [*groups.values(), *alone]


def grade_group(
    exp: ResolvedExperiment,
    store: Store,
    group: list[TrialRecord],
    checks: dict[str, BaseCheckRecord],
    run_id: str,
    paths: HangarPaths,
    settings: Settings | None,
) -> list[GradeRecord]:
    """Grade one group of ``patch_groups`` with one grader run and store each member's grade
    at once (a crash after it loses none of them); each grade still adds its own attempt's
    tamper signals, touched tests and canary search (``grade_trial``)."""
    first = group[0]
    run: GraderRun | None = None
    if first.outcome_class != "infra_error":
        patch = (Path(first.artifacts_dir) / RAW_PATCH).read_text()
        run = grader_run(exp, first, patch, checks.get(first.task), paths, settings)
    return grade_all_and_store(exp, store, group, checks, run_id, paths, settings, run)


def run_grades(
    exp: ResolvedExperiment,
    store: Store,
    paths: HangarPaths,
    run_id: str,
    keys: Iterable[TrialKey],
    settings: Settings | None = None,
) -> dict[TrialKey, GradePartition]:
    """Grade the latest attempt of each key in ``keys`` that has no grade yet."""
    keys = list(keys)
    # Only the run's own keys are read: a relaunch of a few keys costs those keys.
    names = [k.key for k in keys]
    latest = {t.trial_key: t for t in store.trials(exp.experiment_id, keys=names)}
    graded = {
        (g.trial_key, g.attempt): g
        for g in store.grades(exp.experiment_id, all_attempts=True, keys=names)
    }
    finished = {
        k: graded[(t.trial_key, t.attempt)]
        for k, t in latest.items()
        if (t.trial_key, t.attempt) in graded
    }
    due = set(latest) - set(finished)
    plan = plan_partitions(exp, keys, due, finished, NO_TRIAL)
    out: dict[TrialKey, GradePartition] = {
        k: GradePartition(k, skipped=why) for k, why in plan.skipped.items()
    }
    # A grade this run made in the trials step (graded as its trial finished) is not reused.
    out |= {k: GradePartition(k, grade=g, reused=g.run_id != run_id) for k, g in plan.kept.items()}
    checks = store.base_checks(exp.experiment_id)

    if why := interrupted():  # the process is stopping: the next run grades them (pending)
        out |= {k: GradePartition(k, skipped=why) for k in plan.run}
        return out
    trials = [latest[k.key] for k in plan.run]
    # A regrade has every stored patch at once: each distinct one is run once (patch_groups);
    # otherwise every attempt is a group of its own.
    groups = patch_groups(exp, trials) if exp.regrade_of else [[t] for t in trials]

    # A grader run holds a slot of the experiment's ``parallel`` as a trial does: beside an
    # overlapping slice's run (queue/slots.py) the two runs' graders and trials share them.
    slots = experiment_slots(paths.experiment_dir(exp.experiment_id), exp.spec.parallel)

    def one(group: list[TrialRecord]) -> list[GradeRecord] | str:
        with slots.hold(interrupted) as stopped:
            # stopping: no grader run starts, the next run grades them
            if why := stopped or interrupted():
                return why
            return grade_group(exp, store, group, checks, run_id, paths, settings)

    for group, made in concurrently(groups, one, exp.spec.parallel):
        for i, trial in enumerate(group):
            key = TrialKey.parse(trial.trial_key)
            if isinstance(made, str):
                out[key] = GradePartition(key, skipped=made)
            else:
                out[key] = GradePartition(key, grade=made[i])
    return out
