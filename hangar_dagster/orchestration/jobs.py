"""Jobs: one per experiment stage, each one run over all of the stage's partitions."""

from __future__ import annotations

import dagster as dg

from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.orchestration.stages import STAGES, job_name, job_tags


def build_experiment_jobs(
    exp: ResolvedExperiment, assets: list[dg.AssetsDefinition]
) -> list[dg.UnresolvedAssetJobDefinition]:
    """One job per stage; each stage is one run over all its partitions (in-process: no per-step process)."""
    by_name = {a.key.path[-1]: a for a in assets}
    # Trials and grades share a run: both are partitioned alike, and a grade follows its trial.
    selections = {stage: [by_name[stage]] for stage in STAGES}
    selections["trials"].append(by_name["grades"])
    if exp.regrade_of is not None:
        # A regrade's trials are stored copies that never run (experiment/regrade.py): its
        # trials run only grades them. Each grade's metadata links the run that made its trial.
        selections["trials"] = [by_name["grades"]]
    return [
        dg.define_asset_job(
            job_name(exp, stage),
            selection=sel,
            executor_def=dg.in_process_executor,
            tags=job_tags(exp, stage),
        )
        for stage, sel in selections.items()
    ]
