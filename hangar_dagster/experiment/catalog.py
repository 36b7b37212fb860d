"""Which stored experiments are archived and which are active (what the definitions load).

An archived experiment keeps everything it wrote (its rows, artifacts, resolved spec and
Dagster history) but leaves the loaded definitions, so they stay as small as the set of
experiments still in use. The archived state is one file next to ``resolved.json``:
``experiments/<id>/archived.json``, written atomically by ``hangar experiment archive``.
Choosing the active experiments is then one ``stat`` per stored experiment and a parse
of only the active ``resolved.json`` files, with no DuckDB (the code location loads
without touching the store). ``state`` decides an experiment's state;
docs/architecture.md has the why.
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
from pathlib import Path

from pydantic import BaseModel

from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.experiment.submit import RESOLVED, load_resolved
from hangar_dagster.settings import HangarPaths
from hangar_dagster.util.fs import fsync

ARCHIVED = "archived.json"
# In an experiment's folder: the daemon drives it (written by `hangar experiment run` without
# --wait, by a nightly schedule's submission and by the shadow sensor; orchestration/sensors.py
# reads it).
DAEMON_MARKER = "drive-by-daemon"


class Archived(BaseModel):
    """The content of ``archived.json``: who archived the experiment, when, and what it left."""

    experiment_id: str
    at: dt.datetime
    by: str
    forced: bool = False
    pending_trials: int = 0  # trials still pending when it was archived with --force


def marker(paths: HangarPaths, experiment_id: str) -> Path:
    return paths.experiment_dir(experiment_id) / ARCHIVED


def read_archived(paths: HangarPaths, experiment_id: str) -> Archived | None:
    path = marker(paths, experiment_id)
    try:
        return Archived.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None


def write_archived(paths: HangarPaths, record: Archived) -> None:
    """Write the marker atomically: a reader sees no file or the whole file, never half."""
    path = marker(paths, record.experiment_id)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".archived-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(record.model_dump_json(indent=2))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync(path.parent)


def remove_archived(paths: HangarPaths, experiment_id: str) -> bool:
    """Drop the marker; False when the experiment was not archived."""
    path = marker(paths, experiment_id)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    fsync(path.parent)
    return True


def stored_ids(paths: HangarPaths) -> list[str]:
    """The id of every submitted experiment (a directory with its resolved.json)."""
    if not paths.experiments.is_dir():
        return []
    return sorted(d.name for d in paths.experiments.iterdir() if (d / RESOLVED).is_file())


def archived_ids(paths: HangarPaths) -> set[str]:
    return {i for i in stored_ids(paths) if marker(paths, i).is_file()}


def active_experiments(paths: HangarPaths) -> list[ResolvedExperiment]:
    """Every stored experiment that is not archived, oldest first: what the definitions load.

    Only these resolved.json files are parsed; an archived one costs a ``stat``.
    """
    found = [load_resolved(paths, i) for i in stored_ids(paths) if not marker(paths, i).is_file()]
    return sorted(found, key=lambda e: e.submitted_at)
