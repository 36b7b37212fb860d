"""Where state lives, and every operator setting: the one module that reads hangar's environment.

Everything hangar writes sits under one directory, ``HANGAR_HOME`` (default
``.hangar/`` in the working directory), so a fresh checkout starts clean and
``rm -rf .hangar`` is a full reset. ``Settings.from_env`` reads every operator
variable (the names below; docs/operations.md has the table) into one frozen
object; the CLI commands, the Dagster resource and the sensors' ticks build it
once and pass it down. tests/test_settings_source.py fails when another module
reads a ``HANGAR_`` variable itself (the in-sandbox programs excepted).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hangar_dagster.queue.budget import Caps
    from hangar_dagster.queue.window import EvalWindow
    from hangar_dagster.trials.sandbox import SandboxRuntime

HOME_VAR = "HANGAR_HOME"
DAGSTER_HOME_VAR = "DAGSTER_HOME"
WINDOW_VAR = "HANGAR_EVAL_WINDOW"
TZ_VAR = "HANGAR_EVAL_TZ"
TPM_BUDGET_VAR = "HANGAR_EVAL_TPM_BUDGET"
RETRIES_VAR = "HANGAR_TRIAL_INFRA_RETRIES"
BREAKER_VAR = "HANGAR_OUTAGE_BREAKER_STREAK"
RUN_PARTITIONS_VAR = "HANGAR_RUN_PARTITIONS"
TEAM_CAP_VAR = "HANGAR_EVAL_BUDGET_USD_MONTH"
AUTHOR_CAP_VAR = "HANGAR_EVAL_AUTHOR_CAP_USD_MONTH"
ALIASES_VAR = "HANGAR_MODEL_ALIASES"
ANTHROPIC_BASE_URL_VAR = "HANGAR_ANTHROPIC_BASE_URL"
OPENAI_BASE_URL_VAR = "HANGAR_OPENAI_BASE_URL"
ANTHROPIC_KEY_VAR = "ANTHROPIC_API_KEY"
OPENAI_KEY_VAR = "OPENAI_API_KEY"
AGENT_BIN_DIR_VAR = "HANGAR_AGENT_BIN_DIR"
HARNESS_REPO_VAR = "HANGAR_HARNESS_REPO"
WEBSERVER_URL_VAR = "HANGAR_WEBSERVER_URL"
PACKAGE_MIRROR_URL_VAR = "HANGAR_PACKAGE_MIRROR_URL"
RUNNER_DIR_VAR = "HANGAR_RUNNER_DIR"
STORE_VAR = "HANGAR_STORE"
STORE_CATALOG_VAR = "HANGAR_STORE_CATALOG"
STORE_DATA_VAR = "HANGAR_STORE_DATA"
SANDBOX_RUNTIME_VAR = "HANGAR_SANDBOX_RUNTIME"
SANDBOX_IMAGE_VAR = "HANGAR_SANDBOX_IMAGE"
# The Kubernetes sandbox (environment.sandbox: k8s; docs/operations.md, "Kubernetes").
K8S_NAMESPACE_VAR = "HANGAR_K8S_NAMESPACE"
K8S_SHARED_CLAIM_VAR = "HANGAR_K8S_SHARED_CLAIM"
K8S_SHARED_PATH_VAR = "HANGAR_K8S_SHARED_PATH"
K8S_POD_NAME_VAR = "HANGAR_K8S_POD_NAME"
# Not hangar's: where this process's temporary (and the Docker sandbox's control) dirs go.
TMPDIR_VAR = "TMPDIR"
SANDBOX_RUNTIMES = ("host", "image")


@dataclass(frozen=True)
class StoreConfig:
    """Which results store backend holds the records (results/store.py; docs/data.md).

    ``embedded`` (the default): Parquet files plus one DuckDB file under ``HANGAR_HOME``.
    ``ducklake``: a DuckLake whose catalog is the Postgres database ``catalog`` (a libpq
    connection string) and whose Parquet files live under ``data`` (a directory every worker
    and analyst mounts; empty: ``HANGAR_HOME/lake``).
    """

    mode: str = "embedded"
    catalog: str = field(default="", repr=False)  # may carry a password
    data: str = ""


@dataclass(frozen=True)
class HangarPaths:
    """The directory layout under ``HANGAR_HOME`` (see docs/data.md)."""

    home: Path
    store: StoreConfig = StoreConfig()

    @property
    def duckdb(self) -> Path:
        return self.home / "hangar.duckdb"

    @property
    def parquet(self) -> Path:
        return self.home / "parquet"

    @property
    def tally(self) -> Path:
        """The embedded store's tally of trial attempts for the start check (results/tally.py)."""
        return self.home / "tally.sqlite"

    @property
    def pending(self) -> Path:
        """The embedded store's journal: one marker per record written to Parquet whose DuckDB
        row is not yet confirmed (results/store.py); reads list this folder, not parquet/."""
        return self.home / "pending"

    @property
    def lake(self) -> Path:
        """The DuckLake store's data files (``HANGAR_STORE_DATA``, default ``home/lake``)."""
        return Path(self.store.data) if self.store.data else self.home / "lake"

    @property
    def experiments(self) -> Path:
        """One folder per submitted experiment: the resolved spec and its driver log."""
        return self.home / "experiments"

    @property
    def artifacts(self) -> Path:
        """Per trial attempt: manifest.json, trace.json, patch.diff, agent and grader output."""
        return self.home / "artifacts"

    @property
    def work(self) -> Path:
        """Scratch space for clones and sandboxes; safe to delete between runs."""
        return self.home / "work"

    @property
    def ui_lock(self) -> Path:
        """Held by the one `hangar ui` (webserver and daemon) running on this home (cli/ui.py)."""
        return self.home / "ui.lock"

    @property
    def builds(self) -> Path:
        """Environment builds, one complete directory per build digest (environment/build.py)."""
        return self.home / "builds"

    @property
    def nightly(self) -> Path:
        """Registered nightly schedules, one folder each: the spec's copy and its nights
        (experiment/nightly.py)."""
        return self.home / "nightly"

    @property
    def shadows(self) -> Path:
        """One folder per registered shadow policy: its policy, cursor and merges (shadow/)."""
        return self.home / "shadows"

    def experiment_dir(self, experiment_id: str) -> Path:
        return self.experiments / experiment_id

    def trial_artifacts(self, experiment_id: str, trial_key: str, attempt: int) -> Path:
        return self.artifacts / experiment_id / trial_key.replace("/", "__") / f"attempt-{attempt}"


def paths() -> HangarPaths:
    """This process's paths: an entry point's shortcut for ``Settings.from_env().paths``."""
    return Settings.from_env().paths


def _text(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name, "").strip()


@dataclass(frozen=True)
class Settings:
    """Every operator variable, read once from one environment (docs/operations.md, the table).

    Entry points build it (``Settings.from_env()``: a CLI command, the definitions, a run's
    resource, a sensor's tick) and pass it down; domain code takes it or the values it needs
    and never reads the environment itself. Values an operator can get wrong (the window, the
    counts, the caps) stay as written and are parsed by the property that uses them, so a bad
    value fails where it matters, naming its variable, as it did before there was one object.
    """

    home: Path
    dagster_home: Path
    eval_window: str = ""  # empty: the default window
    eval_tz: str = ""
    eval_tpm_budget: str = ""
    trial_infra_retries: str = ""
    outage_breaker_streak: str = ""
    run_partitions_limit: str = ""  # at most this many partitions per trials run (500)
    eval_budget_usd_month: str = ""
    eval_author_cap_usd_month: str = ""
    model_aliases: frozenset[str] = frozenset()
    anthropic_base_url: str | None = None
    openai_base_url: str | None = None
    # The provider keys: never shown (repr) and given to a Dagster run only as EnvVar.
    anthropic_api_key: str | None = field(default=None, repr=False)
    openai_api_key: str | None = field(default=None, repr=False)
    agent_bin_dir: str | None = None
    harness_repo: str | None = None
    webserver_url: str | None = None
    # An existing package index to use as the mirror; unset: hangar starts its own (mirror.py).
    package_mirror_url: str | None = None
    runner_dir: str | None = None  # where the runner environment is cached (default: builds/)
    # The results store backend (HANGAR_STORE, HANGAR_STORE_CATALOG, HANGAR_STORE_DATA).
    store_mode: str = "embedded"
    store_catalog: str = field(default="", repr=False)  # may carry a password
    store_data: str = ""
    # Where the Docker sandbox's runtime comes from (host: bound from here; image: the sandbox
    # image carries it) and the sandbox image then (docs/operations.md, "Beyond one machine").
    sandbox_runtime_mode: str = ""
    sandbox_image: str | None = None
    tmpdir: str | None = None
    k8s_namespace: str = ""
    k8s_shared_claim: str = ""
    k8s_shared_path: str = ""
    k8s_pod_name: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings of ``environ`` (default: this process's environment, read now)."""
        env = os.environ if environ is None else environ
        home = Path(env.get(HOME_VAR, ".hangar")).resolve()
        explicit = env.get(DAGSTER_HOME_VAR)
        return cls(
            home=home,
            dagster_home=Path(explicit).resolve() if explicit else home / "dagster",
            eval_window=_text(env, WINDOW_VAR),
            eval_tz=_text(env, TZ_VAR),
            eval_tpm_budget=_text(env, TPM_BUDGET_VAR),
            trial_infra_retries=_text(env, RETRIES_VAR),
            outage_breaker_streak=_text(env, BREAKER_VAR),
            run_partitions_limit=_text(env, RUN_PARTITIONS_VAR),
            eval_budget_usd_month=_text(env, TEAM_CAP_VAR),
            eval_author_cap_usd_month=_text(env, AUTHOR_CAP_VAR),
            model_aliases=frozenset(
                a.lower() for a in re.split(r"[\s,]+", env.get(ALIASES_VAR, "")) if a
            ),
            anthropic_base_url=env.get(ANTHROPIC_BASE_URL_VAR) or None,
            openai_base_url=env.get(OPENAI_BASE_URL_VAR) or None,
            anthropic_api_key=env.get(ANTHROPIC_KEY_VAR) or None,
            openai_api_key=env.get(OPENAI_KEY_VAR) or None,
            agent_bin_dir=env.get(AGENT_BIN_DIR_VAR) or None,
            harness_repo=env.get(HARNESS_REPO_VAR) or None,
            webserver_url=env.get(WEBSERVER_URL_VAR) or None,
            package_mirror_url=_text(env, PACKAGE_MIRROR_URL_VAR) or None,
            runner_dir=_text(env, RUNNER_DIR_VAR) or None,
            store_mode=_text(env, STORE_VAR) or "embedded",
            store_catalog=_text(env, STORE_CATALOG_VAR),
            store_data=_text(env, STORE_DATA_VAR),
            sandbox_runtime_mode=_text(env, SANDBOX_RUNTIME_VAR),
            sandbox_image=_text(env, SANDBOX_IMAGE_VAR) or None,
            tmpdir=_text(env, TMPDIR_VAR) or None,
            k8s_namespace=_text(env, K8S_NAMESPACE_VAR),
            k8s_shared_claim=_text(env, K8S_SHARED_CLAIM_VAR),
            k8s_shared_path=_text(env, K8S_SHARED_PATH_VAR),
            k8s_pod_name=_text(env, K8S_POD_NAME_VAR),
        )

    @property
    def paths(self) -> HangarPaths:
        return HangarPaths(self.home, self.store)

    @property
    def store(self) -> StoreConfig:
        """The results store backend; ``Store(settings.paths)`` builds it."""
        return StoreConfig(self.store_mode, self.store_catalog, self.store_data)

    @property
    def sandbox_runtime(self) -> SandboxRuntime:
        """What container sandboxes bind of hangar's runtime; ValueError naming a bad value."""
        from hangar_dagster.trials.sandbox import K8sPlacement, SandboxRuntime

        mode = self.sandbox_runtime_mode or "host"
        if mode not in SANDBOX_RUNTIMES:
            raise ValueError(
                f"{SANDBOX_RUNTIME_VAR}={mode!r}: must be 'host' (bind this process's Python "
                "and hangar into each sandbox) or 'image' (the sandbox image carries them: "
                "hangar runs in the project image, deploy/docker)"
            )
        k8s = K8sPlacement(
            namespace=self.k8s_namespace,
            shared_claim=self.k8s_shared_claim,
            shared_path=Path(self.k8s_shared_path) if self.k8s_shared_path else None,
            pod_name=self.k8s_pod_name,
        )
        if mode == "host":
            return SandboxRuntime(image=self.sandbox_image, k8s=k8s)
        shared = (self.home, *((Path(self.tmpdir).resolve(),) if self.tmpdir else ()))
        return SandboxRuntime(in_image=True, image=self.sandbox_image, shared=shared, k8s=k8s)

    # The queue's modules own their values' rules and error messages; they import this module
    # (the store does too), so they are imported here when a value is asked for.

    @property
    def window(self) -> EvalWindow:
        """The eval window (``HANGAR_EVAL_WINDOW`` in ``HANGAR_EVAL_TZ``); WindowError if bad."""
        from hangar_dagster.queue.window import DEFAULT_TZ, DEFAULT_WINDOW, parse_window

        return parse_window(self.eval_window or DEFAULT_WINDOW, self.eval_tz or DEFAULT_TZ)

    @property
    def infra_retries(self) -> int:
        """Retries one trial key may have after infra errors (2); RetryConfigError if bad."""
        from hangar_dagster.queue.retries import DEFAULT_INFRA_RETRIES, parse_count

        return parse_count(RETRIES_VAR, self.trial_infra_retries, DEFAULT_INFRA_RETRIES, 0)

    @property
    def breaker_streak(self) -> int:
        """Systemic failures in a row that trip the outage breaker (5); RetryConfigError if bad."""
        from hangar_dagster.queue.retries import DEFAULT_BREAKER_STREAK, parse_count

        return parse_count(BREAKER_VAR, self.outage_breaker_streak, DEFAULT_BREAKER_STREAK, 1)

    @property
    def run_partitions(self) -> int:
        """At most this many partitions in one trials run (500; docs/architecture.md, "Runs over
        pending work"); RetryConfigError naming the variable if bad."""
        from hangar_dagster.queue.partitions import RUN_PARTITIONS
        from hangar_dagster.queue.retries import parse_count

        return parse_count(RUN_PARTITIONS_VAR, self.run_partitions_limit, RUN_PARTITIONS, 1)

    @property
    def tpm_budget(self) -> int | None:
        """Provider tokens per minute trial starts are paced to (None: no limit); ValueError if bad."""
        from hangar_dagster.queue.starts import parse_tpm_budget

        return parse_tpm_budget(self.eval_tpm_budget)

    @property
    def caps(self) -> Caps:
        """The monthly eval budgets; BudgetConfigError naming a bad variable."""
        from hangar_dagster.queue.budget import parse_caps

        return parse_caps(self.eval_budget_usd_month, self.eval_author_cap_usd_month)

    def provider_base_url(self, provider: str) -> str | None:
        """``HANGAR_<PROVIDER>_BASE_URL`` as set (None: the provider's own)."""
        return {"anthropic": self.anthropic_base_url, "openai": self.openai_base_url}.get(provider)

    def provider_key(self, provider: str) -> str | None:
        return {"anthropic": self.anthropic_api_key, "openai": self.openai_api_key}.get(provider)
