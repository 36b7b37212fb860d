"""Where state lives, and the environment variables that move it.

Everything hangar writes sits under one directory, ``HANGAR_HOME`` (default
``.hangar/`` in the working directory), so a fresh checkout starts clean and
``rm -rf .hangar`` is a full reset. This is the one module that maps
environment to paths; everything else asks it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HangarPaths:
    """The directory layout under ``HANGAR_HOME`` (see docs/data.md)."""

    home: Path

    @property
    def duckdb(self) -> Path:
        return self.home / "hangar.duckdb"

    @property
    def parquet(self) -> Path:
        return self.home / "parquet"

    @property
    def experiments(self) -> Path:
        """One folder per submitted experiment: the resolved spec and its driver log."""
        return self.home / "experiments"

    @property
    def artifacts(self) -> Path:
        """Per trial attempt: manifest.json, trace.json, patch.diff, agent and grader output."""
        return self.home / "artifacts"

    @property
    def work(self) -> Path:
        """Scratch space for clones and sandboxes; safe to delete between runs."""
        return self.home / "work"

    @property
    def dagster_home(self) -> Path:
        explicit = os.environ.get("DAGSTER_HOME")
        return Path(explicit).resolve() if explicit else self.home / "dagster"

    def experiment_dir(self, experiment_id: str) -> Path:
        return self.experiments / experiment_id

    def trial_artifacts(self, experiment_id: str, trial_key: str, attempt: int) -> Path:
        return self.artifacts / experiment_id / trial_key.replace("/", "__") / f"attempt-{attempt}"


def hangar_home() -> Path:
    return Path(os.environ.get("HANGAR_HOME", ".hangar")).resolve()


def paths() -> HangarPaths:
    return HangarPaths(hangar_home())


def ensure_dagster_home() -> Path:
    """Point ``DAGSTER_HOME`` at the hangar home's ``dagster/`` (unless set) and seed dagster.yaml.

    The CLI and the webserver must share one instance, so both call this before
    touching Dagster.
    """
    p = paths()
    home = p.dagster_home
    home.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(home)
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        shipped = Path(__file__).parent / "orchestration" / "dagster.yaml"
        tmp = cfg.with_suffix(".tmp")
        tmp.write_text(shipped.read_text())
        tmp.replace(cfg)
    return home
