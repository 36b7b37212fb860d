"""Software-defined assets: one group per experiment, built by ``build_experiment_assets``."""

from hangar_dagster.assets.experiment import build_experiment_assets

__all__ = ["build_experiment_assets"]
