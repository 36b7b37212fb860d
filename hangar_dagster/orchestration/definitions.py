"""The Dagster entry point: ``dagster dev -w workspace.yaml`` and the CLI both load ``defs``.

Definitions are a factory over stored experiments: every resolved spec under
``HANGAR_HOME/experiments/`` becomes one asset group with its stage jobs.
Project-wide rules (the resource, the driver sensor, the eval-window drain and
each experiment's window-opening schedule) are applied here, in one place.

Importing this module builds nothing: ``defs`` is a ``@dg.definitions`` function that
Dagster calls when it loads the code location, and it only reads (the settings, the stored
experiments). Preparing the Dagster home is the CLI's job (orchestration/instance.py).
"""

from __future__ import annotations

import dagster as dg

from hangar_dagster.experiment.catalog import active_experiments
from hangar_dagster.orchestration.assets import build_experiment_assets
from hangar_dagster.orchestration.checks import build_experiment_checks
from hangar_dagster.orchestration.jobs import build_experiment_jobs
from hangar_dagster.orchestration.resources import HangarResource
from hangar_dagster.orchestration.schedules import (
    build_drain_schedule,
    build_nightly_schedule,
    build_open_schedule,
)
from hangar_dagster.orchestration.sensors import (
    build_experiment_driver,
    build_shadow_sensor,
    drain_all,
)
from hangar_dagster.settings import Settings


def build_definitions(settings: Settings) -> dg.Definitions:
    p = settings.paths
    assets: list[dg.AssetsDefinition] = []
    checks: list[dg.AssetChecksDefinition] = []
    jobs: list[dg.UnresolvedAssetJobDefinition] = []
    window = settings.window
    schedules = build_drain_schedule(window, lambda context: drain_all(context.instance, p))
    schedules.append(build_nightly_schedule())  # reads the registered specs at each tick
    for exp in active_experiments(p):  # archived experiments stay out (catalog.py)
        group = build_experiment_assets(exp)
        assets += group
        checks += build_experiment_checks(exp, group)
        experiment_jobs = build_experiment_jobs(exp, group)
        jobs += experiment_jobs
        schedules += build_open_schedule(exp, experiment_jobs, window)
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=jobs,
        # The shadow sensor is always there: a policy registered later needs no reload.
        sensors=[*([build_experiment_driver(jobs)] if jobs else []), build_shadow_sensor()],
        schedules=schedules,
        resources={"hangar": HangarResource.from_settings(settings)},
    )


@dg.definitions
def defs() -> dg.Definitions:
    """What the code location loads: the definitions of this process's settings, read now."""
    return build_definitions(Settings.from_env())
