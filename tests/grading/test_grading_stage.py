"""The base-check and grades stage bodies without Dagster, on the example's median task."""

from __future__ import annotations

from pathlib import Path

import pytest

from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.grading.stage import GradePartition, run_base_checks, run_grades
from hangar_dagster.queue.partitions import NO_TRIAL
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings, paths
from hangar_dagster.trials.trial import TrialRequest, run_trial
from tests.trials.test_trials_stage import PLAIN, SKILL, Said, median_only, stage

pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("bwrap")]


def test_base_checks_run_once_per_task_and_are_reused(example_dir: Path, hangar_home: Path) -> None:
    exp = median_only(example_dir, "stage-base")
    store = Store(paths())
    said = Said()
    [(task, first)] = run_base_checks(exp, store, paths(), "run-1", ["median"], said).items()
    assert task == "median" and not first.reused
    assert not first.check.invalid and first.check.reference_passed is True
    assert first.check.run_id == "run-1" and first.log.is_file()
    assert said.lines == []  # a valid task: nothing to warn about
    [again] = run_base_checks(exp, store, paths(), "run-2", ["median"], said).values()
    assert again.reused and again.check.run_id == "run-1"


def test_base_checks_warn_about_an_invalid_task(example_dir: Path, hangar_home: Path) -> None:
    exp = median_only(example_dir, "stage-invalid")
    median = exp.tasks["median"].model_copy(update={"hidden_files": {}})  # collects nothing
    exp = exp.model_copy(update={"tasks": {"median": median}})
    said = Said()
    [part] = run_base_checks(exp, Store(paths()), paths(), "run-1", ["median"], said).values()
    assert part.check.invalid and part.check.reason
    assert said.lines == [("warning", f"task median is invalid: {part.check.reason}")]


def ungraded_trial(exp: ResolvedExperiment) -> Store:
    """``exp``'s base check and PLAIN's trial stored without its grade (the process died
    between the two), in the test's home."""
    store = Store(paths())
    run_base_checks(exp, store, paths(), "run-b", ["median"], Said())
    record, _ = run_trial(
        TrialRequest(experiment=exp, key=PLAIN, attempt=1, retry_of=None, run_id="run-t"),
        Settings.from_env(),
    )
    store.put(record)
    return store


def test_grades_grade_each_latest_attempt_once(example_dir: Path, hangar_home: Path) -> None:
    exp = median_only(example_dir, "stage-grades")
    store = ungraded_trial(exp)  # skill's never ran
    graded = run_grades(exp, store, paths(), "run-g", [PLAIN, SKILL])
    assert graded[SKILL] == GradePartition(SKILL, skipped=NO_TRIAL)
    grade = graded[PLAIN].grade
    assert grade is not None and not graded[PLAIN].reused
    assert (grade.trial_key, grade.attempt, grade.run_id) == (PLAIN.key, 1, "run-g")
    assert [g.trial_key for g in store.grades(exp.experiment_id)] == [PLAIN.key]

    again = run_grades(exp, store, paths(), "run-g2", [PLAIN])
    assert again == {PLAIN: GradePartition(PLAIN, grade=grade, reused=True)}
    assert len(store.grades(exp.experiment_id, all_attempts=True)) == 1


def test_a_grade_the_trials_step_made_in_this_run_is_not_reused(
    example_dir: Path, hangar_home: Path
) -> None:
    exp = median_only(example_dir, "stage-grades-pipelined")
    store = Store(paths())
    stage(exp, "run-t", [PLAIN], Said())  # the trial, graded in its slot
    [made] = store.grades(exp.experiment_id)
    assert made.run_id == "run-t"
    same = run_grades(exp, store, paths(), "run-t", [PLAIN])
    assert same == {PLAIN: GradePartition(PLAIN, grade=made, reused=False)}
    later = run_grades(exp, store, paths(), "run-later", [PLAIN])
    assert later == {PLAIN: GradePartition(PLAIN, grade=made, reused=True)}


def test_a_grader_run_waits_for_a_slot_an_overlapping_run_holds(
    example_dir: Path, hangar_home: Path
) -> None:
    """Beside an overlapping slice's run the grades step's graders share the experiment's
    ``parallel`` slots with that run's trials (queue/slots.py): none starts while they are held."""
    import threading
    import time

    from hangar_dagster.queue.slots import experiment_slots

    exp = median_only(example_dir, "stage-grades-slots")
    store = ungraded_trial(exp)
    slots = experiment_slots(paths().experiment_dir(exp.experiment_id), exp.spec.parallel)
    held, release = threading.Event(), threading.Event()
    freed_at: list[float] = []

    def other_run_slot() -> None:  # a thread of "the other run" holding one slot
        with slots.hold(lambda: None):
            held.set()
            release.wait(30)
            freed_at.append(time.time())

    others = [threading.Thread(target=other_run_slot) for _ in range(exp.spec.parallel)]
    for t in others:
        t.start()
        assert held.wait(10)
        held.clear()
    threading.Timer(2.0, release.set).start()
    graded = run_grades(exp, store, paths(), "run-g", [PLAIN])
    for t in others:
        t.join(10)
    grade = graded[PLAIN].grade
    assert grade is not None and freed_at
    started = grade.graded_at.timestamp() - grade.duration_s
    assert started >= min(freed_at), "the grader ran while every slot was held"
