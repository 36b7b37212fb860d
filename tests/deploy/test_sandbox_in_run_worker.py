"""A Docker sandbox started from inside a run worker container (deploy/docker), for real.

Pins the bug of issue 11 item 1: the run worker (a container of the project image, given the
host's Engine socket) asked the host's engine to bind its own Python runtime by path
(``/opt/hangar``), which the engine looks for on the host: "bind source path does not exist".
The run worker is started as ``DockerRunLauncher`` starts one: the project image, the socket,
the shared directory at the same path as on the host, ``HANGAR_HOME`` and ``TMPDIR`` in it.
The project image is built once per recipe (a second run is a cache hit: no build).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from hangar_dagster.environment.project_image import build_project_image
from hangar_dagster.trials.sandbox.docker import (
    MANAGED_LABEL,
    OWNER_LABEL,
    _owner,
    cleanup_leftovers,
    client,
)
from tests.agent_clis import cache_dir
from tests.deploy.conftest import REPO, SOCKET, TAG, run_in_worker

pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("docker")]


# Runs in the run worker: hangar's own Docker backend, set up from the run worker's settings.
SNIPPET = r"""
import json, sys
from hangar_dagster.settings import Settings
from hangar_dagster.trials.sandbox import SandboxRequest, SandboxUnavailable, get_sandbox

settings = Settings.from_env()
wd = settings.paths.work / "wd"
wd.mkdir(parents=True)
(wd / "hello.txt").write_text("from the workdir\n")
sandbox = get_sandbox("docker", runtime=settings.sandbox_runtime)
# A login shell: the image's /etc/profile must be hangar's (PATH kept, so `python` is found).
script = "python -c 'import sys; print(sys.prefix)'; cat hello.txt; echo PATH=$PATH"
try:
    res = sandbox.run(SandboxRequest(
        argv=["/bin/sh", "-lc", script], workdir=wd,
        env={"PATH": "/opt/hangar/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}, timeout_s=60,
    ))
    print(json.dumps({"exit": res.exit_code, "out": res.stdout, "err": res.stderr}))
except SandboxUnavailable as err:
    print(json.dumps({"unavailable": str(err)}))
"""


def run_worker(image: str, shared: Path, **env: str) -> dict[str, Any]:
    """Run SNIPPET in a container started as DockerRunLauncher starts a run worker."""
    shared_env = {"HANGAR_HOME": str(shared / "home"), "TMPDIR": str(shared / "tmp")}
    (shared / "tmp").mkdir(parents=True, exist_ok=True)
    status, logs = run_in_worker(
        image,
        shared,
        ["python", "-c", SNIPPET],
        {**shared_env, "HANGAR_SANDBOX_IMAGE": image, **env},
    )
    assert status == 0, logs
    return dict(json.loads(logs.strip().splitlines()[-1]))


def test_a_sandbox_started_from_a_run_worker_finds_the_runtime_in_its_image(
    project_image: str, tmp_path: Path
) -> None:
    # The default, image: the project image sets HANGAR_SANDBOX_RUNTIME=image for its processes.
    result = run_worker(project_image, tmp_path)
    assert result.get("exit") == 0, result
    assert result["out"].splitlines() == [
        "/opt/hangar",  # the image's interpreter, nothing bound from a host path
        "from the workdir",  # the workdir on the shared mount, bound through the host's engine
        "PATH=/opt/hangar/bin:/usr/bin:/bin",  # hangar's login profile, from the image
    ]


def test_with_the_runtime_bound_from_the_host_the_engine_misses_it(
    project_image: str, tmp_path: Path
) -> None:
    # What the backend did before HANGAR_SANDBOX_RUNTIME: bind /opt/hangar, which only the
    # run worker has; the host's engine refuses it.
    result = run_worker(project_image, tmp_path, HANGAR_SANDBOX_RUNTIME="host")
    assert "bind source path does not exist: /opt/hangar" in result.get("unavailable", ""), result


def test_a_second_build_with_the_same_recipe_is_a_cache_hit(project_image: str) -> None:
    again = build_project_image(
        client(), source=REPO, wheels_cache=cache_dir() / "project-wheels", tag=TAG
    )
    assert (again.cached, again.image_id) == (True, project_image)


# Runs in the run worker: a sandbox that outlives it (the worker is killed while it runs).
LONG_SANDBOX = r"""
from hangar_dagster.settings import Settings
from hangar_dagster.trials.sandbox import SandboxRequest, get_sandbox

settings = Settings.from_env()
wd = settings.paths.work / "wd"
wd.mkdir(parents=True)
get_sandbox("docker", runtime=settings.sandbox_runtime).run(SandboxRequest(
    argv=["/bin/sh", "-c", "sleep 600"], workdir=wd, env={"PATH": "/usr/bin:/bin"}, timeout_s=600,
))
"""


def worker_container(image: str, shared: Path, script: str) -> Any:
    """A container made (not started) as DockerRunLauncher makes a run worker, running ``script``."""
    (shared / "tmp").mkdir(parents=True, exist_ok=True)
    return client().containers.create(
        image,
        command=["python", "-c", script],
        environment={
            "HANGAR_HOME": str(shared / "home"),
            "TMPDIR": str(shared / "tmp"),
            "HANGAR_SANDBOX_IMAGE": image,
        },
        volumes={SOCKET: {"bind": SOCKET, "mode": "rw"}, str(shared): {"bind": str(shared)}},
        # Found and removed by cleanup_leftovers if this test process dies mid-run.
        labels={MANAGED_LABEL: "1", OWNER_LABEL: _owner()},
    )


def test_the_sandbox_of_a_killed_run_worker_is_removed_by_the_next_cleanup(
    project_image: str, tmp_path: Path
) -> None:
    # The gap docs/operations.md named: the owner label held the worker container's hostname
    # and a pid inside it, so no other process (the next run worker, the host) could tell
    # the owner gone, and a killed worker's sandbox ran on. Now the owner is the container.
    worker = worker_container(project_image, tmp_path, LONG_SANDBOX)
    try:
        worker.start()
        owned = {"label": [f"{MANAGED_LABEL}=1"]}
        sandbox = None
        deadline = time.monotonic() + 120
        while sandbox is None and time.monotonic() < deadline:
            for c in client().api.containers(filters=owned):
                if c["Labels"].get(OWNER_LABEL, "").startswith(f"container:{worker.id}:"):
                    sandbox = c["Id"]
            time.sleep(0.5)
        assert sandbox is not None, worker.logs().decode()
        cleanup_leftovers()  # its worker runs: left alone
        assert client().api.inspect_container(sandbox)["State"]["Running"]
        worker.kill()  # as the chaos of a node does: nothing in the worker runs any more
        worker.wait(timeout=60)
        cleanup_leftovers()
        assert sandbox not in [c["Id"] for c in client().api.containers(all=True)]
    finally:
        worker.remove(force=True)
