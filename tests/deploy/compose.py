"""deploy/docker brought up and down for real: the deployment test's and the benchmark's helper.

One compose project per caller, named uniquely (other engineers use the same Docker engine), its
images tagged under that name for its life (a build in another checkout may move the shared tag
meanwhile), and everything it made removed at the end: ``down -v --remove-orphans`` (the run
workers carry the project's labels, docker-compose.yml), then the tags.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.deploy.conftest import REPO, TAG

DOCKER = REPO / "deploy" / "docker"
PROJECT_LABEL = "com.docker.compose.project"
RUN_ID_LABEL = "dagster/run_id"  # DockerRunLauncher's, on every run worker
POSTGRES_TAG = "hangar-postgres:test"


def wheels_cache() -> Path:
    from tests.agent_clis import cache_dir

    return cache_dir() / "project-wheels"


def build_images(log: Any = None) -> tuple[str, str]:
    """(project image id, postgres image id), each built or found cached by its recipe."""
    from hangar_dagster.environment.project_image import build_postgres_image, build_project_image
    from hangar_dagster.trials.sandbox.docker import client

    say = log or (lambda line: print(line, file=sys.stderr))
    project = build_project_image(
        client(), source=REPO, wheels_cache=wheels_cache(), tag=TAG, log=say
    )
    postgres = build_postgres_image(client(), source=REPO, tag=POSTGRES_TAG, log=say)
    return project.image_id, postgres.image_id


@dataclass
class Deployment:
    """A running deploy/docker project and the host CLI's environment pointed at it."""

    project: str
    shared: Path  # HANGAR_SHARED: the same path on the host and in every container
    image: str  # the project image's id (specs pin it as environment.image)
    postgres_image: str
    env: dict[str, str] = field(default_factory=dict)  # what compose substitutes
    pg_port: int = 0
    web_port: int = 0
    run_workers: set[str] = field(default_factory=set)  # every one seen, for the final check

    @property
    def home(self) -> Path:
        return self.shared / "home"

    @property
    def web_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def compose(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = ["docker-compose", "-f", str(DOCKER / "docker-compose.yml"), "-p", self.project]
        proc = subprocess.run(
            [*argv, *args], env=self.env, capture_output=True, text=True, timeout=300
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"docker-compose {' '.join(args)}: {proc.stdout}{proc.stderr}")
        return proc

    def _port(self, service: str, port: int) -> int:
        out = self.compose("port", service, str(port)).stdout.strip()
        return int(out.rsplit(":", 1)[1])

    def host_env(self, **extra: str) -> dict[str, str]:
        """The host CLI's environment: the deployment's instance (its dagster.yaml, Postgres on
        the published port) and its store (DuckLake, catalog in the same Postgres)."""
        dagster_home = self.shared.parent / "host-dagster"
        dagster_home.mkdir(exist_ok=True)
        shutil.copy2(DOCKER / "dagster.yaml", dagster_home / "dagster.yaml")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HANGAR_", "DAGSTER_"))}
        return env | {
            "HANGAR_HOME": str(self.home),
            "DAGSTER_HOME": str(dagster_home),
            "TMPDIR": str(self.shared / "tmp"),
            "HANGAR_PG_URL": f"postgresql+psycopg2://hangar@127.0.0.1:{self.pg_port}/dagster",
            "HANGAR_DEPLOY_NETWORK": f"{self.project}_default",
            "HANGAR_STORE": "ducklake",
            "HANGAR_STORE_CATALOG": f"host=127.0.0.1 port={self.pg_port} dbname=lake user=hangar",
            "HANGAR_EVAL_WINDOW": self.env["HANGAR_EVAL_WINDOW"],
            "HANGAR_WEBSERVER_URL": self.web_url,
            **extra,
        }

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(
            self.web_url + "/graphql", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
        assert "errors" not in answer, answer
        return dict(answer["data"])

    def location_loaded(self) -> bool:
        query = """{ workspaceOrError { ... on Workspace { locationEntries {
            name loadStatus locationOrLoadError { __typename } } } } }"""
        try:
            entries = self.graphql(query)["workspaceOrError"]["locationEntries"]
        except (OSError, AssertionError, KeyError):
            return False
        return any(
            e["loadStatus"] == "LOADED"
            and e["locationOrLoadError"]["__typename"] == "RepositoryLocation"
            for e in entries
        )

    def note_run_workers(self) -> set[str]:
        """The run worker containers of this project (running or not); remembered."""
        from hangar_dagster.trials.sandbox.docker import client

        found = client().api.containers(
            all=True, filters={"label": [f"{PROJECT_LABEL}={self.project}", RUN_ID_LABEL]}
        )
        ids = {c["Id"] for c in found}
        self.run_workers |= ids
        return ids

    def logs(self) -> str:
        """The services' last lines, Dagster's beta/preview warnings (three lines each) left out."""
        out = self.compose("logs", "--no-color", "--tail", "200", check=False).stdout
        kept, skip = [], 0
        for line in out.splitlines():
            if "Warning:" in line:
                skip = 3
            if skip:
                skip -= 1
                continue
            kept.append(line)
        return "\n".join(kept)[-8000:]

    def down(self) -> None:
        """Everything of this project removed, run workers included; then its image tags."""
        from hangar_dagster.trials.sandbox.docker import client

        self.note_run_workers()
        self.compose("down", "-v", "--remove-orphans", "-t", "5", check=False)
        for tag in (self.env.get("HANGAR_IMAGE"), self.env.get("HANGAR_POSTGRES_IMAGE")):
            if tag:
                try:  # an untag: the image stays while another tag names it
                    client().api.remove_image(tag, noprune=True)
                except Exception:  # noqa: BLE001  already gone, or in use elsewhere: keep it
                    pass

    def leftovers(self) -> dict[str, list[str]]:
        """What of this project is still on the engine (nothing, after ``down``)."""
        from hangar_dagster.trials.sandbox.docker import client

        api = client().api
        label = {"label": f"{PROJECT_LABEL}={self.project}"}
        alive = {c["Id"] for c in api.containers(all=True)}
        return {
            "containers": [c["Names"][0] for c in api.containers(all=True, filters=label)],
            "run_workers": sorted(self.run_workers & alive),
            "networks": [n["Name"] for n in api.networks(filters=label)],
            "volumes": [v["Name"] for v in api.volumes(filters=label).get("Volumes") or []],
        }


def up(shared: Path, *, window: str = "always", timeout_s: float = 300) -> Deployment:
    """Bring deploy/docker up as a fresh compose project on ``shared``; wait for its code location.

    Raises (after bringing it down again) if the webserver does not show the location loaded.
    """
    image, postgres = build_images()
    from hangar_dagster.trials.sandbox.docker import client

    project = f"hangartest{uuid.uuid4().hex[:10]}"  # compose v1: lowercase letters and digits
    for tag_of, repo in ((image, "hangar-dagster"), (postgres, "hangar-postgres")):
        client().api.tag(tag_of, repo, project)
    (shared / "home").mkdir(parents=True, exist_ok=True)
    (shared / "tmp").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HANGAR_", "DAGSTER_"))}
    env |= {
        "COMPOSE_PROJECT_NAME": project,
        "HANGAR_SHARED": str(shared),
        "HANGAR_IMAGE": f"hangar-dagster:{project}",
        "HANGAR_POSTGRES_IMAGE": f"hangar-postgres:{project}",
        "HANGAR_EVAL_WINDOW": window,
    }
    dep = Deployment(project, shared, image, postgres, env)
    try:
        dep.compose("up", "-d")
        dep.pg_port, dep.web_port = dep._port("postgres", 5432), dep._port("webserver", 3000)
        deadline = time.monotonic() + timeout_s
        while not dep.location_loaded():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the code location did not load:\n{dep.logs()}")
            time.sleep(1)
    except BaseException:
        dep.down()
        raise
    return dep
