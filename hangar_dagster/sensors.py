"""Sensors: the daemon-side driver that walks submitted experiments through their stages."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dagster as dg

from hangar_dagster.assets.experiment import STAGES, TAG_EXPERIMENT, TAG_STAGE, job_name
from hangar_dagster.config import HangarPaths
from hangar_dagster.runner import stage_tags
from hangar_dagster.submit import stored_experiments

DAEMON_MARKER = "drive-by-daemon"  # written by `hangar experiment run` without --wait


def next_stage_requests(
    instance: dg.DagsterInstance, paths: HangarPaths
) -> Iterator[dg.RunRequest]:
    """For each daemon-driven experiment, the next stage whose predecessors all succeeded."""
    for exp in stored_experiments(paths):
        if not (paths.experiment_dir(exp.experiment_id) / DAEMON_MARKER).exists():
            continue
        runs = instance.get_runs(dg.RunsFilter(tags={TAG_EXPERIMENT: exp.experiment_id}))
        latest: dict[str, dg.DagsterRun] = {}
        for run in runs:  # newest first
            latest.setdefault(run.tags.get(TAG_STAGE, ""), run)
        for stage in STAGES:
            stage_run = latest.get(stage)
            if stage_run is None:
                yield dg.RunRequest(
                    run_key=f"{exp.experiment_id}:{stage}",
                    job_name=job_name(exp, stage),
                    tags=stage_tags(exp, stage),
                )
                break
            if stage_run.status != dg.DagsterRunStatus.SUCCESS:
                break  # still running, or failed: a person looks before anything else starts


def build_experiment_driver(
    jobs: list[dg.UnresolvedAssetJobDefinition], home: str
) -> dg.SensorDefinition:
    @dg.sensor(
        jobs=jobs, minimum_interval_seconds=10, default_status=dg.DefaultSensorStatus.RUNNING
    )
    def experiment_driver(context: dg.SensorEvaluationContext) -> Iterator[dg.RunRequest]:
        for request in next_stage_requests(context.instance, HangarPaths(Path(home))):
            if (
                request.job_name
                and context.repository_def
                and context.repository_def.has_job(request.job_name)
            ):
                yield request
            else:  # submitted after this code location loaded: it runs once the location reloads
                context.log.info(f"{request.job_name} is not loaded yet; reload the code location")

    return experiment_driver
