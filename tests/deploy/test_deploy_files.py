"""deploy/docker's files load against Dagster's own schemas (the deployment itself: docs/operations.md).

Pins the bug the issue names: launcher YAML in the docs that no test ever loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit

DOCKER = Path(__file__).resolve().parents[2] / "deploy" / "docker"


def test_deploy_instance_yaml_validates_against_dagsters_instance_schema(monkeypatch) -> None:
    from dagster._core.instance.config import dagster_instance_config

    monkeypatch.setenv("HANGAR_PG_URL", "postgresql+psycopg2://hangar@postgres:5432/dagster")
    monkeypatch.setenv("HANGAR_DEPLOY_NETWORK", "hangar_default")
    config, _ = dagster_instance_config(str(DOCKER))  # raises on a schema error
    assert config["run_launcher"]["class"] == "HangarDockerRunLauncher"
    assert "postgres" in config["storage"]


def test_the_deployments_run_queue_dequeues_every_second_beside_its_concurrency_block() -> None:
    # Dagster refuses some run_coordinator config beside `concurrency: runs:`; the dequeue
    # interval must load through the real coordinator, not only pass the schema.
    from dagster._config import process_config
    from dagster._core.run_coordinator import QueuedRunCoordinator

    coordinator = yaml.safe_load((DOCKER / "dagster.yaml").read_text())["run_coordinator"]
    result = process_config(QueuedRunCoordinator.config_type(), coordinator["config"])
    assert result.success, result.errors
    queue = QueuedRunCoordinator.from_config_value(None, result.value)  # type: ignore[arg-type]
    assert queue.dequeue_interval_seconds == 1
    # Dagster's default (5 s) is what each stage run used to wait (docs/performance.md).
    assert QueuedRunCoordinator().dequeue_interval_seconds == 5


def test_deploy_run_launcher_config_is_accepted_by_dagster_docker(monkeypatch) -> None:
    from dagster._config import process_config
    from dagster_docker import DockerRunLauncher

    monkeypatch.setenv("HANGAR_DEPLOY_NETWORK", "hangar_default")
    raw = yaml.safe_load((DOCKER / "dagster.yaml").read_text())["run_launcher"]["config"]
    result = process_config(DockerRunLauncher.config_type(), raw)
    assert result.success, result.errors
    # The run worker's env must carry what a stage run reads to find the shared store.
    assert {"HANGAR_HOME", "HANGAR_STORE", "HANGAR_STORE_CATALOG"} <= set(raw["env_vars"])


def test_compose_services_share_one_image_and_the_same_host_path() -> None:
    compose = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "user_code", "webserver", "daemon"} <= set(services)
    for name in ("user_code", "webserver", "daemon"):
        vols = services[name]["volumes"]
        # Same path inside and outside: sandboxes are bind-mounted through the host's engine.
        assert "${HANGAR_SHARED}:${HANGAR_SHARED}" in vols, name


def test_run_workers_carry_the_compose_project_labels_so_down_removes_them(monkeypatch) -> None:
    # The bug: run workers DockerRunLauncher starts carry no compose label, so `docker-compose
    # down --remove-orphans` leaves them. dagster.yaml cannot set it (no env substitution inside
    # container_kwargs); the code server's container context does, merged with the launcher's.
    # The same holds for the shared directory's mount: a run worker without it could not load
    # the experiment's job ("Could not load job definition", found by the end-to-end test).
    from dagster_docker.container_context import DockerContainerContext

    monkeypatch.setenv("HANGAR_DEPLOY_NETWORK", "hangar_default")
    env = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())["services"]["user_code"][
        "environment"
    ]
    raw = (
        env["DAGSTER_CONTAINER_CONTEXT"]
        .replace("${COMPOSE_PROJECT_NAME}", "hangar")
        .replace("${HANGAR_SHARED}", "/srv/hangar")
    )
    launcher = yaml.safe_load((DOCKER / "dagster.yaml").read_text())["run_launcher"]["config"]
    merged = DockerContainerContext(container_kwargs=launcher.get("container_kwargs", {})).merge(
        DockerContainerContext.create_from_config(json.loads(raw))
    )
    assert merged.container_kwargs["labels"] == {
        "com.docker.compose.project": "hangar",
        "com.docker.compose.oneoff": "False",  # compose v1 lists only these as orphans
    }
    # The shared directory at its host path, and the Engine socket for the sandboxes.
    assert sorted(merged.container_kwargs["volumes"]) == [
        "/srv/hangar:/srv/hangar",
        "/var/run/docker.sock:/var/run/docker.sock",
    ]
    # The launcher sets no volumes of its own: the shallow merge would drop one of the two.
    assert "volumes" not in launcher.get("container_kwargs", {})
    # And the run worker gets what its sandboxes need to run from the project image.
    assert {"HANGAR_SANDBOX_RUNTIME", "HANGAR_SANDBOX_IMAGE", "TMPDIR"} <= set(launcher["env_vars"])


def test_the_eval_queue_settings_reach_every_service_and_run_worker() -> None:
    # Found by the end-to-end test: without them a run worker kept the default 20:00-00:15
    # window whatever the operator set, and no trial started outside it.
    compose = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
    launcher = yaml.safe_load((DOCKER / "dagster.yaml").read_text())["run_launcher"]["config"]
    queue_vars = {"HANGAR_EVAL_WINDOW", "HANGAR_EVAL_TZ", "HANGAR_EVAL_TPM_BUDGET"}
    assert queue_vars <= set(launcher["env_vars"])
    for name in ("user_code", "webserver", "daemon"):
        assert queue_vars <= set(compose["services"][name]["environment"]), name
