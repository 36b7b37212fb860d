"""Redaction: keys, tokens and the canary never reach a stored trace, artifact, export or the UI."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import dagster as dg
import pytest

from hangar_dagster.settings import HangarPaths
from hangar_dagster.trials.canary import MASK
from hangar_dagster.trials.redact import redact, secret_values
from tests.conftest import command_agent_spec, hangar, write_spec

pytestmark = pytest.mark.unit

CANARY = "HANGAR-CANARY-0123456789abcdef0123456789abcdef"
# Built here, not written whole, so no scanner takes the test file for a leak.
ANTHROPIC = "sk-ant-api03-" + "Qx7" * 14
OPENAI = "sk-proj-" + "Zr4" * 15
GITHUB = "ghp_" + "Hk2" * 12
GITHUB_PAT = "github_pat_" + "11AB" * 8
AWS = "AKIA" + "J3QX" * 4
BEARER = "eyJhbGciOi" + "Jm9" * 10
ENV_TOKEN = "svc-" + "7f3a" * 6
HOST_KEY = "host-only-credential-" + "93ab" * 4  # no known shape: found by its value


def test_each_credential_shape_is_replaced_and_the_text_around_it_kept() -> None:
    text = (
        f"anthropic {ANTHROPIC}\nopenai {OPENAI}\ngh {GITHUB} and {GITHUB_PAT}\n"
        f"aws {AWS}\nAuthorization: Bearer {BEARER}\n"
    )
    out = redact(text, None)
    for secret in (ANTHROPIC, OPENAI, GITHUB, GITHUB_PAT, AWS, BEARER):
        assert secret not in out
    assert out.splitlines() == [
        "anthropic [redacted:anthropic_key]",
        "openai [redacted:openai_key]",
        "gh [redacted:github_token] and [redacted:github_token]",
        "aws [redacted:aws_key]",
        "Authorization: Bearer [redacted:bearer]",
    ]


def test_values_of_secret_named_variables_are_redacted_in_env_dumps_and_json() -> None:
    dump = f"PATH=/usr/bin\nMY_SERVICE_TOKEN={ENV_TOKEN}\nMAX_TOKENS=409600000\n"
    assert redact(dump, None) == (
        "PATH=/usr/bin\nMY_SERVICE_TOKEN=[redacted:env_secret]\nMAX_TOKENS=409600000\n"
    )
    event = json.dumps({"env": {"DB_PASSWORD": ENV_TOKEN}, "trial_key": "v/t/1"})
    assert json.loads(redact(event, None)) == {
        "env": {"DB_PASSWORD": "[redacted:env_secret]"},
        "trial_key": "v/t/1",
    }


def test_secret_values_given_to_the_agent_are_found_by_value() -> None:
    env = {
        "API_BASE": "http://127.0.0.1:9999",
        "SERVICE_TOKEN": ENV_TOKEN,
        "X_KEY": "short",  # too short to be told from ordinary text
        "db_password": "correct horse battery",
    }
    secrets = secret_values(env)
    assert secrets == [ENV_TOKEN, "correct horse battery"]
    trace = {"events": [{"text": f"token is {ENV_TOKEN}"}], "said": "correct horse battery!"}
    assert redact(trace, None, secrets) == {
        "events": [{"text": "token is [redacted:secret]"}],
        "said": "[redacted:secret]!",
    }


def test_the_orchestrators_own_keys_are_found_by_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", HOST_KEY)
    monkeypatch.setenv("OPENAI_API_KEY", "")
    value = {HOST_KEY: [f"x{HOST_KEY}y", 3, None, True]}
    assert redact(value, None) == {"[redacted:secret]": ["x[redacted:secret]y", 3, None, True]}
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    assert redact(HOST_KEY, None) == HOST_KEY


def test_the_canary_is_masked_by_the_same_pass_and_a_second_pass_changes_nothing() -> None:
    text = f"{CANARY} {ANTHROPIC} MY_TOKEN={ENV_TOKEN} Bearer {BEARER}"
    once = redact(text, CANARY, [ENV_TOKEN])
    assert once == (
        f"{MASK} [redacted:anthropic_key] MY_TOKEN=[redacted:secret] Bearer [redacted:bearer]"
    )
    assert redact(once, CANARY, [ENV_TOKEN]) == once
    assert redact("ordinary text about a task-key and sk-learn", CANARY) == (
        "ordinary text about a task-key and sk-learn"
    )


def _scan(root: Path, secrets: list[str]) -> list[str]:
    """Files under ``root`` whose bytes hold any of ``secrets``."""
    return [
        f"{f}: {s[:12]}..."
        for f in sorted(root.rglob("*"))
        if f.is_file()
        for s in secrets
        if s.encode() in f.read_bytes()
    ]


@pytest.mark.slow
def test_an_agent_printing_keys_leaks_none_of_them(example_dir: Path, tmp_path: Path) -> None:
    secrets = [ANTHROPIC, OPENAI, GITHUB, GITHUB_PAT, AWS, BEARER, ENV_TOKEN, HOST_KEY]
    said = " ".join([*secrets[:5], f"Bearer {BEARER}", f"MY_SERVICE_TOKEN={ENV_TOKEN}", HOST_KEY])
    turn = json.dumps(
        # Reporting a key as its version also drifts: the drift column shows in the UI.
        {"type": "turn", "fingerprint": {"cli_version": ANTHROPIC}, "said": said}
    )
    command = (
        f"echo {shlex.quote(said)} && echo {shlex.quote(said)} > /out/RESULT.md && "
        f"printf '%s\\n' {shlex.quote(turn)} >> \"$HANGAR_TRACE_OUT\" && "
        f"echo {shlex.quote('# ' + HOST_KEY)} >> stats.py"
    )
    spec = command_agent_spec(example_dir, tmp_path, "keys", command)
    home = tmp_path / "home"
    env = {"ANTHROPIC_API_KEY": HOST_KEY, "OPENAI_API_KEY": ""}
    ran = hangar(
        "experiment", "run", str(write_spec(example_dir, spec)), "--wait", home=home, env=env
    )
    # The key reported as the CLI version drifts, and drift is never retried: the key ends
    # without a grade, so `run --wait` says incomplete (exit 3, docs/operations.md).
    assert ran.returncode == 3, ran.stdout + ran.stderr
    assert "drift is never retried" in " ".join((ran.stdout + ran.stderr).split()), ran.stderr
    got = hangar("experiment", "get", "keys", "--json", home=home, env=env)
    assert got.returncode == 0, got.stderr
    (row,) = json.loads(got.stdout)["trials"]
    assert row["infra_reason"] == "drift"
    out = tmp_path / "export"
    exported = hangar("experiment", "export", "keys", "-o", str(out), home=home, env=env)
    assert exported.returncode == 0, exported.stderr

    # Nowhere under HANGAR_HOME (artifacts, Parquet, DuckDB, the Dagster instance and its
    # event log and run logs), nor in the export, nor in what the CLI printed.
    # The one exception is the grader's input, patch.raw.diff: the agent's code as it wrote it
    # (a redacted copy would be other code), owner-only and never exported or shown.
    found = _scan(home, secrets)
    raw = [f for f in found if f.split(":")[0].endswith("/patch.raw.diff")]
    assert found == raw and raw, found
    (raw_file,) = {Path(f.split(":")[0]) for f in raw}
    assert raw_file.stat().st_mode & 0o777 == 0o600
    assert _scan(out, secrets) == []
    for printed in (ran.stdout, got.stdout):
        assert not [s for s in secrets if s in printed]
    # And what was redacted still shows where it was, so the test can tell it ran.
    art = HangarPaths(home).trial_artifacts(row["experiment_id"], row["trial_key"], 1)
    assert "[redacted:anthropic_key]" in (art / "agent.log").read_text()
    assert "[redacted:secret]" in (art / "RESULT.md").read_text()
    assert "[redacted:secret]" in (art / "patch.diff").read_text()
    trace = json.loads((art / "trace.json").read_text())
    assert trace["fingerprint"]["cli_version"] == "[redacted:anthropic_key]"
    os.environ["DAGSTER_HOME"] = str(home / "dagster")
    try:
        with dg.DagsterInstance.get() as instance:
            (mat,) = instance.fetch_materializations(
                dg.AssetKey([row["experiment_id"], "trials"]), limit=10
            ).records
            assert mat.asset_materialization is not None
            meta = {k: str(v.value) for k, v in mat.asset_materialization.metadata.items()}
    finally:
        del os.environ["DAGSTER_HOME"]
    assert meta["drift"] == "harness: cli_version '1' -> '[redacted:anthropic_key]'"
