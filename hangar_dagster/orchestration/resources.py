"""Dagster resources: the one handle assets get on hangar's state."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from hangar_dagster.results.store import Store
from hangar_dagster.settings import HangarPaths


class HangarResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """Where hangar keeps its state (``HANGAR_HOME``); assets read and write through it."""

    home: str

    @property
    def paths(self) -> HangarPaths:
        return HangarPaths(Path(self.home))

    def store(self) -> Store:
        return Store(self.paths)
