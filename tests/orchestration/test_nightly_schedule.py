"""The ``nightly_experiments`` schedule end to end (issue 15 item 4): a spec registered with the
real CLI, the schedule from the definitions Dagster loads evaluated at two nights' times with
Dagster's own schedule context, a task's branch moved between them; each night's experiment run
through Dagster in this process (``driver.drive``, as the daemon's runs would) and the CLI's
``compare --nightly`` putting the second night beside the first."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.schedule_definition import ScheduleExecutionData

from hangar_dagster.experiment import nightly
from hangar_dagster.experiment.submit import load_resolved
from hangar_dagster.orchestration.definitions import build_definitions
from hangar_dagster.orchestration.driver import drive
from hangar_dagster.orchestration.resources import HangarResource
from hangar_dagster.orchestration.schedules import NIGHTLY_NAME
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings
from tests.conftest import hangar
from tests.nightlyfixtures import move_branch, nightly_spec, sha_of

pytestmark = pytest.mark.slow


def test_two_nights_submit_with_the_moved_branch_reuse_the_rest_and_compare(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    spec = nightly_spec(example_dir, tmp_path, at="19:30", timezone="America/New_York")
    assert hangar("experiment", "schedule", str(spec), home=hangar_home).returncode == 0
    settings = Settings.from_env()
    defs = build_definitions(settings)
    repo = defs.get_repository_def()
    schedule = repo.get_schedule_def(NIGHTLY_NAME)
    resources = {"hangar": HangarResource.from_settings(settings)}
    store = Store(settings.paths)
    # Nights near today: reuse counts a trial's age from its real finish to the real submit.
    registered = nightly.read_schedule(settings.paths, "nightly-ab")
    assert registered is not None
    today = dt.datetime.now(registered.nightly.zone).date()
    first_night = nightly.night_time(registered.nightly, today)
    second_night = nightly.night_time(registered.nightly, today + dt.timedelta(days=1))

    with dg.instance_for_test() as instance:

        def tick(at: dt.datetime) -> ScheduleExecutionData:
            with dg.build_schedule_context(
                instance=instance,
                scheduled_execution_time=at,
                repository_def=repo,
                resources=resources,
            ) as context:
                data = schedule.evaluate_tick(context)
            assert data.run_requests == []  # it submits; the driver sensor launches the runs
            return data

        assert "next night is submitted at" in (
            tick(first_night - dt.timedelta(minutes=1)).skip_message or ""
        )
        first = tick(first_night)
        [one] = nightly.nights(settings.paths, "nightly-ab")
        assert one.experiment_id is not None
        assert f"submitted {one.experiment_id} (4 trials, 0 reused)" in (first.skip_message or "")
        again = tick(first_night)  # the same tick retried: no second experiment
        assert f"night {today} submitted {one.experiment_id}" in (again.skip_message or "")
        assert len(nightly.nights(settings.paths, "nightly-ab")) == 1
        exp1 = load_resolved(settings.paths, one.experiment_id)
        drive(exp1, store, settings, say=lambda _: None)

        sha1 = sha_of(tmp_path, "median")
        sha2 = move_branch(tmp_path, "median")
        tick(second_night)
        two = nightly.nights(settings.paths, "nightly-ab")[-1]
        assert two.experiment_id is not None and two.experiment_id != one.experiment_id
        exp2 = load_resolved(settings.paths, two.experiment_id)
        drive(exp2, store, settings, say=lambda _: None)

    # each night resolved the branch to its own SHA, and recorded the ref beside it
    assert (one.bases["median"].ref, one.bases["median"].sha) == ("trunk", sha1)
    assert (two.bases["median"].ref, two.bases["median"].sha) == ("trunk", sha2)
    assert exp1.tasks["median"].base_sha == sha1 and exp2.tasks["median"].base_sha == sha2
    assert exp2.tasks["slugify"].base_sha == exp1.tasks["slugify"].base_sha
    # the second night reused what did not change (slugify) and ran the moved task afresh
    rows = {t.trial_key: t for t in store.trials(exp2.experiment_id)}
    assert len(rows) == 4 and all(r.outcome_class != "infra_error" for r in rows.values())
    reused = sorted(k for k, r in rows.items() if r.reused_from)
    assert reused == ["plain/slugify/1", "skill/slugify/1"]
    assert all(rows[k].reused_from["experiment_id"] == exp1.experiment_id for k in reused)  # type: ignore[index]
    assert two.trials_reused == 2 and two.previous == exp1.experiment_id

    listed = hangar("experiment", "schedule", "--list", home=hangar_home)
    assert listed.returncode == 0 and two.experiment_id in listed.stdout, listed.stdout

    compared = hangar("experiment", "compare", "--nightly", "nightly-ab", home=hangar_home)
    assert compared.returncode == 0, compared.stderr
    out = compared.stdout
    print(out)
    assert f"{exp1.experiment_id} (nightly-ab) -> {exp2.experiment_id} (nightly-ab)" in out
    assert f"nightly nightly-ab: night {one.night} -> night {two.night}" in out
    assert f"base of median moved: {sha1[:12]} -> {sha2[:12]}" in out
    for variant in ("plain", "skill"):
        assert f"{variant}: " in out
    assert out.count("after - before: ") == 2
    as_json = hangar("experiment", "compare", "--nightly", "nightly-ab", "--json", home=hangar_home)
    data = json.loads(as_json.stdout)
    assert (data["before"], data["after"]) == (exp1.experiment_id, exp2.experiment_id)
    assert data["nights"]["moved"] == {"median": [sha1, sha2]}
    for name in ("plain", "skill"):
        v = data["variants"][name]
        assert v["before_label"] and v["after_label"] and v["difference_label"]
