"""The Docker deployment's run launcher: dagster-docker's, with a health check that knows the CLI.

``DockerRunLauncher`` checks a run's worker by the container it started (the run's
``docker/container_id`` tag), and the daemon's run monitoring marks failed every ``STARTED``
run whose check is not ``RUNNING``, whoever runs it. A run that ``hangar experiment run
--wait`` or ``resume`` executes in its own process (``dagster.execute_job`` on the same
instance) has no container, so monitoring marked it failed within one poll while it ran (found
by the deployment test). Those runs carry the CLI's ``hangar/creator`` tag (its host and
process): this launcher leaves them to hangar's own liveness check (the driver sensor and
``resume`` end such a run when its process is provably gone, docs/operations.md) and checks
every other run as dagster-docker does.
"""

from __future__ import annotations

from dagster._core.launcher.base import CheckRunHealthResult, WorkerStatus
from dagster._core.storage.dagster_run import DagsterRun
from dagster_docker import DockerRunLauncher
from dagster_docker.docker_run_launcher import DOCKER_CONTAINER_ID_TAG

from hangar_dagster.queue.liveness import TAG_CREATOR


class HangarDockerRunLauncher(DockerRunLauncher):
    """``DockerRunLauncher`` (same config) whose health check skips the CLI's in-process runs."""

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        if DOCKER_CONTAINER_ID_TAG not in run.tags and TAG_CREATOR in run.tags:
            return CheckRunHealthResult(
                WorkerStatus.RUNNING,
                msg="executed in the hangar CLI's process, not in a container: hangar's "
                "liveness check watches it",
            )
        result: CheckRunHealthResult = super().check_run_worker_health(run)
        return result
