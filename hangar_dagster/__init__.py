"""hangar_dagster: declarative experiments on coding agents, orchestrated by Dagster.

The public API is small; everything else is an implementation detail of the
``hangar`` CLI and the Dagster definitions (``hangar_dagster.orchestration.definitions``).
"""

from hangar_dagster.experiment.spec import ExperimentSpec, SpecError, load_spec

__version__ = "0.1.0"
__all__ = ["ExperimentSpec", "SpecError", "__version__", "load_spec"]
