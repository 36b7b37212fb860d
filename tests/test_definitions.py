"""The Dagster definitions load, empty or with experiments, and the driver sensor picks the next stage."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import dagster as dg

from hangar_dagster.config import paths
from hangar_dagster.definitions import build_definitions
from hangar_dagster.sensors import DAEMON_MARKER, decide
from hangar_dagster.submit import submit
from hangar_dagster.window import parse_window


def test_definitions_load_with_no_experiments(hangar_home: Path) -> None:
    defs = build_definitions()
    assert list(defs.resolve_all_asset_keys()) == []
    assert (hangar_home / "dagster" / "dagster.yaml").is_file()


def test_definitions_build_one_group_per_experiment(example_dir: Path, hangar_home: Path) -> None:
    a = submit(example_dir / "experiment.yaml", paths())
    b = submit(example_dir / "experiment.yaml", paths())
    defs = build_definitions()
    # What the webserver does on load: every job, op and asset name must be unique.
    dg.Definitions.validate_loadable(defs)
    keys = {tuple(k.path) for k in defs.resolve_all_asset_keys()}
    for exp in (a, b):
        assert {
            (exp.experiment_id, s)
            for s in ("spec", "pin_sets", "base_checks", "trials", "grades", "index")
        } <= keys
        job = defs.resolve_job_def(f"{exp.experiment_id}__trials_job")
        assert job.tags["hangar/stage"] == "trials"
    trials_def = defs.resolve_assets_def(dg.AssetKey([a.experiment_id, "trials"]))
    assert trials_def.partitions_def is not None
    assert len(trials_def.partitions_def.get_partition_keys()) == 18
    assert defs.resolve_sensor_def("experiment_driver") is not None


def test_driver_requests_the_first_stage_only_for_daemon_experiments(
    example_dir: Path, hangar_home: Path
) -> None:
    waited = submit(example_dir / "experiment.yaml", paths())
    queued = submit(example_dir / "experiment.yaml", paths())
    (paths().experiment_dir(queued.experiment_id) / DAEMON_MARKER).touch()
    with dg.instance_for_test() as instance:
        requests = decide(
            instance, paths(), parse_window("always"), dt.datetime.now(dt.UTC)
        ).requests
    assert [r.job_name for r in requests] == [f"{queued.experiment_id}__spec_job"]
    assert requests[0].run_key == f"{queued.experiment_id}:spec:1"
    assert waited.experiment_id not in requests[0].job_name
