"""The Dagster home the CLI and ``hangar ui`` share: prepared by them, never by loading definitions."""

from __future__ import annotations

import os
from pathlib import Path

from hangar_dagster.settings import DAGSTER_HOME_VAR, Settings

SHIPPED_YAML = Path(__file__).parent / "dagster.yaml"


def ensure_dagster_home(settings: Settings) -> Path:
    """Point ``DAGSTER_HOME`` at ``settings.dagster_home`` and seed its dagster.yaml once.

    The CLI and the webserver must share one instance, so the CLI commands that touch
    Dagster (and ``hangar ui``, for the ``dagster dev`` it starts) call this first. It sets
    this process's environment because ``DagsterInstance.get()`` and the processes it starts
    read ``DAGSTER_HOME`` from there.
    """
    home = settings.dagster_home
    home.mkdir(parents=True, exist_ok=True)
    os.environ[DAGSTER_HOME_VAR] = str(home)
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        tmp = cfg.with_suffix(".tmp")
        tmp.write_text(SHIPPED_YAML.read_text())
        tmp.replace(cfg)
    return home
