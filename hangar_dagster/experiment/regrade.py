"""Regrade: grade an experiment's stored patches again under a changed grader, no agent run.

``hangar experiment regrade EXP [--spec NEW.yaml]`` submits a **regrade experiment**: the spec
(NEW.yaml, else EXP's own spec file as it reads now, so edited hidden test files count)
resolved like any other, then held to EXP: everything that ran the trials must be the same
(the spec outside ``grader``, every task's repo, base, instructions, verify, reference patch
and build, every variant's lock, model, environment and tasks), and the grader must differ
(``regrade_problems`` names each field that breaks this). Its trials are EXP's counting
attempts, copied as reused trials (experiment/reuse.py) without their grades; its base checks
run for the new grader, its grades stage grades every stored patch, each grade carrying
``regrade_of`` (EXP, the trial key, the attempt and the grader digest of the grade it
replaces). EXP is not touched: its grades stay as they were, readable, and it gets a
``regrade`` note naming the new experiment. A regrade never starts a trial (queue/starts.py
``pending``). docs/architecture.md, "Regrading".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hangar_dagster.experiment.harness import load_lock
from hangar_dagster.experiment.pins import environment_digest, lock_pin_content, pin_set_id
from hangar_dagster.experiment.plan import (
    ResolvedExperiment,
    ResolvedVariant,
    ReusePlan,
    ReuseSource,
)
from hangar_dagster.experiment.reuse import original_of
from hangar_dagster.experiment.spec import Problem, SpecError
from hangar_dagster.results.records import NoteRecord
from hangar_dagster.results.store import Store
from hangar_dagster.settings import HangarPaths, Settings

# What a regrade may change: the grader's settings and the tasks' hidden tests (compared as
# the grader digest: the hidden files of every task are in it).
_TASK_FIELDS = ("repo", "base_sha", "instructions", "verify", "reference_patch", "build")
_VARIANT_FIELDS = ("harness_digest", "adapter", "model", "environment_digest", "tasks")
_SPEC_NAME = {"base_sha": "base", "harness_digest": "harness_lock"}
_FIX = "a regrade changes only the grader (grader.*, tasks[].hidden_tests); run a new experiment"


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """``value`` as {dotted path: leaf}."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out |= _flat(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    return {prefix: value}


def regrade_problems(old: ResolvedExperiment, new: ResolvedExperiment) -> list[Problem]:
    """Why ``new`` cannot regrade ``old``: every field it changes but the grader's, by path."""
    problems: list[Problem] = []

    def changed(path: str, was: Any, now: Any) -> None:
        problems.append(
            Problem(path=path, message=f"changed ({_short(was)} -> {_short(now)})", fix=_FIX)
        )

    skip = {"grader", "tasks", "harness_repo", "reuse"}
    before = _flat(old.spec.model_dump(mode="json", exclude=skip))
    after = _flat(new.spec.model_dump(mode="json", exclude=skip))
    for path in sorted(before.keys() | after.keys()):
        if before.get(path) != after.get(path):
            changed(path, before.get(path), after.get(path))
    # Each task and variant field by the path a spec writer knows it by.
    sides: tuple[tuple[str, dict[str, Any], dict[str, Any], tuple[str, ...]], ...] = (
        ("tasks", dict(old.tasks), dict(new.tasks), _TASK_FIELDS),
        ("variants", dict(old.variants), dict(new.variants), _VARIANT_FIELDS),
    )
    for what, was_all, now_all, fields in sides:
        if list(was_all) != list(now_all):
            changed(what, list(was_all), list(now_all))
        for i, (name, now) in enumerate(now_all.items()):
            if (was := was_all.get(name)) is None:
                continue
            at = f"tasks[{i}]" if what == "tasks" else f"variants.{name}"
            for field in fields:
                if getattr(was, field) != getattr(now, field):
                    said = _SPEC_NAME.get(field, field)
                    changed(f"{at}.{said}", getattr(was, field), getattr(now, field))
    if not problems and old.grader_digest == new.grader_digest:
        problems.append(
            Problem(
                path="grader",
                message=f"unchanged (grader digest {old.grader_digest}): nothing to regrade",
                fix="change the grader's settings or the hidden tests, then regrade",
            )
        )
    return problems


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _trimmed(
    exp: ResolvedExperiment, v: ResolvedVariant, tasks: tuple[str, ...], settings: Settings
) -> ResolvedVariant:
    """``v`` running only ``tasks``: its environment digest and pin set made again for them."""
    if tasks == v.tasks:
        return v
    lock = load_lock(Path(v.harness_path).parent, v.harness_lock)
    task_build = {t: exp.tasks[t].build for t in tasks}
    content = lock_pin_content(
        lock,
        v.environment,
        model=v.model,
        model_concrete_basis=v.model_concrete_basis,
        task_bases={t: exp.tasks[t].base_sha for t in tasks},
        grader_digest=exp.grader_digest,
        aliases=settings.model_aliases,
        task_build=task_build,
    )
    return v.model_copy(
        update={
            "tasks": tasks,
            "environment_digest": environment_digest(v.environment, task_build),
            "pin_set": pin_set_id(content),
        }
    )


def plan_regrade(
    old: ResolvedExperiment, new: ResolvedExperiment, store: Store, settings: Settings
) -> ResolvedExperiment:
    """``new`` as the regrade of ``old``: its trials are ``old``'s counting attempts, its grades
    to be made; raises SpecError when ``new`` changes more than the grader, or when a planned
    trial of ``old`` has no attempt yet (resume it first)."""
    if problems := regrade_problems(old, new):
        raise SpecError(new.spec_path, problems)
    latest = {t.trial_key: t for t in store.trials(old.experiment_id)}
    grades = {
        (g.trial_key, g.attempt): g for g in store.grades(old.experiment_id, all_attempts=True)
    }
    missing = [k.key for k in old.trial_keys() if k.key not in latest]
    invalid = {t for t, c in store.base_checks(old.experiment_id).items() if c.invalid}
    # A task its base check found invalid never ran: it is left out of the regrade. Any other
    # trial without an attempt means the experiment is not finished.
    variants = {}
    for name, v in new.variants.items():
        ran = tuple(t for t in v.tasks if any(k.startswith(f"{name}/{t}/") for k in latest))
        partial = [
            k
            for k in missing
            if k.startswith(f"{name}/")
            and (k.split("/")[1] in ran or k.split("/")[1] not in invalid)
        ]
        if partial:
            raise SpecError(
                new.spec_path,
                [
                    Problem(
                        path=f"variants.{name}",
                        message=f"{old.experiment_id} has {len(partial)} trial(s) with no "
                        f"attempt yet (e.g. {partial[0]})",
                        fix=f"`hangar experiment resume {old.experiment_id}`, then regrade",
                    )
                ],
            )
        variants[name] = _trimmed(new, v, ran, settings)
    keys = [k for k in new.trial_keys() if k.task in variants[k.variant].tasks]
    sources = {
        k.key: ReuseSource(
            experiment_id=old.experiment_id,
            trial_key=k.key,
            attempt=latest[k.key].attempt,
            original=original_of(latest[k.key]),
        )
        for k in keys
    }
    replaced: dict[str, dict[str, str | int]] = {}
    for key, src in sources.items():
        if (g := grades.get((key, src.attempt))) is not None:
            replaced[key] = {
                "experiment_id": old.experiment_id,
                "trial_key": key,
                "attempt": src.attempt,
                "grader_digest": g.grader_digest,
            }
    left_out = sorted({k.task for k in old.trial_keys()} - {k.task for k in keys})
    notes = [
        f"regrade of {old.experiment_id}: {len(sources)} trial(s) graded again under grader "
        f"{new.grader_digest} (it used {old.grader_digest}); no agent runs"
    ]
    if left_out:
        notes.append(
            f"left out of the regrade: {', '.join(left_out)} (invalid in {old.experiment_id}: "
            "none of its trials ran; a new experiment runs them)"
        )
    plan = ReusePlan(
        enabled=True, sources=sources, copy_grades=False, regrade_of=replaced, notes=tuple(notes)
    )
    return new.model_copy(
        update={"variants": variants, "regrade_of": old.experiment_id, "reuse": plan}
    )


def regrade_note(old: ResolvedExperiment, new: ResolvedExperiment) -> NoteRecord:
    """The note on the experiment that was regraded: where its patches were graded again."""
    return NoteRecord(
        experiment_id=old.experiment_id,
        kind="regrade",
        message=f"regraded as {new.experiment_id} under grader {new.grader_digest}; "
        "these grades stay as they were",
    )


class RegradeSubmitted(Exception):
    """This experiment was already regraded under this grader: ``experiment`` is that regrade,
    which a rerun of the command goes on with (nothing new is written)."""

    def __init__(self, experiment: ResolvedExperiment):
        super().__init__(f"{experiment.experiment_id} regrades it under this grader already")
        self.experiment = experiment


def earlier_regrade(
    old: ResolvedExperiment, grader_digest: str, paths: HangarPaths
) -> ResolvedExperiment | None:
    """The regrade of ``old`` under ``grader_digest`` already submitted (and not archived), the
    latest: running the command again continues it (a crash loses none of its grades) rather
    than grading everything a second time."""
    from hangar_dagster.experiment.catalog import active_experiments  # it imports submit

    found = [
        e
        for e in active_experiments(paths)
        if e.regrade_of == old.experiment_id and e.grader_digest == grader_digest
    ]
    return found[-1] if found else None


def spec_of(old: ResolvedExperiment, spec: Path | None) -> Path:
    """The spec a regrade resolves: the one given, else the experiment's own as it reads now."""
    return spec if spec is not None else Path(old.spec_path)
