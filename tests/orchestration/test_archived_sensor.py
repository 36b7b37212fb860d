"""The driver sensor leaves archived experiments alone, and takes them up again once unarchived."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import dagster as dg
import pytest

from hangar_dagster.experiment.catalog import (
    DAEMON_MARKER,
    Archived,
    remove_archived,
    write_archived,
)
from hangar_dagster.experiment.submit import submit
from hangar_dagster.orchestration.sensors import decide
from hangar_dagster.queue.window import parse_window
from hangar_dagster.results.records import utcnow
from hangar_dagster.settings import Settings, paths
from tests import factories as f

pytestmark = pytest.mark.integration


def test_the_driver_requests_nothing_for_an_archived_experiment(
    example_dir: Path, hangar_home: Path
) -> None:
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    (paths().experiment_dir(exp.experiment_id) / DAEMON_MARKER).touch()
    write_archived(paths(), Archived(experiment_id=exp.experiment_id, at=utcnow(), by="t"))
    now = dt.datetime.now(dt.UTC)
    with dg.instance_for_test() as instance:
        assert decide(instance, f.settings(parse_window("always")), now).requests == []
        remove_archived(paths(), exp.experiment_id)
        requests = decide(instance, f.settings(parse_window("always")), now).requests
    assert [r.job_name for r in requests] == [f"{exp.experiment_id}__pin_sets_job"]
