"""Driving an experiment through its stages as real Dagster runs.

``stage_tags`` says which partitions a stage's run covers (all of them, in one
run); ``run_stages`` executes the stages in order in this process against the
shared instance (``hangar experiment run --wait``); the ``experiment_driver``
sensor launches the same runs through the daemon instead (no ``--wait``).
"""

from __future__ import annotations

import dagster as dg
from dagster._core.definitions.reconstruct import ReconstructableRepository

from hangar_dagster.assets.experiment import STAGES, job_name, partitions
from hangar_dagster.plan import ResolvedExperiment

RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"
DEFINITIONS_MODULE = "hangar_dagster.definitions"
# The CLI shows trial progress at INFO; step-level DEBUG events stay in the UI's run log.
QUIET = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}


def stage_tags(exp: ResolvedExperiment, stage: str) -> dict[str, str]:
    variants_def, tasks_def, trials_def = partitions(exp)
    by_stage = {"pin_sets": variants_def, "base_checks": tasks_def, "trials": trials_def}
    part = by_stage.get(stage)
    if part is None:
        return {}
    keys = part.get_partition_keys()
    return {RANGE_START: keys[0], RANGE_END: keys[-1]}


class StageFailed(RuntimeError):
    def __init__(self, stage: str, run_id: str):
        super().__init__(
            f"stage {stage} failed in Dagster run {run_id}; `hangar ui` shows its logs"
        )
        self.stage = stage
        self.run_id = run_id


def run_stages(
    exp: ResolvedExperiment, instance: dg.DagsterInstance, stages: tuple[str, ...] = STAGES
) -> list[str]:
    """Execute each stage's job in order in this process; returns the run ids."""
    repo = ReconstructableRepository.for_module(DEFINITIONS_MODULE, "defs")
    run_ids = []
    for stage in stages:
        job = repo.get_reconstructable_job(job_name(exp, stage))
        result = dg.execute_job(
            job, instance, run_config=QUIET, tags=stage_tags(exp, stage), raise_on_error=False
        )
        run_ids.append(result.run_id)
        if not result.success:
            raise StageFailed(stage, result.run_id)
    return run_ids
