"""Dagster resources: the one handle assets, sensors and schedules get on hangar's state and settings."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from hangar_dagster.queue.liveness import record_file, record_run_process
from hangar_dagster.results.store import Store
from hangar_dagster.settings import (
    ANTHROPIC_KEY_VAR,
    OPENAI_KEY_VAR,
    STORE_CATALOG_VAR,
    HangarPaths,
    Settings,
    StoreConfig,
)


class HangarResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """Where hangar keeps its state (``HANGAR_HOME``) and the operator's settings, as config.

    Built from ``Settings`` when the definitions load, so the UI's resource page shows the
    values a run uses; each run or tick builds its ``Settings`` once from them
    (``settings()``). The provider keys are ``dg.EnvVar`` references, resolved in the run's
    process and never shown; one unset where the definitions load stays unset (None).
    """

    home: str
    dagster_home: str = ""  # empty: $HANGAR_HOME/dagster
    eval_window: str = ""
    eval_tz: str = ""
    eval_tpm_budget: str = ""
    trial_infra_retries: str = ""
    outage_breaker_streak: str = ""
    run_partitions_limit: str = ""
    eval_budget_usd_month: str = ""
    eval_author_cap_usd_month: str = ""
    model_aliases: str = ""  # lower case, space separated
    anthropic_base_url: str | None = None
    openai_base_url: str | None = None
    anthropic_api_key: str | None = None  # an EnvVar (from_settings), never a plain value
    openai_api_key: str | None = None
    agent_bin_dir: str | None = None
    package_mirror_url: str | None = None
    runner_dir: str | None = None  # where the runner environment is cached (docs/grading.md)
    store_mode: str = "embedded"  # the results store backend (docs/data.md)
    store_catalog: str | None = None  # an EnvVar (it may hold a password)
    store_data: str = ""
    # The Docker sandbox's runtime source (docs/operations.md, "Beyond one machine: Docker").
    sandbox_runtime_mode: str = ""
    sandbox_image: str | None = None
    tmpdir: str | None = None
    # The Kubernetes sandbox's placement (docs/operations.md, "Kubernetes").
    k8s_namespace: str = ""
    k8s_shared_claim: str = ""
    k8s_shared_path: str = ""
    k8s_pod_name: str = ""
    # A webserver started elsewhere, asked to reload when a tick submits (HANGAR_WEBSERVER_URL).
    webserver_url: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> HangarResource:
        return cls(
            home=str(settings.home),
            dagster_home=str(settings.dagster_home),
            eval_window=settings.eval_window,
            eval_tz=settings.eval_tz,
            eval_tpm_budget=settings.eval_tpm_budget,
            trial_infra_retries=settings.trial_infra_retries,
            outage_breaker_streak=settings.outage_breaker_streak,
            run_partitions_limit=settings.run_partitions_limit,
            eval_budget_usd_month=settings.eval_budget_usd_month,
            eval_author_cap_usd_month=settings.eval_author_cap_usd_month,
            model_aliases=" ".join(sorted(settings.model_aliases)),
            anthropic_base_url=settings.anthropic_base_url,
            openai_base_url=settings.openai_base_url,
            anthropic_api_key=dg.EnvVar(ANTHROPIC_KEY_VAR) if settings.anthropic_api_key else None,
            openai_api_key=dg.EnvVar(OPENAI_KEY_VAR) if settings.openai_api_key else None,
            agent_bin_dir=settings.agent_bin_dir,
            package_mirror_url=settings.package_mirror_url,
            runner_dir=settings.runner_dir,
            store_mode=settings.store.mode,
            store_catalog=dg.EnvVar(STORE_CATALOG_VAR) if settings.store.catalog else None,
            store_data=settings.store.data,
            sandbox_runtime_mode=settings.sandbox_runtime_mode,
            sandbox_image=settings.sandbox_image,
            tmpdir=settings.tmpdir,
            k8s_namespace=settings.k8s_namespace,
            k8s_shared_claim=settings.k8s_shared_claim,
            k8s_shared_path=settings.k8s_shared_path,
            k8s_pod_name=settings.k8s_pod_name,
            webserver_url=settings.webserver_url,
        )

    def settings(self) -> Settings:
        """The settings of this run or tick: call once and pass the object down."""
        home = Path(self.home)
        return Settings(
            home=home,
            dagster_home=Path(self.dagster_home) if self.dagster_home else home / "dagster",
            eval_window=self.eval_window,
            eval_tz=self.eval_tz,
            eval_tpm_budget=self.eval_tpm_budget,
            trial_infra_retries=self.trial_infra_retries,
            outage_breaker_streak=self.outage_breaker_streak,
            run_partitions_limit=self.run_partitions_limit,
            eval_budget_usd_month=self.eval_budget_usd_month,
            eval_author_cap_usd_month=self.eval_author_cap_usd_month,
            model_aliases=frozenset(self.model_aliases.split()),
            anthropic_base_url=self.anthropic_base_url,
            openai_base_url=self.openai_base_url,
            anthropic_api_key=self.anthropic_api_key,
            openai_api_key=self.openai_api_key,
            agent_bin_dir=self.agent_bin_dir,
            package_mirror_url=self.package_mirror_url,
            runner_dir=self.runner_dir,
            store_mode=self.store_mode,
            store_catalog=self.store_catalog or "",
            store_data=self.store_data,
            sandbox_runtime_mode=self.sandbox_runtime_mode,
            sandbox_image=self.sandbox_image,
            tmpdir=self.tmpdir,
            k8s_namespace=self.k8s_namespace,
            k8s_shared_claim=self.k8s_shared_claim,
            k8s_shared_path=self.k8s_shared_path,
            k8s_pod_name=self.k8s_pod_name,
            webserver_url=self.webserver_url,
        )

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # A stage run records its process, so a run left in flight by a dead worker can be told
        # from a slow one (queue/liveness.py; the default run launcher has no health check).
        if context.run is not None:  # None outside a run (a sensor tick)
            record_run_process(self.paths, context.run.run_id)

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if context.run is not None:
            record_file(self.paths, context.run.run_id).unlink(missing_ok=True)

    @property
    def paths(self) -> HangarPaths:
        return HangarPaths(Path(self.home), self._store_config)

    @property
    def _store_config(self) -> StoreConfig:
        return StoreConfig(self.store_mode, self.store_catalog or "", self.store_data)

    def store(self) -> Store:
        return Store(self.paths)
