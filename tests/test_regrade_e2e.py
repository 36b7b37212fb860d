"""`hangar experiment regrade` end to end (issue 15 item 2): the example's trials run once, then
the grader changes (slugify's hidden tests now pass on its base) and the stored patches are
graded again through Dagster: no agent runs, each distinct patch is graded once, the new grades
carry the new grader's digest and ``regrade_of``, the base checks run again for the new grader,
the old experiment's grades stay as they were, a spec that changes more is refused naming the
field, and a crash mid-regrade loses no finished grade: the command run again goes on with the
same regrade and grades only the rest. The CLI runs in this process (``CliRunner``), so the
test sees every sandbox and every grader run. One test checks it all (about 60-90 s)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from typer.testing import CliRunner

from hangar_dagster.cli.main import app
from hangar_dagster.experiment.submit import load_resolved, submit
from hangar_dagster.grading import grader as grader_module
from hangar_dagster.grading.stage import run_base_checks, run_grades
from hangar_dagster.orchestration.stages import TAG_EXPERIMENT, TAG_STAGE
from hangar_dagster.orchestration.status import read_run_status
from hangar_dagster.results.report import build_report, to_markdown
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings
from hangar_dagster.trials import trial as trial_module
from hangar_dagster.trials.stage import run_trials
from tests.reusefixtures import spec_file

pytestmark = pytest.mark.slow


def test_regrade_grades_the_stored_patches_under_the_new_grader_and_runs_no_agent(
    example_dir: Path, hangar_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings.from_env()
    store = Store(settings.paths)
    first = submit(spec_file(example_dir, "regrade-e2e"), settings)
    log = logging.getLogger("first")
    run_base_checks(first, store, settings.paths, "run-1", first.tasks, log, settings)
    run_trials(
        first, store, settings, "run-1", first.trial_keys(), in_flight=lambda _: False, log=log
    )
    run_grades(first, store, settings.paths, "run-1", first.trial_keys(), settings)
    before = {g.trial_key: g for g in store.grades(first.experiment_id)}
    assert len(before) == 6

    agents: list[Any] = []
    monkeypatch.setattr(trial_module, "get_sandbox", lambda *a, **k: agents.append(k) or None)
    graded: list[str] = []
    real_run = grader_module.run_grader

    crash = [True]

    def counted(*args: Any, **kwargs: Any) -> Any:
        label = kwargs.get("label", "?")
        graded.append(label)
        if crash[0] and label.split("/")[1:2] == ["median"]:
            raise RuntimeError("the test's crash in the middle of the regrade")
        return real_run(*args, **kwargs)

    monkeypatch.setattr(grader_module, "run_grader", counted)
    hidden = tmp_path / "slugify-hidden"
    hidden.mkdir()
    (hidden / "test_always.py").write_text("def test_always():\n    assert True\n")
    new_spec = spec_file(example_dir, "regrade-e2e-new", {"tasks.1.hidden_tests": str(hidden)})
    moved = spec_file(
        example_dir,
        "regrade-e2e-moved",
        {"tasks.1.hidden_tests": str(hidden), "tasks.2.verify": "true"},
    )

    refused = CliRunner().invoke(
        app, ["experiment", "regrade", first.experiment_id, "--spec", str(moved)]
    )
    assert refused.exit_code == 2, refused.output
    assert "tasks[2].verify: changed" in " ".join(refused.output.split())

    regrade = ["experiment", "regrade", first.experiment_id, "--spec", str(new_spec)]
    crashed = CliRunner().invoke(app, regrade)
    assert crashed.exit_code == 1, crashed.output  # the grades stage's run failed
    new = load_resolved(settings.paths, crashed.output.split("submitted ")[1].split(":")[0])
    assert new.regrade_of == first.experiment_id and new.grader_digest != first.grader_digest
    # every grade finished before the crash is stored; only median's (the crash) are missing
    kept = {g.trial_key: g for g in store.grades(new.experiment_id)}
    assert set(kept) == {k for k in before if "/median/" not in k}
    distinct = {(t.task, t.patch_sha256) for t in store.trials(first.experiment_id)}
    assert len(distinct) < 6  # two trials left the same patch: one grader run serves both
    # the base checks (base and reference of each of the 3 tasks), then each distinct patch once
    assert len(graded) == 6 + len(distinct)

    crash[0] = False
    graded.clear()
    done = CliRunner().invoke(app, regrade)  # the same command again finishes the rest
    assert done.exit_code == 0, done.output
    assert f"continuing {new.experiment_id}" in " ".join(done.output.split())
    # only the grades the crash cut off were made: median's distinct patches, once each
    assert {k.split("/")[1] for k in graded} == {"median"}
    assert len(graded) == len({d for d in distinct if d[0] == "median"})
    assert {g.trial_key: g for g in store.grades(new.experiment_id) if g.trial_key in kept} == kept
    assert agents == []  # no agent's sandbox was asked for, in either run
    # Each command took three Dagster runs, not five (stages.stage_assets): the spec in the pin
    # sets' run, the base checks' (failed: slugify is invalid now, and the regrade goes on),
    # and one that grades and writes the index (the crashed one failed before its index step).
    with dg.DagsterInstance.from_config(str(settings.dagster_home)) as instance:
        records = instance.get_run_records(dg.RunsFilter(tags={TAG_EXPERIMENT: new.experiment_id}))
        index = instance.get_latest_materialization_event(dg.AssetKey([new.experiment_id, "index"]))
        indexed = read_run_status(instance).indexed_at  # what `experiment list` shows
    runs = [r.dagster_run for r in records[::-1]]  # oldest first
    assert [r.tags[TAG_STAGE] for r in runs] == ["pin_sets", "base_checks", "trials"] * 2
    assert [r.status == dg.DagsterRunStatus.SUCCESS for r in runs[2::3]] == [False, True]
    assert index is not None and index.run_id == runs[-1].run_id
    assert indexed[new.experiment_id].timestamp() == records[0].end_time

    # the base checks ran again for the new grader: slugify's hidden tests now pass on its base
    checks = store.base_checks(new.experiment_id)
    assert checks["slugify"].invalid and checks["slugify"].grader_digest == new.grader_digest
    assert not store.base_checks(first.experiment_id)["slugify"].invalid
    # every patch graded again, each distinct one once, and the base checks: base and reference
    # of each of the 3 tasks
    after = {g.trial_key: g for g in store.grades(new.experiment_id)}
    assert set(after) == set(before)
    for key, g in after.items():
        assert g.grader_digest == new.grader_digest
        assert g.regrade_of == {
            "experiment_id": first.experiment_id,
            "trial_key": key,
            "attempt": 1,
            "grader_digest": first.grader_digest,
        }
        if g.task == "slugify":
            assert g.task_invalid
        else:
            assert g.passed == before[key].passed and not g.task_invalid
    # the old experiment's grades are as they were, and readable
    assert {g.trial_key: g for g in store.grades(first.experiment_id)} == before
    # the index and the report say which grader each number used
    assert {r["grader_digest"] for r in store.index(new.experiment_id)} == {new.grader_digest}
    assert {r["grader_digest"] for r in store.index(first.experiment_id)} == {first.grader_digest}
    report = build_report(new, store)
    assert report.graders == {new.grader_digest: 6} and report.regrade_of == first.experiment_id
    said = " ".join(to_markdown(report, None).split())
    assert (
        f"graded by grader {new.grader_digest} (6 grades); a regrade of {first.experiment_id}"
        in said
    )
    assert report.invalid_tasks.keys() == {"slugify"}
