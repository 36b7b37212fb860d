"""The asset checks in real Dagster runs: an invalid task shows red per partition, grade signals warn.

The example cut to one variant and one trial per task, with slugify's hidden
tests replaced by one that passes on the base: slugify is invalid, median valid.
Its stage jobs run in this process against a real (test) instance, and the
results are read back the way the UI reads them: per check and partition.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.experiment.submit import submit
from hangar_dagster.grading.verdicts import GRADE_SIGNALS
from hangar_dagster.orchestration.assets import build_experiment_assets
from hangar_dagster.orchestration.checks import build_experiment_checks
from hangar_dagster.orchestration.jobs import build_experiment_jobs
from hangar_dagster.orchestration.resources import HangarResource
from hangar_dagster.orchestration.stages import job_name, stage_tags
from hangar_dagster.queue.starts import pending
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings, paths
from tests.conftest import hangar, write_spec

pytestmark = pytest.mark.integration

PASSES_ON_BASE = {"test_hidden_slug.py": "def test_nothing_to_fix():\n    assert True\n"}
GRADE_CHECKS = {
    "grade_passed",
    "trust_isolated",
    "no_tamper_signals",
    "no_contamination",
    "no_touched_tests",
}


def invalid_spec(example_dir: Path) -> Path:
    spec: dict[str, Any] = yaml.safe_load((example_dir / "experiment.yaml").read_text())
    tasks = [t for t in spec["tasks"] if t["id"] in ("median", "slugify")]
    for t in tasks:
        if t["id"] == "slugify":
            t["hidden_tests"] = PASSES_ON_BASE
            del t["reference_patch"]
    spec.update(
        name="invalid-slugify",
        tasks=tasks,
        variants={"plain": spec["variants"]["plain"]},
        trials=1,
    )
    return write_spec(example_dir, spec)


@pytest.fixture
def invalid_slugify(example_dir: Path, hangar_home: Path) -> ResolvedExperiment:
    return submit(invalid_spec(example_dir), Settings.from_env())


def definitions(exp: ResolvedExperiment, home: Path) -> dg.Definitions:
    assets = build_experiment_assets(exp)
    return dg.Definitions(
        assets=assets,
        asset_checks=build_experiment_checks(exp, assets),
        jobs=build_experiment_jobs(exp, assets),
        resources={
            "hangar": HangarResource.from_settings(
                Settings.from_env({**os.environ, "HANGAR_HOME": str(home)})
            )
        },
    )


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def run(
    defs: dg.Definitions, exp: ResolvedExperiment, stage: str, instance: dg.DagsterInstance
) -> dg.ExecuteInProcessResult:
    job = defs.resolve_job_def(job_name(exp, stage))
    return job.execute_in_process(
        instance=instance, tags=stage_tags(exp, stage), raise_on_error=False
    )


def partition_status(
    instance: dg.DagsterInstance, key: dg.AssetCheckKey, partitions_def: dg.PartitionsDefinition
) -> dict[str, set[str]]:
    """Per status (SUCCEEDED, FAILED, ...) the partitions in it: what the UI's health bar shows."""
    state = instance.event_log_storage.get_asset_check_state([(key, partitions_def)])[key]
    return {
        status.value: set(subset.subset_value.get_partition_keys())
        for status, subset in state.subsets.items()
        if not subset.is_empty
    }


def evaluation_run(instance: dg.DagsterInstance, exp: ResolvedExperiment) -> str:
    [trials_run] = instance.get_runs(dg.RunsFilter(job_name=job_name(exp, "trials")))
    return trials_run.run_id


def test_each_stage_job_runs_the_checks_of_its_assets(
    invalid_slugify: ResolvedExperiment, hangar_home: Path
) -> None:
    exp = invalid_slugify
    defs = definitions(exp, hangar_home)
    dg.Definitions.validate_loadable(defs)
    base = dg.AssetKey([exp.experiment_id, "base_checks"])
    grades = dg.AssetKey([exp.experiment_id, "grades"])
    index = dg.AssetKey([exp.experiment_id, "index"])
    # The index's readback check is the index asset's own: its step evaluates it.
    owners = [
        *(defs.asset_checks or []),
        *(a for a in defs.assets or [] if isinstance(a, dg.AssetsDefinition)),
    ]
    specs = {s.key: s for c in owners for s in c.check_specs}
    assert set(specs) == {
        dg.AssetCheckKey(base, "base_must_fail"),
        dg.AssetCheckKey(base, "reference_must_pass"),
        dg.AssetCheckKey(index, "readback"),
    } | {dg.AssetCheckKey(grades, n) for n in GRADE_CHECKS}
    for key, spec in specs.items():
        assert spec.blocking == (key.asset_key == base)
        # The index is one unpartitioned asset; the grades' checks are evaluated once per run.
        if key.asset_key in (index, grades):
            assert spec.partitions_def is None
            continue
        assert spec.partitions_def is not None
        assert (
            spec.partitions_def.get_partition_keys()
            == defs.resolve_assets_def(key.asset_key).partitions_def.get_partition_keys()
        )
    by_job = {
        stage: defs.resolve_job_def(job_name(exp, stage)).asset_layer.asset_graph.asset_check_keys
        for stage in ("base_checks", "trials", "index")
    }
    assert by_job["base_checks"] == {k for k in specs if k.asset_key == base}
    # The trials job writes the index too (its last slice's run: stages.stage_assets).
    assert by_job["trials"] == {k for k in specs if k.asset_key in (grades, index)}
    assert by_job["index"] == {dg.AssetCheckKey(index, "readback")}


@pytest.mark.needs_sandbox("bwrap")
def test_an_invalid_task_is_red_its_trials_never_start_and_grades_are_checked(
    invalid_slugify: ResolvedExperiment, hangar_home: Path, instance: dg.DagsterInstance
) -> None:
    exp = invalid_slugify
    defs = definitions(exp, hangar_home)
    store = Store(paths())
    for stage in ("pin_sets",):
        assert run(defs, exp, stage, instance).success

    checked = run(defs, exp, "base_checks", instance)
    # Dagster's blocking rule: a failed ERROR check fails its run (the asset still materialized).
    assert not checked.success
    assert {m.partition for m in checked.asset_materializations_for_node(
        f"{exp.experiment_id}__base_checks"
    )} == {"median", "slugify"}  # fmt: skip
    said = {(e.check_name, e.partition): e for e in checked.get_asset_check_evaluations()}
    assert set(said) == {
        (c, t) for c in ("base_must_fail", "reference_must_pass") for t in ("median", "slugify")
    }
    bad = said[("base_must_fail", "slugify")]
    assert (bad.passed, bad.severity, bad.blocking) == (False, dg.AssetCheckSeverity.ERROR, True)
    assert bad.description is not None and "hidden tests pass on base" in bad.description
    assert said[("base_must_fail", "median")].passed
    no_ref = said[("reference_must_pass", "slugify")]
    assert no_ref.passed and no_ref.description == "no reference_patch given: nothing to check"

    base = dg.AssetKey([exp.experiment_id, "base_checks"])
    tasks_def = defs.resolve_assets_def(base).partitions_def
    assert tasks_def is not None
    assert partition_status(instance, dg.AssetCheckKey(base, "base_must_fail"), tasks_def) == {
        "SUCCEEDED": {"median"},
        "FAILED": {"slugify"},
    }
    assert partition_status(instance, dg.AssetCheckKey(base, "reference_must_pass"), tasks_def) == {
        "SUCCEEDED": {"median", "slugify"}
    }

    # Its trials never start: the queue leaves slugify out and the trials run starts median only.
    assert [k.key for k in pending(exp, store, Settings.from_env()).keys] == ["plain/median/1"]
    assert run(defs, exp, "trials", instance).success
    assert [t.trial_key for t in store.trials(exp.experiment_id)] == ["plain/median/1"]
    assert not pending(exp, store, Settings.from_env())

    grades = dg.AssetKey([exp.experiment_id, "grades"])
    [grade] = store.grades(exp.experiment_id)
    for name, (_what, decide) in GRADE_SIGNALS.items():
        # once for the run over its trials (slugify's were never graded: not among them)
        history = instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(grades, name), limit=10
        )
        [evaluation] = [
            r.event.dagster_event.event_specific_data
            for r in history
            if r.event is not None and r.status.value != "PLANNED"
        ]
        verdict = decide(grade)
        assert evaluation.passed == verdict.passed
        assert evaluation.severity == dg.AssetCheckSeverity.WARN
        assert evaluation.partition is None
        assert evaluation.metadata["trials"] == dg.MetadataValue.int(1)
        assert evaluation.metadata["flagged"] == dg.MetadataValue.int(0 if verdict.passed else 1)
        if not verdict.passed:
            assert evaluation.description.startswith("1 of the run's 1 trial(s): plain/median/1")
        assert evaluation.target_materialization_data.run_id == evaluation_run(instance, exp)

    assert run(defs, exp, "index", instance).success


@pytest.mark.slow
@pytest.mark.needs_sandbox("bwrap")
def test_run_wait_completes_an_experiment_with_an_invalid_task_and_get_says_so(
    example_dir: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    result = hangar("experiment", "run", str(invalid_spec(example_dir)), "--wait", home=home)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "task slugify is invalid" in " ".join(result.stdout.split())
    experiment_id = result.stdout.split("submitted ")[1].split()[0]
    shown = hangar("experiment", "get", experiment_id, "--json", home=home)
    got = json.loads(shown.stdout)
    assert got["base_checks"]["slugify"]["invalid"] is True
    assert got["base_checks"]["median"]["invalid"] is False
    assert [t["trial_key"] for t in got["trials"]] == ["plain/median/1"]  # nothing paid for slugify
    assert got["queue"]["pending_trials"] == 0
    note = "trials of invalid tasks are not started: slugify (hidden tests pass on base)"
    assert note in [n["message"] for n in got["notes"] if n["kind"] == "queue"]
    text = " ".join(hangar("experiment", "get", experiment_id, home=home).stdout.split())
    assert "base check slugify: invalid: hidden tests pass on base" in text
    with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
        index = instance.get_latest_materialization_event(dg.AssetKey([experiment_id, "index"]))
        assert index is not None and index.asset_materialization is not None
        metadata = index.asset_materialization.metadata
        assert metadata["invalid_tasks"].value == "slugify"
        assert metadata["pending_trials"].value == 0
