"""The archive marker: written whole, read back, and the only thing active_experiments checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from hangar_dagster.experiment.catalog import (
    ARCHIVED,
    Archived,
    active_experiments,
    archived_ids,
    read_archived,
    remove_archived,
    stored_ids,
    write_archived,
)
from hangar_dagster.experiment.submit import RESOLVED, submit
from hangar_dagster.results.records import utcnow
from hangar_dagster.settings import Settings, paths

pytestmark = pytest.mark.unit


def archive(experiment_id: str) -> Archived:
    record = Archived(experiment_id=experiment_id, at=utcnow(), by="tester")
    write_archived(paths(), record)
    return record


def test_archived_experiments_leave_the_active_list_and_come_back(
    example_dir: Path, hangar_home: Path
) -> None:
    a = submit(example_dir / "experiment.yaml", Settings.from_env())
    b = submit(example_dir / "experiment.yaml", Settings.from_env())
    assert [e.experiment_id for e in active_experiments(paths())] == [
        a.experiment_id,
        b.experiment_id,
    ]

    written = archive(a.experiment_id)
    assert read_archived(paths(), a.experiment_id) == written
    assert read_archived(paths(), b.experiment_id) is None
    assert [e.experiment_id for e in active_experiments(paths())] == [b.experiment_id]
    assert archived_ids(paths()) == {a.experiment_id}
    assert sorted(stored_ids(paths())) == sorted([a.experiment_id, b.experiment_id])
    # nothing but the marker is written: the marker's temp file is gone
    assert sorted(p.name for p in paths().experiment_dir(a.experiment_id).iterdir()) == sorted(
        [RESOLVED, ARCHIVED]
    )

    assert remove_archived(paths(), a.experiment_id) is True
    assert remove_archived(paths(), a.experiment_id) is False  # twice: nothing to undo
    assert {e.experiment_id for e in active_experiments(paths())} == {
        a.experiment_id,
        b.experiment_id,
    }


def test_an_archived_resolved_json_is_never_parsed(example_dir: Path, hangar_home: Path) -> None:
    """Loading the definitions must not read the archived experiments' specs (docs/performance.md)."""
    a = submit(example_dir / "experiment.yaml", Settings.from_env())
    b = submit(example_dir / "experiment.yaml", Settings.from_env())
    archive(a.experiment_id)
    resolved = paths().experiment_dir(a.experiment_id) / RESOLVED
    resolved.write_text("{ not json")  # parsing it would raise
    assert [e.experiment_id for e in active_experiments(paths())] == [b.experiment_id]
    remove_archived(paths(), a.experiment_id)
    with pytest.raises(ValueError):
        active_experiments(paths())


def test_no_experiments_directory_means_none(hangar_home: Path) -> None:
    assert active_experiments(paths()) == []
    assert stored_ids(paths()) == []
