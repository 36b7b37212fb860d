"""Regrade (experiment/regrade.py): a spec may change only the grader; the regrade experiment
holds the old one's counting attempts without their grades, each new grade naming the grade it
replaces; the old experiment is not touched. The grading itself runs in
tests/test_regrade_e2e.py."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.experiment.regrade import regrade_problems
from hangar_dagster.experiment.spec import SpecError, load_spec
from hangar_dagster.experiment.submit import resolve, submit
from hangar_dagster.queue.starts import pending
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings, paths
from tests.reusefixtures import finish, finished_first, spec_file

pytestmark = pytest.mark.unit


def resolved(path: Path) -> ResolvedExperiment:
    return resolve(load_spec(path), path, Settings.from_env(), require_concrete=True)


@pytest.fixture
def first(example_dir: Path, hangar_home: Path) -> tuple[ResolvedExperiment, Store]:
    return finished_first(example_dir, "regrade-first")


def test_only_the_grader_may_change_and_each_other_change_is_named(
    example_dir: Path, first: tuple[ResolvedExperiment, Store]
) -> None:
    old, _ = first
    grader = resolved(spec_file(example_dir, "rg-timeout", {"grader.timeout_s": 200}))
    assert regrade_problems(old, grader) == []
    moved = resolved(
        spec_file(
            example_dir,
            "rg-moved",
            {"grader.timeout_s": 200, "tasks.0.instructions": "fix median", "parallel": 1},
        )
    )
    said = {(p.path, p.message.split(" (")[0]) for p in regrade_problems(old, moved)}
    assert said == {("tasks[0].instructions", "changed"), ("parallel", "changed")}
    same = resolved(spec_file(example_dir, "rg-same"))
    [unchanged] = regrade_problems(old, same)
    assert unchanged.path == "grader" and "nothing to regrade" in unchanged.message


def test_a_regrade_holds_the_counting_attempts_without_grades_and_starts_no_trial(
    example_dir: Path, first: tuple[ResolvedExperiment, Store]
) -> None:
    old, store = first
    new = submit(
        spec_file(example_dir, "rg-new", {"grader.timeout_s": 200}),
        Settings.from_env(),
        regrade=old,
    )
    assert new.regrade_of == old.experiment_id and new.grader_digest != old.grader_digest
    rows = store.trials(new.experiment_id)
    assert len(rows) == 6 and all(r.reused_from for r in rows)
    assert store.grades(new.experiment_id) == []  # its grades stage makes them
    assert new.reuse is not None and not new.reuse.copy_grades
    assert new.reuse.regrade_of["plain/median/1"] == {
        "experiment_id": old.experiment_id,
        "trial_key": "plain/median/1",
        "attempt": 1,
        "grader_digest": old.grader_digest,
    }
    work = pending(new, store, Settings.from_env())
    assert work.keys == [] and len(work.grades) == 6  # grading only: no agent runs
    assert store.experiment(new.experiment_id).trials_reused == 6  # type: ignore[union-attr]
    notes = {n.kind: n.message for n in store.notes(old.experiment_id)}
    assert notes["regrade"].startswith(f"regraded as {new.experiment_id} under grader")
    assert len(store.grades(old.experiment_id)) == 6  # the old grades stay as they were


def test_a_regrade_of_an_unfinished_experiment_or_a_moved_spec_writes_nothing(
    example_dir: Path, hangar_home: Path
) -> None:
    store = Store(paths())
    old = submit(spec_file(example_dir, "rg-part"), Settings.from_env())
    finish(old, store, ago=dt.timedelta(hours=1), keys=["plain/median/1"])
    before = {e.experiment_id for e in store.experiments()}
    with pytest.raises(SpecError, match=r"variants.plain: .* 2 trial\(s\) with no attempt.*resume"):
        submit(
            spec_file(example_dir, "rg-part2", {"grader.timeout_s": 9}),
            Settings.from_env(),
            regrade=old,
        )
    with pytest.raises(SpecError, match=r"tasks\[0\].instructions: changed"):
        submit(
            spec_file(example_dir, "rg-part3", {"tasks.0.instructions": "x"}),
            Settings.from_env(),
            regrade=old,
        )
    assert {e.experiment_id for e in store.experiments()} == before
