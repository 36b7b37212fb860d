"""Jobs: one per experiment stage, each one run over all of the stage's partitions."""

from __future__ import annotations

import dagster as dg

from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.orchestration.stages import job_name, job_tags, stage_assets


def build_experiment_jobs(
    exp: ResolvedExperiment, assets: list[dg.AssetsDefinition]
) -> list[dg.UnresolvedAssetJobDefinition]:
    """One job per stage (``stages.stage_assets``); each stage is one run over all its
    partitions (in-process: no per-step process)."""
    by_name = {a.key.path[-1]: a for a in assets}
    selections = {
        stage: [by_name[name] for name in names] for stage, names in stage_assets(exp).items()
    }
    return [
        dg.define_asset_job(
            job_name(exp, stage),
            selection=sel,
            executor_def=dg.in_process_executor,
            tags=job_tags(exp, stage),
        )
        for stage, sel in selections.items()
    ]
