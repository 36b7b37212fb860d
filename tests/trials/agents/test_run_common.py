"""What the CLI adapters share: trace clipping, the ending error and the AgentRun."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest
import yaml

from hangar_dagster.environment.egress import EgressGrant
from hangar_dagster.standins import agent as standin
from hangar_dagster.trials.agents import (
    NO_BYTECODE_ENV,
    AgentContext,
    claude_code,
    codex,
    mini_swe,
    run_common,
)
from hangar_dagster.trials.model_proxy import ModelAccess
from hangar_dagster.trials.sandbox import Mount, SandboxResult
from tests.trials.agents.cli_locks import cli_context, freeze_cli_lock

pytestmark = pytest.mark.unit


def context(tmp_path: Path) -> AgentContext:
    agent = {"adapter": "command", "cli": "sh", "version": "1", "command": "true"}
    lock = freeze_cli_lock(tmp_path, "h", agent, "m")
    return cli_context(tmp_path, lock, tmp_path, "m", timeout_s=90, max_cost_usd=0.25)


def test_clip_keeps_short_values_and_cuts_long_text() -> None:
    assert run_common.clip("short") == "short"
    assert run_common.clip({"a": [1]}) == {"a": [1]}
    cut = run_common.clip("x" * (run_common.TEXT_CHARS + 7))
    assert cut == "x" * run_common.TEXT_CHARS + "... [7 characters cut]"
    big = {"k": "y" * run_common.TEXT_CHARS}
    assert run_common.clip(big).startswith('{"k": "yyy') and run_common.clip(big).endswith(
        f"[{len(json.dumps(big)) - run_common.TEXT_CHARS} characters cut]"
    )


def test_as_int_takes_only_integers() -> None:
    assert [run_common.as_int(v) for v in (3, 0, True, 2.0, "4", None)] == [3, 0, 0, 0, 0, 0]


def test_ending_error_takes_the_first_cause(tmp_path: Path) -> None:
    ctx = context(tmp_path)

    def error(
        result: SandboxResult,
        reported: str | None = None,
        no_result: bool = False,
        budget: bool = False,
    ) -> str | None:
        return run_common.ending_error(
            "Tool", ctx, result, budget_stopped=budget, reported=reported, no_result=no_result
        )

    crashed = SandboxResult(2, False, "", "first\nno model\n", 1.0)
    killed = SandboxResult(None, True, "", "late", 1.0)
    cancelled = SandboxResult(None, True, "", "", 1.0, cancelled=True)
    clean = SandboxResult(0, False, "", "", 1.0)
    assert error(killed, budget=True) == (
        "stopped: its cost passed trial_job_budget.max_cost_usd (0.25 USD)"
    )
    reported = run_common.ending_error(
        "Tool", ctx, crashed, budget_stopped=True, spend="reported cost"
    )
    assert reported == "stopped: its reported cost passed trial_job_budget.max_cost_usd (0.25 USD)"
    assert error(cancelled, reported="ended with x") == "Tool was cancelled"
    assert error(killed, reported="ended with x") == "Tool ran out of time (90s)"
    assert error(crashed, reported="ended with x") == "Tool ended with x"
    assert error(crashed) == "Tool exited with code 2: no model"
    assert error(SandboxResult(1, False, "", " \n", 1.0)) == "Tool exited with code 1"
    assert error(clean) is None
    assert error(clean, no_result=True) == "Tool exited with code 0"


def test_agent_run_keeps_the_output_tail_with_stderr() -> None:
    result = SandboxResult(1, False, "o" * run_common.TAIL_CHARS, "boom", 1.0)
    run = run_common.agent_run(
        result,
        events=[{"type": "turn"}],
        turns=1,
        tokens=(10, 2),
        cost_usd=0.5,
        fingerprint={"cli": "x"},
        error="Tool exited with code 1",
        budget_stopped=False,
    )
    assert (run.exit_code, run.timed_out, run.tokens_in, run.tokens_out) == (1, False, 10, 2)
    assert len(run.output_tail) == run_common.TAIL_CHARS
    assert run.output_tail.endswith("o\n--- stderr ---\nboom")
    assert (
        run_common.agent_run(
            SandboxResult(0, False, "out", "", 1.0),
            events=[],
            turns=0,
            tokens=(0, 0),
            cost_usd=0.0,
            fingerprint={},
            error=None,
            budget_stopped=False,
        ).output_tail
        == "out"
    )


def test_cli_request_runs_under_the_forwarder_with_the_trial_limits(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    access = ModelAccess("openai", "http://127.0.0.1:9", [Mount(tmp_path, "/sock")], {}, 9, "/s")
    install, scratch = Mount(tmp_path, "/opt/cli"), Mount(tmp_path, "/home", writable=True)
    request = run_common.cli_request(
        ctx, access, ["cli", "-p"], {"A": "1"}, [install], [scratch], stdin=b"x"
    )
    assert request.argv[-3:] == ["--", "cli", "-p"] and ["--pair", "9=/s"] == request.argv[3:5]
    assert [m.target for m in request.mounts] == ["/opt/cli", "/sock", "/home"]
    assert (request.workdir, request.env, request.stdin) == (ctx.workdir, {"A": "1"}, b"x")
    # The proxy's cancel (the trial's own, relayed, or the proxy giving up on the provider).
    assert (request.timeout_s, request.cancel) == (90, access.cancel)


def test_cli_request_adds_the_egress_grant_around_the_model_forwarder(tmp_path: Path) -> None:
    grant = EgressGrant(
        policy="allowlist",
        mounts=(Mount(tmp_path, "/hangar-egress"),),
        env={"http_proxy": "http://127.0.0.1:7", "A": "from-the-grant"},
        prefix=("egress-forwarder", "--"),
    )
    ctx = dataclasses.replace(context(tmp_path), egress=grant)
    access = ModelAccess("openai", "http://127.0.0.1:9", [Mount(tmp_path, "/sock")], {}, 9, "/s")
    request = run_common.cli_request(ctx, access, ["cli"], {"A": "1"}, [], [])
    # The grant's forwarder runs the model forwarder, which runs the CLI.
    assert request.argv[:2] == ["egress-forwarder", "--"] and request.argv[-2:] == ["--", "cli"]
    assert [m.target for m in request.mounts] == ["/sock", "/hangar-egress"]
    # The grant's variables win: an adapter cannot point the CLI past the proxy.
    assert request.env == {"A": "from-the-grant", "http_proxy": "http://127.0.0.1:7"}
    assert request.network is False


def test_reported_by_cli_names_what_the_cli_said() -> None:
    assert run_common.reported_by_cli(model="m", cli_version=None, tools=[]) == ["model"]
    assert run_common.reported_by_cli(tools=["a"], cli_version="1") == ["cli_version", "tools"]


def test_every_adapter_runs_python_without_bytecode_in_the_work_tree(tmp_path: Path) -> None:
    """The CLI adapters' and the stand-in's environments, even when the experiment's extras try
    to turn bytecode back on (the command adapter's own test runs Python in the sandbox)."""
    agent = {"adapter": "command", "cli": "sh", "version": "1", "command": "true"}
    lock = freeze_cli_lock(tmp_path, "h", agent, "m")
    extras = {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(tmp_path)}
    ctx = cli_context(tmp_path, lock, tmp_path, "m", env=extras)
    access = ModelAccess("openai", "http://127.0.0.1:9", [Mount(tmp_path, "/sock")], {}, 9, "/s")
    envs = {m.__name__: m.sandbox_env(ctx, access) for m in (claude_code, codex, mini_swe)}
    envs["standin"] = standin.request_for(ctx).env
    assert NO_BYTECODE_ENV == {
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPYCACHEPREFIX": "/tmp/hangar-pycache",
    }
    for name, env in envs.items():
        assert {k: env.get(k) for k in NO_BYTECODE_ENV} == NO_BYTECODE_ENV, name


def test_the_locks_provider_retries_become_each_clis_own_knobs(tmp_path: Path) -> None:
    # The names each CLI reads (docs/architecture.md has the table); nothing when unset.
    agent = {"adapter": "command", "cli": "sh", "version": "1", "command": "true"}
    lock = freeze_cli_lock(
        tmp_path / "r", "r", agent, "m", provider_retries={"max_retries": 1, "timeout_s": 45}
    )
    bare = context(tmp_path)
    ctx = dataclasses.replace(bare, harness=lock)
    assert claude_code.retry_env(ctx) == {"CLAUDE_CODE_MAX_RETRIES": "1", "API_TIMEOUT_MS": "45000"}
    assert mini_swe.retry_env(ctx) == {"MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "2"}
    mini_kwargs = yaml.safe_load(mini_swe.hangar_config(ctx, "http://p/"))["model"]["model_kwargs"]
    assert (mini_kwargs["max_retries"], mini_kwargs["timeout"]) == (1, 45)
    toml = tomllib.loads(
        codex.config_toml("m", "http://p/", None, run_common.provider_retries(ctx))
    )
    provider = toml["model_providers"][codex.PROVIDER_ID]
    assert (provider["request_max_retries"], provider["stream_max_retries"]) == (1, 1)
    assert provider["stream_idle_timeout_ms"] == 45000
    assert claude_code.retry_env(bare) == {} and mini_swe.retry_env(bare) == {}
    assert "request_max_retries" not in codex.config_toml("m", "http://p/")
