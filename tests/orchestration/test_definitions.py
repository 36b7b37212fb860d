"""The Dagster definitions load, empty or with experiments, and the driver sensor picks the next stage."""

from __future__ import annotations

import datetime as dt
import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import dagster as dg
import factories as f
import pytest

from hangar_dagster.cli.ui import WORKSPACE_YAML
from hangar_dagster.experiment.catalog import DAEMON_MARKER
from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.experiment.submit import submit
from hangar_dagster.orchestration.definitions import build_definitions
from hangar_dagster.orchestration.instance import ensure_dagster_home
from hangar_dagster.orchestration.sensors import decide
from hangar_dagster.queue.window import parse_window
from hangar_dagster.settings import Settings, paths

pytestmark = pytest.mark.integration


def test_definitions_load_with_no_experiments(hangar_home: Path) -> None:
    defs = build_definitions(Settings.from_env())
    assert list(defs.resolve_all_asset_keys()) == []
    # Building definitions only reads: the CLI prepares the Dagster home (instance.py).
    assert not (hangar_home / "dagster").exists()


def test_definitions_build_one_group_per_experiment(example_dir: Path, hangar_home: Path) -> None:
    a = submit(example_dir / "experiment.yaml", Settings.from_env())
    b = submit(example_dir / "experiment.yaml", Settings.from_env())
    defs = build_definitions(Settings.from_env())
    # What the webserver does on load: every job, op and asset name must be unique.
    dg.Definitions.validate_loadable(defs)
    keys = {tuple(k.path) for k in defs.resolve_all_asset_keys()}
    for exp in (a, b):
        assert {
            (exp.experiment_id, s)
            for s in ("spec", "pin_sets", "base_checks", "trials", "grades", "index")
        } <= keys
        job = defs.resolve_job_def(f"{exp.experiment_id}__trials_job")
        assert job.tags["hangar/stage"] == "trials"
    trials_def = defs.resolve_assets_def(dg.AssetKey([a.experiment_id, "trials"]))
    assert trials_def.partitions_def is not None
    assert len(trials_def.partitions_def.get_partition_keys()) == 18
    assert defs.resolve_sensor_def("experiment_driver") is not None


def test_driver_requests_the_first_stage_only_for_daemon_experiments(
    example_dir: Path, hangar_home: Path
) -> None:
    waited = submit(example_dir / "experiment.yaml", Settings.from_env())
    queued = submit(example_dir / "experiment.yaml", Settings.from_env())
    (paths().experiment_dir(queued.experiment_id) / DAEMON_MARKER).touch()
    with dg.instance_for_test() as instance:
        requests = decide(
            instance, f.settings(parse_window("always")), dt.datetime.now(dt.UTC)
        ).requests
    assert [r.job_name for r in requests] == [f"{queued.experiment_id}__pin_sets_job"]
    assert requests[0].run_key == f"{queued.experiment_id}:pin_sets:1"
    assert waited.experiment_id not in str(requests[0].job_name)


def add_stage_run(
    instance: dg.DagsterInstance, exp: ResolvedExperiment, stage: str, status: dg.DagsterRunStatus
) -> str:
    run_id = str(uuid.uuid4())
    tags = {"hangar/experiment": exp.experiment_id, "hangar/stage": stage}
    instance.add_run(
        dg.DagsterRun(
            job_name=f"{exp.experiment_id}__{stage}_job", run_id=run_id, status=status, tags=tags
        )
    )
    return run_id


class KeptLog(logging.Handler):
    """The messages a sensor tick logs (its context.log, which the daemon stores per tick)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def tick(
    defs: dg.Definitions, instance: dg.DagsterInstance, log: KeptLog | None = None
) -> dg.SensorExecutionData:
    """One evaluation of the real driver sensor, as the daemon runs it against ``defs``
    (with the definitions' resources, as the daemon gives them)."""
    sensor = defs.resolve_sensor_def("experiment_driver")
    with dg.build_sensor_context(
        instance=instance, repository_def=defs.get_repository_def(), resources=defs.resources
    ) as context:  # closed after the tick: it holds the resources it built until then
        if log is not None:
            context.log.addHandler(log)
        return sensor.evaluate_tick(context)


def for_the_daemon(example_dir: Path) -> ResolvedExperiment:
    """The example, submitted without --wait: the driver sensor runs it."""
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    (paths().experiment_dir(exp.experiment_id) / DAEMON_MARKER).touch()
    return exp


def test_the_driver_sensor_requests_loaded_jobs_and_says_why_it_skips(
    example_dir: Path, hangar_home: Path
) -> None:
    first = for_the_daemon(example_dir)
    defs = build_definitions(Settings.from_env())
    with dg.instance_for_test() as instance:
        [request] = tick(defs, instance).run_requests or []
        assert request.job_name == f"{first.experiment_id}__pin_sets_job"
        assert request.run_key == f"{first.experiment_id}:pin_sets:1"

        # Its pin sets run is in flight, and a second experiment is submitted after defs loaded.
        busy = add_stage_run(instance, first, "pin_sets", dg.DagsterRunStatus.STARTED)
        late = for_the_daemon(example_dir)
        skipped = tick(defs, instance)
        assert not skipped.run_requests
        reason = str(skipped.skip_message)
        assert f"{first.experiment_id}: in_flight: its pin_sets run {busy} is STARTED" in reason
        assert (
            f"{late.experiment_id}: not_loaded: its job {late.experiment_id}__pin_sets_job is not "
            "loaded yet; `hangar ui` reloads the code location" in reason
        )


def test_a_tick_that_requests_a_run_logs_why_the_other_experiments_wait(
    example_dir: Path, hangar_home: Path
) -> None:
    """A tick that yields a request shows no skip reason: the waiting ones must not go unsaid."""
    first = for_the_daemon(example_dir)
    defs = build_definitions(Settings.from_env())
    late = for_the_daemon(example_dir)  # after defs loaded
    log = KeptLog()
    with dg.instance_for_test() as instance:
        ticked = tick(defs, instance, log)
    assert [r.run_key for r in ticked.run_requests or []] == [f"{first.experiment_id}:pin_sets:1"]
    assert ticked.skip_message is None
    [said] = [m for m in log.messages if "waiting: " in m]
    assert (
        f"waiting: {late.experiment_id}: not_loaded: its job {late.experiment_id}__pin_sets_job"
        in said
    )


def test_the_driver_sensor_skips_with_the_window_reason(
    example_dir: Path, hangar_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    (paths().experiment_dir(exp.experiment_id) / DAEMON_MARKER).touch()
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    monkeypatch.setenv("HANGAR_EVAL_TZ", "UTC")
    monkeypatch.setenv(
        "HANGAR_EVAL_WINDOW", f"{later:%H:%M}-{later + dt.timedelta(minutes=30):%H:%M}"
    )
    defs = build_definitions(Settings.from_env())
    with dg.instance_for_test() as instance:
        for stage in ("pin_sets", "base_checks"):
            add_stage_run(instance, exp, stage, dg.DagsterRunStatus.SUCCESS)
        skipped = tick(defs, instance)
    assert not skipped.run_requests
    assert str(skipped.skip_message).startswith(f"waiting: {exp.experiment_id}: eval_window: ")


def test_the_shipped_instance_ends_runs_that_never_start_and_never_resumes(
    hangar_home: Path,
) -> None:
    ensure_dagster_home(Settings.from_env())  # seeds $DAGSTER_HOME/dagster.yaml, as the CLI does
    with dg.DagsterInstance.get() as instance:
        assert instance.run_monitoring_enabled
        assert 0 < instance.run_monitoring_start_timeout_seconds <= 600
        assert instance.run_monitoring_max_resume_run_attempts == 0
        # a dead worker's pool slot is given back (tests/deploy shows it on Docker)
        assert instance.run_monitoring_settings["free_slots_after_run_end_seconds"] == 30


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    return env | {"HANGAR_HOME": str(home)}


def test_importing_the_definitions_writes_nothing_and_changes_no_environment(
    tmp_path: Path,
) -> None:
    home = tmp_path / "x"
    probe = (
        "import os, hangar_dagster.orchestration.definitions as d; "
        "print(os.environ.get('DAGSTER_HOME'), callable(d.defs))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env=_clean_env(home),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["None", "True"]
    assert not home.exists()  # not even HANGAR_HOME itself


def test_dagster_loads_the_lazy_definitions_from_the_workspace_module(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    submit(example_dir / "experiment.yaml", Settings.from_env())  # a location with assets
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(WORKSPACE_YAML)  # what `hangar ui` hands `dagster dev`
    dagster = Path(sys.executable).with_name("dagster")
    done = subprocess.run(
        [str(dagster), "definitions", "validate", "-w", str(workspace)],
        env=_clean_env(hangar_home),
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "Validation successful for code location hangar" in said
    assert not (hangar_home / "dagster").exists()  # loading prepared no Dagster home


def test_a_daemon_not_under_hangar_ui_launches_nothing_on_the_embedded_instance(
    example_dir: Path, hangar_home: Path
) -> None:
    """Regression: `dagster dev` (or `dagster-daemon`) started by hand on HANGAR_HOME's instance
    beside, or instead of, `hangar ui` drove experiments too: two daemons launch every run twice,
    and a second one's STARTING runs look like a dead UI's to the liveness check."""
    from hangar_dagster.orchestration.instance import ensure_dagster_home
    from tests.conftest import ui_lock_holder

    first = submit(example_dir / "experiment.yaml", Settings.from_env())
    (paths().experiment_dir(first.experiment_id) / DAEMON_MARKER).touch()
    defs = build_definitions(Settings.from_env())
    ensure_dagster_home(Settings.from_env())
    with dg.DagsterInstance.get() as instance:  # the embedded one: HANGAR_HOME/dagster
        alone = tick(defs, instance)
        assert not alone.run_requests
        said = str(alone.skip_message)
        assert "refused: this daemon is not the `hangar ui`'s" in said
        assert "no `hangar ui` runs" in said
        ui = ui_lock_holder(hangar_home)  # a UI runs, but this tick is not below it
        try:
            beside = tick(defs, instance)
            assert not beside.run_requests
            assert f"`hangar ui` pid {ui.pid} holds" in str(beside.skip_message)
        finally:
            ui.kill()
            ui.wait()
    # The same definitions on another instance (a deployment's, a test's) are not refused.
    with dg.instance_for_test() as other:
        [request] = tick(defs, other).run_requests or []
        assert request.job_name == f"{first.experiment_id}__pin_sets_job"
