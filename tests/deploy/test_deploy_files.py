"""deploy/docker's files load against Dagster's own schemas (the deployment itself: docs/operations.md).

Pins the bug the issue names: launcher YAML in the docs that no test ever loaded.
"""

from __future__ import annotations

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
    assert config["run_launcher"]["class"] == "DockerRunLauncher"
    assert "postgres" in config["storage"]


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
