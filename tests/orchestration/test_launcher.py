"""The deployment's run launcher leaves the CLI's in-process runs to hangar's liveness check.

Pins the bug the deployment test found: DockerRunLauncher's health check said NOT_FOUND (no
container) for a run `hangar experiment run --wait` executed on the host against the
deployment's instance, and the daemon's run monitoring marked that live run failed.
"""

from __future__ import annotations

import dagster as dg
import pytest
from dagster._core.launcher.base import WorkerStatus
from dagster_docker import DockerRunLauncher

from hangar_dagster.orchestration.launcher import HangarDockerRunLauncher
from hangar_dagster.queue.liveness import TAG_CREATOR

pytestmark = pytest.mark.unit


def run(**tags: str) -> dg.DagsterRun:
    return dg.DagsterRun(job_name="x__trials_job", run_id="r1", tags=tags)


def test_a_run_the_cli_executes_is_not_failed_for_having_no_container() -> None:
    cli_run = run(**{TAG_CREATOR: "host:123:456"})
    # dagster-docker's own check: NOT_FOUND, which run monitoring turns into a failed run.
    assert DockerRunLauncher().check_run_worker_health(cli_run).status == WorkerStatus.NOT_FOUND
    assert HangarDockerRunLauncher().check_run_worker_health(cli_run).status == WorkerStatus.RUNNING


def test_a_launched_run_without_its_container_is_still_reported() -> None:
    # No creator tag: a run the launcher started (or should have); the check is dagster-docker's.
    assert HangarDockerRunLauncher().check_run_worker_health(run()).status == WorkerStatus.NOT_FOUND


def test_the_deployment_config_is_the_subclass_with_dagster_dockers_schema() -> None:
    assert HangarDockerRunLauncher.config_type() is DockerRunLauncher.config_type()
