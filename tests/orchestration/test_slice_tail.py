"""A trials run's tail, in real Dagster runs: what its steps write per partition once the slots
are done costs the slots that wait for the next run (docs/architecture.md, "Runs over pending
work"), so each page is written once per run."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
import pytest

from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.experiment.submit import submit
from hangar_dagster.orchestration.stages import job_name, stage_tags
from hangar_dagster.results.report_trials import page_path
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings
from tests.conftest import one_task_spec
from tests.orchestration.test_checks import definitions, instance, run

pytestmark = pytest.mark.integration

__all__ = ["instance"]  # the fixture, shared with test_checks


def one_task(
    example_dir: Path, home: Path, instance: dg.DagsterInstance, stages: tuple[str, ...]
) -> tuple[ResolvedExperiment, dg.Definitions]:
    """The example cut to one task (two trial keys), its ``stages`` run in this process."""
    exp = submit(one_task_spec(example_dir, "one.yaml"), Settings.from_env())
    defs = definitions(exp, home)
    for stage in stages:
        assert run(defs, exp, stage, instance).success
    return exp, defs


def test_the_trials_step_leaves_a_graded_trials_page_to_the_grades_step(
    example_dir: Path, hangar_home: Path, instance: dg.DagsterInstance
) -> None:
    settings = Settings.from_env()
    exp, defs = one_task(example_dir, hangar_home, instance, ("pin_sets", "base_checks"))
    trials, grades = (dg.AssetKey([exp.experiment_id, s]) for s in ("trials", "grades"))
    job = defs.resolve_job_def(job_name(exp, "trials"))

    def step(asset: dg.AssetKey) -> None:
        result = job.execute_in_process(
            instance=instance, tags=stage_tags(exp, "trials"), asset_selection=[asset]
        )
        assert result.success

    step(trials)  # the trials step alone: its slots ran and graded every trial
    store = Store(settings.paths)
    graded = {g.trial_key for g in store.grades(exp.experiment_id)}
    keys = {t.trial_key for t in store.trials(exp.experiment_id)}
    assert keys and graded == keys
    pages = {k: page_path(settings.paths, exp.experiment_id, k) for k in keys}
    assert not [p for p in pages.values() if p.exists()], "the grades step writes these pages"
    records = instance.fetch_materializations(trials, limit=10).records
    links = {r.asset_materialization.metadata["evidence"] for r in records}  # type: ignore[union-attr]
    assert links == {dg.MetadataValue.path(str(p)) for p in pages.values()}

    step(grades)  # the page, with the grade, where the trial's materialization links it
    for p in pages.values():
        assert "graded in run" in p.read_text()


def test_a_relaunch_rewrites_only_the_pages_older_than_their_grade(
    example_dir: Path, hangar_home: Path, instance: dg.DagsterInstance
) -> None:
    settings = Settings.from_env()
    stages = ("pin_sets", "base_checks", "trials")
    exp, defs = one_task(example_dir, hangar_home, instance, stages)
    keys = sorted(t.trial_key for t in Store(settings.paths).trials(exp.experiment_id))
    pages = [page_path(settings.paths, exp.experiment_id, k) for k in keys]
    stale, kept = pages[0], pages[1:]
    assert kept, "two keys: one page made stale, the other kept"
    stale.write_text("an older attempt's page")  # as if its run stopped before its grades step
    os.utime(stale, (0, 0))
    written = {p: p.stat().st_mtime_ns for p in kept}

    # A relaunch (every key is kept) as an earlier slice's run: without the index, which
    # writes every page again.
    relaunch = defs.resolve_job_def(job_name(exp, "trials")).execute_in_process(
        instance=instance,
        tags=stage_tags(exp, "trials"),
        asset_selection=[dg.AssetKey([exp.experiment_id, s]) for s in ("trials", "grades")],
    )
    assert relaunch.success
    assert {p: p.stat().st_mtime_ns for p in kept} == written  # not rewritten
    assert "graded in run" in stale.read_text()  # rewritten from the stored grade
