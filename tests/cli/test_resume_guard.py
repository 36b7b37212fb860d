"""`hangar experiment resume` refuses while a Dagster run of the experiment is in flight."""

from __future__ import annotations

import uuid
from pathlib import Path

import dagster as dg
import pytest

from hangar_dagster.experiment.submit import submit
from hangar_dagster.orchestration.instance import ensure_dagster_home
from hangar_dagster.settings import Settings
from tests.conftest import command_agent_spec, hangar, killed_worker, write_spec

pytestmark = pytest.mark.integration


def stage_run_left(
    experiment_id: str,
    stage: str = "trials",
    status: dg.DagsterRunStatus = dg.DagsterRunStatus.STARTED,
) -> str:
    """A ``stage`` run of the experiment left in ``status`` (STARTED: its worker's) on the
    CLI's instance; its run id."""
    run_id = str(uuid.uuid4())
    with dg.DagsterInstance.get() as instance:
        instance.add_run(
            dg.DagsterRun(
                job_name=f"{experiment_id}__{stage}_job",
                run_id=run_id,
                status=status,
                tags={"hangar/experiment": experiment_id, "hangar/stage": stage},
            )
        )
    return run_id


def test_resume_refuses_beside_a_run_in_flight_and_runs_once_it_ended(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    spec = command_agent_spec(example_dir, tmp_path, "guarded", "true")
    exp = submit(write_spec(example_dir, spec), Settings.from_env())
    ensure_dagster_home(Settings.from_env())  # the instance the CLI uses: $HANGAR_HOME/dagster
    run_id = stage_run_left(exp.experiment_id)

    refused = hangar("experiment", "resume", exp.experiment_id, home=hangar_home)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = " ".join(refused.stderr.split())  # rich wraps long lines
    assert f"refused: {exp.experiment_id}: its trials run {run_id} is STARTED since" in said
    with dg.DagsterInstance.get() as instance:
        assert [r.run_id for r in instance.get_runs()] == [run_id]  # it launched nothing

        # The run ends (here: marked failed, as run monitoring or the UI would): resume goes on.
        run = instance.get_run_by_id(run_id)
        assert run is not None
        instance.report_run_failed(run, "its worker died")
    resumed = hangar("experiment", "resume", exp.experiment_id, home=hangar_home)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    with dg.DagsterInstance.get() as instance:
        stages = {r.tags.get("hangar/stage") for r in instance.get_runs() if r.run_id != run_id}
    assert {"pin_sets", "trials"} <= stages


def test_resume_ends_a_run_whose_worker_was_killed_and_goes_on_without_the_ui(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    spec = command_agent_spec(example_dir, tmp_path, "orphaned", "true")
    exp = submit(write_spec(example_dir, spec), Settings.from_env())
    ensure_dagster_home(Settings.from_env())
    run_id = stage_run_left(exp.experiment_id)
    # Its worker recorded itself, then died with the daemon that launched it: left STARTED.
    pid = killed_worker(hangar_home, run_id)

    resumed = hangar("experiment", "resume", exp.experiment_id, home=hangar_home)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    said = " ".join(resumed.stderr.split())
    assert f"its trials run {run_id} was STARTED, but its process (pid {pid} on" in said
    assert "is gone: marked failed" in said
    with dg.DagsterInstance.get() as instance:
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.FAILURE
        stages = {r.tags.get("hangar/stage") for r in instance.get_runs() if r.run_id != run_id}
    assert {"pin_sets", "trials"} <= stages


def test_resume_ends_a_run_its_killed_cli_created_but_never_started(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    """Regression (tests/chaos.py): `run --wait` SIGKILLed between creating a stage run and
    starting it (the definitions load in between) left the run NOT_STARTED for good, and
    resume refused beside it ("is NOT_STARTED since ...")."""
    import subprocess
    import sys

    spec = command_agent_spec(example_dir, tmp_path, "unstarted", "true")
    exp = submit(write_spec(example_dir, spec), Settings.from_env())
    ensure_dagster_home(Settings.from_env())
    # The tag the CLI's run carries ("hangar/creator"), written by a process that has exited.
    said = subprocess.run(
        [
            sys.executable,
            "-c",
            "from hangar_dagster.queue.liveness import creator_tag as t; print(t())",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    run_id = str(uuid.uuid4())
    with dg.DagsterInstance.get() as instance:
        instance.add_run(
            dg.DagsterRun(
                job_name=f"{exp.experiment_id}__pin_sets_job",
                run_id=run_id,
                status=dg.DagsterRunStatus.NOT_STARTED,
                tags={
                    "hangar/experiment": exp.experiment_id,
                    "hangar/stage": "pin_sets",
                    "hangar/creator": said.stdout.strip(),
                },
            )
        )

    resumed = hangar("experiment", "resume", exp.experiment_id, home=hangar_home)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"its pin_sets run {run_id} was NOT_STARTED, but its process" in " ".join(
        resumed.stderr.split()
    )
    with dg.DagsterInstance.get() as instance:
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.FAILURE


def test_resume_with_no_ui_ends_a_run_a_killed_ui_left_starting(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    """Regression (tests/chaos.py): `hangar ui` SIGKILLed while its daemon launched a run left
    it STARTING with no process record and no creator tag; resume refused beside it."""
    spec = command_agent_spec(example_dir, tmp_path, "unlaunched", "true")
    exp = submit(write_spec(example_dir, spec), Settings.from_env())
    ensure_dagster_home(Settings.from_env())
    run_id = stage_run_left(exp.experiment_id, "pin_sets", dg.DagsterRunStatus.STARTING)

    resumed = hangar("experiment", "resume", exp.experiment_id, home=hangar_home)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    said = " ".join(resumed.stderr.split())
    assert f"its pin_sets run {run_id} was STARTING, but its launcher is gone: no `hangar ui`" in (
        said
    )
    with dg.DagsterInstance.get() as instance:
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.FAILURE
        stages = {r.tags.get("hangar/stage") for r in instance.get_runs() if r.run_id != run_id}
    assert {"pin_sets", "base_checks", "trials"} <= stages
