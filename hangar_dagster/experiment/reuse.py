"""Reuse of measured trials across experiments: the binding, the plan at submit, the copies.

A finished trial of an earlier experiment stands in for a trial of a new one (it is neither
run nor paid again) only when everything that decides its outcome is identical. That is the
**binding** of a (variant, task): the harness lock's digest, its adapter and the concrete
model, the environment's digest with only that task's build, the build actually used, the
egress policy, the task's base SHA, its instructions, its verify command, the trial budget,
its hidden tests and the grader that grades it. A digest missing on either side is a
mismatch: reuse fails closed. The earlier trial must also have run what its own experiment
pinned (its row's harness, environment, model and base agree with its resolved spec, and that
environment's digest still recomputes to what was pinned: a runner or interpreter changed
since means its build is not this one).

``plan_reuse`` decides at submit, so the budget projection counts only what will be paid;
the plan is stored in ``resolved.json``. ``materialize`` then writes each reused trial as a
row of the new experiment (attempt 1, its grade and per-test rows with it, its artifacts
linked into the new experiment's folder) with ``reused_from`` naming the measurement: the
first experiment that ran it, its trial key, attempt and run, and when it finished. Copying
never refreshes that clock: the row keeps the measurement's own times, so a trial copied
forward night after night still ages out. Each variant that reuses anything keeps one
planned trial fresh (paid) as its health check. docs/architecture.md, "Reusing trials".
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hangar_dagster.environment.build import plan_build
from hangar_dagster.experiment.pins import environment_digest
from hangar_dagster.experiment.plan import ResolvedExperiment, ReusePlan, ReuseSource, TrialKey
from hangar_dagster.experiment.spec import DEFAULT_REUSE_MAX_AGE_DAYS
from hangar_dagster.grading.grader import grader_digest, hidden_files_for
from hangar_dagster.results.records import NoteRecord, Record, TrialRecord
from hangar_dagster.results.store import DuplicateRecordError, Store
from hangar_dagster.settings import HangarPaths
from hangar_dagster.util.digests import sha256_json

# What decides a trial's outcome, in the order a mismatch is reported.
BINDING_FIELDS = (
    "harness_digest",
    "adapter",
    "model",
    "environment",
    "build",
    "egress",
    "base_sha",
    "instructions",
    "verify",
    "trial_budget",
    "hidden_tests",
    "grader",
)
# The part a regrade may change (experiment/regrade.py): what grades a trial, not what ran it.
GRADER_FIELDS = ("hidden_tests", "grader")
NO_BUILD = "none"  # the task has no environment build: a value, not a missing digest
# A measurement stamped later than this past submit is corrupt, not young.
CLOCK_SLACK = dt.timedelta(minutes=5)
# Not copied into the new experiment's folder: the marker a run leaves while it runs a trial.
_NOT_COPIED = ("started.json",)

Binding = dict[str, str | None]


class ReuseError(RuntimeError):
    """A planned reuse cannot be written (its source row or artifacts are gone)."""


def _digest(value: Any) -> str:
    return "sha256:" + sha256_json(value)


def binding(exp: ResolvedExperiment, variant: str, task: str) -> Binding:
    """What decides the outcome of a trial of ``task`` under ``variant`` in ``exp``."""
    v, t = exp.variants[variant], exp.tasks[task]
    plan = plan_build(v.environment, t.repo, t.base_sha, t.build)
    hidden = hidden_files_for(exp, task)
    budget = exp.spec.trial_job_budget
    return {
        "harness_digest": v.harness_digest or None,
        "adapter": v.adapter or None,
        "model": v.model or None,
        "environment": environment_digest(v.environment, {task: t.build}),
        "build": plan.digest if plan is not None else NO_BUILD,
        "egress": v.environment.egress.mode,
        "base_sha": t.base_sha or None,
        "instructions": _digest(t.instructions),
        "verify": _digest(t.verify),
        "trial_budget": _digest(budget.max_cost_usd if budget is not None else None),
        "hidden_tests": _digest(hidden) if hidden else None,
        "grader": grader_digest(exp.spec.grader, {task: t.hidden_files}),
    }


def source_binding(src: ResolvedExperiment, row: TrialRecord) -> Binding | str:
    """The binding ``row`` was measured under, from its own experiment; or why it has none."""
    v, t = src.variants.get(row.variant), src.tasks.get(row.task)
    if v is None or t is None:
        return f"{row.variant}/{row.task} is not in its experiment's resolved spec"
    if v.overlay:
        return "an overlay variant (deprecated): its pins are recorded by its first trial"
    ran = {
        "harness digest": (row.harness_digest, v.harness_digest),
        "environment digest": (row.environment_digest, v.environment_digest),
        "model": (row.model, v.model),
        "base": (row.base_sha, t.base_sha),
        "agent": (row.agent, v.adapter),
    }
    for what, (seen, pinned) in ran.items():
        if not seen or seen != pinned:
            return f"its {what} {seen or '(none)'!r} is not what its experiment pinned"
    full = environment_digest(v.environment, {x: src.tasks[x].build for x in v.tasks})
    if full != v.environment_digest:
        return "its environment digest no longer recomputes (the runner or interpreter changed)"
    b = binding(src, row.variant, row.task)
    # The build it ran with, as it recorded it: not the one this interpreter would make.
    b["build"] = row.build_digest or (NO_BUILD if b["build"] == NO_BUILD else None)
    return b


def mismatch(new: Binding, old: Binding, fields: Sequence[str] = BINDING_FIELDS) -> str | None:
    """The first field of ``fields`` that keeps ``old`` from standing in for ``new``, or None.

    A digest missing on either side is a mismatch (fail closed): absence proves nothing equal.
    """
    for f in fields:
        a, b = new.get(f), old.get(f)
        if not a:
            return f"{f}: this experiment has no digest for it"
        if not b:
            return f"{f}: the earlier trial has no digest for it"
        if a != b:
            return f"{f} differs"
    return None


def original_of(row: TrialRecord) -> dict[str, str | int]:
    """The measurement ``row`` is: its own ``reused_from`` when it is a copy, else itself."""
    if row.reused_from:
        return {k: v for k, v in row.reused_from.items() if isinstance(v, str | int)}
    return {
        "experiment_id": row.experiment_id,
        "trial_key": row.trial_key,
        "attempt": row.attempt,
        "run_id": row.run_id,
        "finished_at": row.finished_at.astimezone(dt.UTC).isoformat(),
    }


def _identity(original: dict[str, str | int]) -> tuple[str, str, int]:
    return (str(original["experiment_id"]), str(original["trial_key"]), int(original["attempt"]))


@dataclass
class _Candidate:
    row: TrialRecord
    original: dict[str, str | int]


def _loader(paths: HangarPaths) -> Callable[[str], ResolvedExperiment | None]:
    from hangar_dagster.experiment.submit import load_resolved

    cache: dict[str, ResolvedExperiment | None] = {}

    def load(experiment_id: str) -> ResolvedExperiment | None:
        if experiment_id not in cache:
            try:
                cache[experiment_id] = load_resolved(paths, experiment_id)
            except (OSError, ValueError):
                cache[experiment_id] = None  # no resolved spec: nothing to bind it to
        return cache[experiment_id]

    return load


def _raw_patch(row: TrialRecord) -> Path:
    from hangar_dagster.trials.trial import RAW_PATCH

    return Path(row.artifacts_dir) / RAW_PATCH


def _when(at: dt.datetime) -> str:
    return f"{at.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC"


def plan_reuse(exp: ResolvedExperiment, store: Store, paths: HangarPaths) -> ReusePlan:
    """Which planned trials of ``exp`` earlier measurements stand in for, and what stays fresh."""
    policy = exp.spec.reuse
    max_age = policy.max_age_days if policy is not None else DEFAULT_REUSE_MAX_AGE_DAYS
    if policy is not None and not policy.enabled:
        return ReusePlan(
            enabled=False,
            max_age_days=max_age,
            notes=("reuse is off for this experiment (reuse.enabled: false): every trial runs",),
        )
    keys = exp.trial_keys()
    wanted: dict[tuple[str, str], Binding] = {}
    for v in exp.variants.values():
        if v.overlay:
            continue
        for task in v.tasks:
            wanted[(v.name, task)] = binding(exp, v.name, task)
    since = exp.submitted_at - dt.timedelta(days=max_age)
    rows = store.counting_trials(
        harness_digests={b["harness_digest"] or "" for b in wanted.values()} - {""},
        base_shas={b["base_sha"] or "" for b in wanted.values()} - {""},
        finished_after=since,
        other_than=exp.experiment_id,
    )
    load = _loader(paths)
    candidates: dict[tuple[str, str], list[_Candidate]] = {k: [] for k in wanted}
    rejected: dict[tuple[str, str], Counter[str]] = {k: Counter() for k in wanted}
    for row in rows:
        src = load(row.experiment_id)
        sb = source_binding(src, row) if src is not None else "its resolved spec cannot be read"
        reason: str | None = None
        if row.finished_at > exp.submitted_at + CLOCK_SLACK:
            reason = f"its measurement time {_when(row.finished_at)} is in the future (corrupt)"
        elif not _raw_patch(row).is_file():
            reason = "its raw patch is gone (a reused trial must stay gradable)"
        elif isinstance(sb, str):
            reason = sb
        # Only a trial of the same harness on the same task is a candidate (or worth a reason).
        same = (
            k
            for k, b in wanted.items()
            if k[1] == row.task and b["harness_digest"] == row.harness_digest
        )
        for k in same:
            why = reason if reason is not None or isinstance(sb, str) else mismatch(wanted[k], sb)
            if why is None:
                candidates[k].append(_Candidate(row, original_of(row)))
            else:
                rejected[k][why] += 1
    sources = _assign(exp, keys, wanted, candidates)
    health: dict[str, str] = {}
    for v in exp.variants.values():
        planned = [k.key for k in keys if k.variant == v.name]
        if planned and all(k in sources for k in planned):
            health[v.name] = planned[0]  # the first planned key: the same one every night
            del sources[planned[0]]
    return ReusePlan(
        enabled=True,
        max_age_days=max_age,
        sources=sources,
        health=health,
        notes=tuple(_notes(exp, keys, sources, health, rejected, max_age)),
    )


def _assign(
    exp: ResolvedExperiment,
    keys: Sequence[TrialKey],
    wanted: dict[tuple[str, str], Binding],
    candidates: dict[tuple[str, str], list[_Candidate]],
) -> dict[str, ReuseSource]:
    """Give each planned key at most one measurement, never one measurement to two keys.

    Keys whose bindings are identical (two variants of one lock) share their candidates. A
    measurement of the same variant name and replicate goes to its own key first (the nights
    of one spec line up replicate by replicate), then the rest in order, newest first.
    """
    groups: dict[str, list[TrialKey]] = {}
    pools: dict[str, list[_Candidate]] = {}
    for k in keys:
        if (k.variant, k.task) not in wanted:
            continue
        b = wanted[(k.variant, k.task)]
        if any(not x for x in b.values()):
            continue
        gid = sha256_json(b)
        groups.setdefault(gid, []).append(k)
        pools.setdefault(gid, [])
        seen = {_identity(c.original) for c in pools[gid]}
        for c in candidates[(k.variant, k.task)]:
            if _identity(c.original) not in seen:
                pools[gid].append(c)
                seen.add(_identity(c.original))
    out: dict[str, ReuseSource] = {}
    for gid, slots in groups.items():
        pool = sorted(pools[gid], key=lambda c: c.row.finished_at, reverse=True)
        open_slots = list(slots)
        for slot in slots:
            match = next(
                (
                    c
                    for c in pool
                    if (c.row.variant, c.row.replicate) == (slot.variant, slot.replicate)
                ),
                None,
            )
            if match is not None:
                out[slot.key] = _source(match)
                pool.remove(match)
                open_slots.remove(slot)
        for slot, c in zip(open_slots, pool, strict=False):
            out[slot.key] = _source(c)
    return out


def _source(c: _Candidate) -> ReuseSource:
    return ReuseSource(
        experiment_id=c.row.experiment_id,
        trial_key=c.row.trial_key,
        attempt=c.row.attempt,
        original=c.original,
    )


def _notes(
    exp: ResolvedExperiment,
    keys: Sequence[TrialKey],
    sources: dict[str, ReuseSource],
    health: dict[str, str],
    rejected: dict[tuple[str, str], Counter[str]],
    max_age: float,
) -> Iterable[str]:
    for v in exp.variants.values():
        planned = [k for k in keys if k.variant == v.name]
        used = [sources[k.key] for k in planned if k.key in sources]
        if v.overlay:
            continue  # deprecated: its pins come from its first trial, so nothing binds it
        if not used:
            why = Counter[str]()
            for task in v.tasks:
                why.update(rejected.get((v.name, task), Counter()))
            if why:  # earlier trials of its harness on these tasks, none of them the same
                yield (
                    f"variant {v.name}: none of its {len(planned)} trials reused: the earlier "
                    f"trials of its harness on these tasks differ ({why.most_common(1)[0][0]})"
                )
            continue
        times = sorted(str(s.original.get("finished_at", "")) for s in used)
        froms = sorted({str(s.original["experiment_id"]) for s in used})
        fresh = [k for k in planned if k.key not in sources]
        said = (
            f"variant {v.name}: {len(used)} of {len(planned)} trials reused from "
            f"{', '.join(froms)} (measured {times[0][:16]} to {times[-1][:16]} UTC, at most "
            f"{max_age:g} days before submit); {len(fresh)} fresh"
        )
        if v.name in health:
            said += f", {health[v.name]} as its health check (a reused variant pays one trial)"
        reasons = {
            t: rejected[(v.name, t)].most_common(1)[0][0]
            for t in sorted({k.task for k in fresh if k.key != health.get(v.name)})
            if rejected.get((v.name, t))
        }
        if reasons:
            said += "; not reused: " + "; ".join(f"{t} ({w})" for t, w in reasons.items())
        yield said


def reuse_notes(exp: ResolvedExperiment) -> list[NoteRecord]:
    """The plan's notes as ``reuse`` notes of the experiment (submit stores them once)."""
    if exp.reuse is None:
        return []
    kind = "regrade" if exp.regrade_of else "reuse"
    return [
        NoteRecord(experiment_id=exp.experiment_id, kind=kind, message=m) for m in exp.reuse.notes
    ]


def copy_artifacts(src: Path, dst: Path) -> None:
    """``src``'s files into ``dst``, hard-linked where the filesystem allows (no bytes copied),
    renamed into place whole: ``dst`` is complete or absent. An existing ``dst`` is kept."""
    if dst.exists():
        return
    if not src.is_dir():
        raise ReuseError(f"the reused trial's artifacts {src} are gone")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.parent / f".reuse-{dst.name}-{uuid.uuid4().hex[:8]}"

    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns(*_NOT_COPIED), copy_function=link)
    try:
        os.rename(tmp, dst)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another writer put it there first
        if not dst.is_dir():
            raise


def _renamed(key: TrialKey, experiment_id: str) -> dict[str, Any]:
    return {
        "experiment_id": experiment_id,
        "trial_key": key.key,
        "variant": key.variant,
        "task": key.task,
        "replicate": key.replicate,
        "attempt": 1,
    }


def materialize(exp: ResolvedExperiment, store: Store, paths: HangarPaths) -> list[str]:
    """Write every planned reused trial ``exp`` does not hold yet; returns the keys written.

    Idempotent: submit calls it, and the spec stage again (a crash in between loses nothing).
    The grade goes in before the trial row, so a trial never shows ungraded for a moment.
    """
    if exp.reuse is None or not exp.reuse.sources:
        return []
    eid = exp.experiment_id
    have = {t.trial_key for t in store.trials(eid, all_attempts=True)}
    copy_grades = exp.reuse.copy_grades  # a regrade makes its own
    graded = {g.trial_key for g in store.grades(eid, all_attempts=True)} if copy_grades else set()
    todo = {
        k: s
        for k, s in exp.reuse.sources.items()
        if k not in have or (copy_grades and k not in graded)
    }
    written: list[str] = []
    by_source: dict[str, list[tuple[str, ReuseSource]]] = {}
    for key, src in sorted(todo.items()):
        by_source.setdefault(src.experiment_id, []).append((key, src))
    batch: list[Record] = []
    for source_id, items in by_source.items():
        rows = {(t.trial_key, t.attempt): t for t in store.trials(source_id, all_attempts=True)}
        grades = {(g.trial_key, g.attempt): g for g in store.grades(source_id, all_attempts=True)}
        tests: dict[tuple[str, int], list[Any]] = {}
        for t in store.grade_tests(source_id):
            tests.setdefault((t.trial_key, t.attempt), []).append(t)
        for key, src in items:
            row, grade = (
                rows.get((src.trial_key, src.attempt)),
                grades.get((src.trial_key, src.attempt)),
            )
            if row is None or (grade is None and copy_grades):
                raise ReuseError(
                    f"{eid}: trial {key} was planned as a copy of {source_id} {src.trial_key} "
                    f"attempt {src.attempt}, which the store no longer holds"
                )
            k = TrialKey.parse(key)
            art = paths.trial_artifacts(eid, key, 1)
            copy_artifacts(Path(row.artifacts_dir), art)
            renamed = _renamed(k, eid)
            if copy_grades and grade is not None and key not in graded:
                copy = grade.model_copy(update=renamed)
                copied_tests = [
                    t.model_copy(update=renamed)
                    for t in tests.get((src.trial_key, src.attempt), [])
                ]
                batch.append(copy.with_tests(copied_tests))
            if key not in have:
                batch.append(
                    row.model_copy(
                        update=renamed
                        | {
                            "retry_of": None,
                            "artifacts_dir": str(art),
                            "reused_from": dict(src.original),
                        }
                    ),
                )
                written.append(key)
    _put_all(store, batch)
    return written


def _put_all(store: Store, records: list[Record]) -> None:
    """``records`` in one batch (one DuckDB connection for hundreds of copies); each grade
    precedes its trial, so a copied trial never shows ungraded for a moment."""
    try:
        store.put_many(records)
    except DuplicateRecordError:
        # another writer (a run racing the spec stage) stored one first: one counts, so the
        # rest go one by one, each refused copy skipped
        for record in records:
            try:
                store.put(record)
            except DuplicateRecordError:
                pass
