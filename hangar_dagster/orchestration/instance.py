"""The Dagster home the CLI and ``hangar ui`` share: prepared by them, never by loading definitions."""

from __future__ import annotations

import os
from pathlib import Path

from hangar_dagster.settings import DAGSTER_HOME_VAR, Settings
from hangar_dagster.util.fs import write_atomic

SHIPPED_YAML = Path(__file__).parent / "dagster.yaml"
STORAGES_MADE = ".storages-made"  # in the Dagster home: its storages exist


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
    if not cfg.exists():  # processes seeding it at once each write the same whole file
        write_atomic(cfg, SHIPPED_YAML.read_text())
    _make_storages(home)
    return home


def _make_storages(home: Path) -> None:
    """Create the instance's storages once, one process at a time.

    An instance's first open creates and stamps its storages; two processes doing that at once
    on a fresh home break it ("table jobs already exists", or two alembic heads): e.g. `hangar
    ui` and `hangar experiment run` started together. The marker makes later opens free.
    Only the embedded SQLite storage: a server's (Postgres) creates its tables in transactions
    of its own, and the CLI must not need it reachable to prepare the home.
    """
    if _made(home) or not _sqlite(home):
        return
    import fcntl

    import dagster as dg

    with (home / ".storages.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if _made(home):  # another process made them while this one waited
            return
        with dg.DagsterInstance.from_config(str(home)):
            pass
        (home / STORAGES_MADE).write_text("the Dagster storages of this home were made (hangar)\n")


def _made(home: Path) -> bool:
    """Whether the storages were made: the marker, and the run storage it vouches for."""
    return (home / STORAGES_MADE).exists() and (home / "history" / "runs.db").exists()


def _sqlite(home: Path) -> bool:
    """Whether the home's dagster.yaml keeps the instance in SQLite files under it (Dagster's
    default: no storage named, or ``storage: sqlite``). An unreadable file: not ours to judge."""
    import yaml

    try:
        cfg = yaml.safe_load((home / "dagster.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return False
    if not isinstance(cfg, dict):
        return False
    if any(k in cfg for k in ("run_storage", "event_log_storage", "schedule_storage")):
        return False
    storage = cfg.get("storage")
    return storage is None or (isinstance(storage, dict) and set(storage) == {"sqlite"})
