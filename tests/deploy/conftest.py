"""The project image (deploy/docker), built once per recipe for the deploy tests that run it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TAG = "hangar-dagster:test"  # not the operator's hangar-dagster:local


@pytest.fixture(scope="session")
def project_image(docker_base_image: str) -> str:
    """Its id; a second build with the same recipe is a cache hit (scripts/bootstrap built it)."""
    from hangar_dagster.environment.project_image import build_project_image
    from hangar_dagster.trials.sandbox.docker import client
    from tests.agent_clis import cache_dir

    built = build_project_image(
        client(), source=REPO, wheels_cache=cache_dir() / "project-wheels", tag=TAG
    )
    return built.image_id


SOCKET = "/var/run/docker.sock"


def run_in_worker(
    image: str,
    shared: Path,
    argv: list[str],
    env: dict[str, str],
    *,
    timeout: float = 180,
    **create: Any,
) -> tuple[int, str]:
    """(exit status, output) of ``argv`` in a container started as a run worker is: the project
    image, the Engine socket, the shared directory at the same path as on the host."""
    from hangar_dagster.trials.sandbox.docker import MANAGED_LABEL, OWNER_LABEL, _owner, client

    labels = {**create.pop("labels", {}), MANAGED_LABEL: "1", OWNER_LABEL: _owner()}
    c = client().containers.create(
        image,
        command=argv,
        environment=env,
        volumes={SOCKET: {"bind": SOCKET, "mode": "rw"}, str(shared): {"bind": str(shared)}},
        # Found and removed by cleanup_leftovers if this test process dies mid-run.
        labels=labels,
        **create,
    )
    try:
        c.start()
        status = c.wait(timeout=timeout)
        logs = c.logs(stdout=True, stderr=True).decode()
    finally:
        c.remove(force=True)
    return int(status["StatusCode"]), logs
