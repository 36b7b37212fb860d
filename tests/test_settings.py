"""One settings object: read once from an environment, defaults as before, keys never shown."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from pathlib import Path

import dagster as dg
import pytest

from hangar_dagster import settings as settings_module
from hangar_dagster.orchestration.resources import HangarResource
from hangar_dagster.queue.budget import BudgetConfigError
from hangar_dagster.queue.retries import RetryConfigError
from hangar_dagster.queue.window import WindowError
from hangar_dagster.settings import Settings

pytestmark = pytest.mark.unit

KEY = "sk-ant-" + "k" * 24
DOCS = Path(__file__).parents[1] / "docs" / "operations.md"


def test_an_empty_environment_gives_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    s = Settings.from_env({})
    assert s.home == tmp_path.resolve() / ".hangar"
    assert s.dagster_home == s.home / "dagster"
    assert s.window.describe() == "20:00-00:15 America/New_York"
    assert (s.infra_retries, s.breaker_streak, s.tpm_budget) == (2, 5, None)
    assert (s.caps.team_usd, s.caps.author_usd) == (1500.0, 400.0)
    assert s.model_aliases == frozenset()
    assert (s.provider_base_url("anthropic"), s.provider_key("openai")) == (None, None)
    assert (s.agent_bin_dir, s.harness_repo, s.webserver_url) == (None, None, None)


def test_every_variable_lands_in_its_field(tmp_path: Path) -> None:
    s = Settings.from_env(
        {
            "HANGAR_HOME": str(tmp_path / "h"),
            "DAGSTER_HOME": str(tmp_path / "d"),
            "HANGAR_EVAL_WINDOW": "01:00-02:00",
            "HANGAR_EVAL_TZ": "UTC",
            "HANGAR_EVAL_TPM_BUDGET": "40000",
            "HANGAR_TRIAL_INFRA_RETRIES": "0",
            "HANGAR_OUTAGE_BREAKER_STREAK": "3",
            "HANGAR_EVAL_BUDGET_USD_MONTH": "10",
            "HANGAR_EVAL_AUTHOR_CAP_USD_MONTH": "2.5",
            "HANGAR_MODEL_ALIASES": "Fast, team-x  other",
            "HANGAR_ANTHROPIC_BASE_URL": "http://127.0.0.1:1",
            "HANGAR_OPENAI_BASE_URL": "http://127.0.0.1:2",
            "ANTHROPIC_API_KEY": KEY,
            "OPENAI_API_KEY": "sk-" + "o" * 24,
            "HANGAR_AGENT_BIN_DIR": "/opt/agents/bin",
            "HANGAR_HARNESS_REPO": "/srv/harnesses",
            "HANGAR_WEBSERVER_URL": "http://127.0.0.1:3000",
        }
    )
    assert (s.home, s.dagster_home) == (tmp_path / "h", tmp_path / "d")
    assert s.window.describe() == "01:00-02:00 UTC"
    assert (s.infra_retries, s.breaker_streak, s.tpm_budget) == (0, 3, 40000)
    assert (s.caps.team_usd, s.caps.author_usd) == (10.0, 2.5)
    assert s.model_aliases == {"fast", "team-x", "other"}
    assert s.provider_base_url("anthropic") == "http://127.0.0.1:1"
    assert s.provider_base_url("openai") == "http://127.0.0.1:2"
    assert s.provider_key("anthropic") == KEY
    assert (s.agent_bin_dir, s.harness_repo) == ("/opt/agents/bin", "/srv/harnesses")
    assert s.webserver_url == "http://127.0.0.1:3000"
    assert KEY not in repr(s)  # the keys are fields, never shown


def test_a_bad_value_fails_where_it_is_used_naming_its_variable() -> None:
    s = Settings.from_env(
        {
            "HANGAR_EVAL_WINDOW": "soon",
            "HANGAR_TRIAL_INFRA_RETRIES": "two",
            "HANGAR_EVAL_BUDGET_USD_MONTH": "lots",
            "HANGAR_EVAL_TPM_BUDGET": "0",
        }
    )  # reading never fails: a command that does not use a value is not stopped by it
    with pytest.raises(WindowError, match="HANGAR_EVAL_WINDOW='soon'"):
        _ = s.window
    with pytest.raises(RetryConfigError, match="HANGAR_TRIAL_INFRA_RETRIES='two'"):
        _ = s.infra_retries
    with pytest.raises(BudgetConfigError, match="HANGAR_EVAL_BUDGET_USD_MONTH='lots'"):
        _ = s.caps
    with pytest.raises(ValueError, match="HANGAR_EVAL_TPM_BUDGET='0'"):
        _ = s.tpm_budget
    assert s.breaker_streak == 5


def test_the_sandbox_runtime_setting_names_its_variable_and_the_shared_dirs(
    tmp_path: Path,
) -> None:
    default = Settings.from_env({"HANGAR_HOME": str(tmp_path)}).sandbox_runtime
    assert (default.in_image, default.image, default.shared) == (False, None, ())
    s = Settings.from_env(
        {
            "HANGAR_HOME": str(tmp_path / "h"),
            "TMPDIR": str(tmp_path / "t"),
            "HANGAR_SANDBOX_RUNTIME": "image",
            "HANGAR_SANDBOX_IMAGE": "hangar-dagster:local",
        }
    )
    runtime = s.sandbox_runtime
    assert (runtime.in_image, runtime.image) == (True, "hangar-dagster:local")
    assert runtime.shared == (tmp_path / "h", tmp_path / "t")
    # Without TMPDIR the control dirs would land in the container's own /tmp: not shared.
    no_tmp = Settings.from_env({"HANGAR_HOME": str(tmp_path), "HANGAR_SANDBOX_RUNTIME": "image"})
    assert no_tmp.sandbox_runtime.shared == (tmp_path,)
    with pytest.raises(ValueError, match="HANGAR_SANDBOX_RUNTIME='container'"):
        _ = Settings.from_env({"HANGAR_SANDBOX_RUNTIME": "container"}).sandbox_runtime


@pytest.mark.integration  # a real dg.materialize
def test_the_resource_carries_the_settings_and_the_keys_only_as_env_vars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    settings = Settings.from_env(
        {
            "HANGAR_HOME": str(tmp_path),
            "HANGAR_EVAL_WINDOW": "always",
            "HANGAR_OUTAGE_BREAKER_STREAK": "7",
            "HANGAR_MODEL_ALIASES": "fast",
            "ANTHROPIC_API_KEY": KEY,
        }
    )
    resource = HangarResource.from_settings(settings)
    assert isinstance(resource.anthropic_api_key, dg.EnvVar)
    assert resource.anthropic_api_key.env_var_name == "ANTHROPIC_API_KEY"
    assert resource.openai_api_key is None  # unset where the definitions load: stays unset
    assert KEY not in repr(resource)  # what the UI's resource page is built from

    @dg.asset
    def seen(hangar: HangarResource) -> dict[str, object]:
        s = hangar.settings()
        return {
            "home": s.home,
            "window": s.window.describe(),
            "streak": s.breaker_streak,
            "aliases": s.model_aliases,
            "key": s.provider_key("anthropic"),
        }

    result = dg.materialize([seen], resources={"hangar": resource})
    assert result.output_for_node("seen") == {
        "home": tmp_path,
        "window": "always",
        "streak": 7,
        "aliases": {"fast"},
        "key": KEY,  # resolved in the run, from the run's environment
    }


def test_the_resource_gives_back_the_settings_it_was_built_from(tmp_path: Path) -> None:
    # A schedule's cron comes from the settings the definitions load with, its tick's
    # decisions from the resource built from them: both must be the same values.
    settings = Settings.from_env(
        {
            "HANGAR_HOME": str(tmp_path),
            "HANGAR_EVAL_WINDOW": "20:00-00:15",
            "HANGAR_EVAL_TZ": "UTC",
            "HANGAR_EVAL_TPM_BUDGET": "9",
            "HANGAR_MODEL_ALIASES": "b a",
            "HANGAR_AGENT_BIN_DIR": "/bin",
        }
    )
    back = HangarResource.from_settings(settings).settings()
    assert back == settings
    assert back.window.is_open(dt.datetime(2027, 1, 1, 21, tzinfo=dt.UTC))


def test_every_setting_a_run_reads_reaches_it_through_the_resource(tmp_path: Path) -> None:
    # Regression: HANGAR_PACKAGE_MIRROR_URL was read by the CLI but dropped by the resource, so
    # trials in a Dagster run started hangar's own mirror instead of the operator's.
    cli_only = {"harness_repo", "webserver_url"}  # read by CLI commands, never by a run
    settings = Settings.from_env(
        {
            "HANGAR_HOME": str(tmp_path),
            "HANGAR_PACKAGE_MIRROR_URL": "http://mirror.example:3141/root/pypi/+simple/",
            "HANGAR_AGENT_BIN_DIR": "/bin",
        }
    )
    resource_fields = set(HangarResource.model_fields)
    for f in dataclasses.fields(Settings):
        if f.name in cli_only:
            continue
        assert f.name in resource_fields, f"Settings.{f.name} does not reach a run's resource"
    back = HangarResource.from_settings(settings).settings()
    assert back.package_mirror_url == settings.package_mirror_url


def test_the_operations_table_names_every_variable() -> None:
    table = DOCS.read_text().split("## Settings", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", table))
    names = {
        value
        for name, value in vars(settings_module).items()
        if name.endswith("_VAR") and isinstance(value, str)
    }
    assert names - documented == set()
