"""The ``mini-swe-agent`` adapter with the real ``mini`` CLI (PyPI ``mini-swe-agent``), offline.

The CLI runs in a bwrap sandbox with no network and reaches the scripted
stand-in endpoint (Chat Completions, through litellm) on host loopback only
through hangar's model proxy. Its scripted replies are ``bash`` tool calls,
mini-swe-agent's action format, which the real CLI runs on the trial's clone.
The parser is also checked on a trajectory saved from the real CLI
(``samples/mini-trajectory.json``).
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hangar_dagster.experiment.harness import HarnessError, HarnessLock, tree_digest
from hangar_dagster.experiment.submit import submit
from hangar_dagster.grading.grader import grade_trial
from hangar_dagster.queue.retries import plan_retries
from hangar_dagster.settings import Settings
from hangar_dagster.standins.model import Reply, Script, ScriptedEndpoint, ToolCall
from hangar_dagster.trials.agents import AgentContext, get_agent
from hangar_dagster.trials.agents.install import venv_cli
from hangar_dagster.trials.agents.mini_swe import (
    INSTALL_HINT,
    MiniSweAgent,
    litellm_model,
    parse_trajectory,
    task_text,
)
from hangar_dagster.trials.model_proxy import EGRESS_NAME, first_response_model
from hangar_dagster.trials.trial import TrialRequest, run_trial
from hangar_dagster.util.gitrepo import take_patch
from tests.agent_clis import VERSIONS, ensure_pip_cli
from tests.conftest import write_spec
from tests.gitfixtures import make_clone
from tests.trials.agents.cli_locks import (
    FAULTS,
    INSTRUCTIONS,
    NO_RETRIES,
    VERIFY_PROBE,
    assert_named_by_the_proxy,
    assert_verify_ran_as_in_verify,
    cli_context,
    failed_answers,
    freeze_cli_lock,
    median_spec,
    real_cli_env,
    run_against,
)

SAMPLES = Path(__file__).parent / "samples"
PACKAGE = "mini-swe-agent"
VERSION = VERSIONS[PACKAGE]
MODEL = "gpt-5-2025-08-07"
SECRET = "sk-proj-test-1111-not-a-real-key-but-secret"
BASE_VAR = "HANGAR_OPENAI_BASE_URL"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

pytestmark = pytest.mark.integration
needs_bwrap = pytest.mark.needs_sandbox("bwrap")


@pytest.fixture(scope="module")
def mini_bin() -> Path:
    return ensure_pip_cli(PACKAGE, VERSION, "mini")


def make_lock(tmp_path: Path, name: str = "mini-team", **settings: Any) -> HarnessLock:
    agent = {"adapter": "mini-swe-agent", "cli": "mini-swe-agent", "version": VERSION}
    extra = {"mini-swe-agent": settings} if settings else {}
    return freeze_cli_lock(tmp_path, name, agent, MODEL, **extra)


def context(tmp_path: Path, lock: HarnessLock, clone: Path, model: str = MODEL) -> AgentContext:
    return cli_context(tmp_path, lock, clone, model)


def bash(command: str, text: str = "") -> Reply:
    return Reply(text=text, tool_calls=(ToolCall("bash", {"command": command}),))


def post(url: str, body: dict[str, Any]) -> str:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(response.read().decode())


def test_chat_completions_dialect_streams_tool_calls_in_the_openai_shape() -> None:
    script = Script([bash("ls -la", "THOUGHT: look."), Reply(text="plain", model="other-model")])
    with ScriptedEndpoint(script, MODEL) as endpoint:
        url = f"{endpoint.base_url}/v1/chat/completions"
        messages = [{"role": "user", "content": "hi"}]
        stream = post(
            url,
            {
                "model": MODEL,
                "messages": messages,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        plain = json.loads(post(url, {"model": MODEL, "messages": messages}))
        bad = urllib.request.Request(url, data=b"{}", headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(bad, timeout=10)
    data = [line[6:] for line in stream.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    text = "".join(d.get("content") or "" for d in deltas)
    pieces = [t for d in deltas for t in d.get("tool_calls", [])]
    arguments = "".join(p["function"]["arguments"] for p in pieces)
    assert text == "THOUGHT: look."
    assert pieces[0]["function"]["name"] == "bash" and pieces[0]["id"].startswith("call_")
    assert json.loads(arguments) == {"command": "ls -la"}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "total_tokens": 120,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert plain["model"] == "other-model" and plain["object"] == "chat.completion"
    assert plain["choices"][0] == {
        "index": 0,
        "message": {"role": "assistant", "content": "plain"},
        "finish_reason": "stop",
        "logprobs": None,
    }
    assert refused.value.code == 400


def test_registry_gives_the_adapter() -> None:
    assert isinstance(get_agent("mini-swe-agent"), MiniSweAgent)


def test_trajectory_sample_becomes_trace_events() -> None:
    traj = parse_trajectory((SAMPLES / "mini-trajectory.json").read_text())
    assert traj.mini_version == VERSION and traj.exit_status == "Submitted"
    assert traj.model_name == f"openai/{MODEL}" and traj.first_model == MODEL
    calls = [e for e in traj.events if e["type"] == "tool_call"]
    results = [e for e in traj.events if e["type"] == "tool_result"]
    assert [c["tool"] for c in calls] == ["bash"] * 3
    assert "a + b" in calls[1]["input"] and calls[2]["input"] == SUBMIT
    assert [r["id"] for r in results] == [c["id"] for c in calls]
    assert "return a + b" in results[1]["content"] and results[1]["exit_code"] == 0
    # mini ends on the submit command without running it, and says so.
    assert results[2]["exit_code"] == -1
    assert traj.turns == traj.api_calls == 3
    assert (traj.tokens_in, traj.tokens_out) == (3000, 150)
    # litellm's own price for the model: 3000 x 1.25 + 150 x 10 USD per million.
    assert traj.cost_usd == pytest.approx(0.00525)
    assert INSTRUCTIONS.strip() in traj.first_prompt
    assert [e["type"] for e in traj.events][-1] == "exit"


def test_a_broken_trajectory_is_reported_not_raised() -> None:
    assert parse_trajectory("").events == []
    assert parse_trajectory("[1, 2]").events[0]["type"] == "raw"


def test_model_names_and_lock_settings(tmp_path: Path) -> None:
    clone, _ = make_clone(tmp_path)
    lock = make_lock(tmp_path)
    assert litellm_model(context(tmp_path, lock, clone)) == f"openai/{MODEL}"
    assert litellm_model(context(tmp_path, lock, clone, f"openai/{MODEL}")) == f"openai/{MODEL}"
    with pytest.raises(HarnessError, match="another litellm provider"):
        litellm_model(context(tmp_path, lock, clone, "anthropic/claude-x"))
    text = task_text(context(tmp_path, lock, clone))
    assert text.startswith("Make add() add.") and INSTRUCTIONS.strip() in text
    assert "/harness/skills/careful/SKILL.md" in text
    odd = make_lock(tmp_path, "mini-odd", step_limit=3)
    with pytest.raises(HarnessError, match="unknown mini-swe-agent setting.*step_limit"):
        get_agent("mini-swe-agent").run(context(tmp_path, odd, clone))


def test_a_mini_outside_a_virtualenv_is_refused(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "mini").write_text("#!/bin/sh\n")
    with pytest.raises(HarnessError, match="virtualenv.*pip install mini-swe-agent=="):
        venv_cli(tmp_path / "bin" / "mini", INSTALL_HINT)


def test_a_pipx_link_and_a_bin_folder_of_links_resolve_to_the_venvs_script(
    mini_bin: Path, tmp_path: Path
) -> None:
    # pipx links ~/.local/bin/mini to its venv's script: it was refused "no pyvenv.cfg".
    pipx_bin = tmp_path / "local-bin"
    pipx_bin.mkdir()
    (pipx_bin / "mini").symlink_to(mini_bin)
    folder = tmp_path / "links"
    folder.mkdir()
    (folder / "mini").symlink_to(pipx_bin / "mini")  # a link to a link
    for found in (pipx_bin / "mini", folder / "mini"):
        assert venv_cli(found, INSTALL_HINT) == mini_bin
    (tmp_path / "stray").write_text("#!/bin/sh\n")
    (folder / "stray").symlink_to(tmp_path / "stray")
    with pytest.raises(HarnessError, match="links followed"):
        venv_cli(folder / "stray", INSTALL_HINT)


def fix_calc_script() -> Script:
    return Script(
        [
            bash("cat calc.py", "THOUGHT: read calc.py first."),
            bash("sed -i 's/a - b/a + b/' calc.py && cat calc.py", "THOUGHT: subtracts; fix."),
            bash(SUBMIT, "THOUGHT: done."),
        ],
        usage_per_reply=(1000, 50),
    )


@needs_bwrap
def test_real_mini_edits_the_clone_through_the_proxy(
    mini_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HANGAR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HANGAR_AGENT_BIN_DIR", str(mini_bin.parent))
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    lock = make_lock(tmp_path)
    clone, base = make_clone(tmp_path)
    with ScriptedEndpoint(fix_calc_script(), MODEL) as endpoint:
        monkeypatch.setenv("HANGAR_OPENAI_BASE_URL", endpoint.base_url)
        run = get_agent("mini-swe-agent").run(context(tmp_path, lock, clone))
    assert run.error is None, run.output_tail
    assert run.exit_code == 0
    patch = take_patch(clone, base)
    assert "+    return a + b" in patch and "-    return a - b" in patch
    assert [e["tool"] for e in run.events if e["type"] == "tool_call"] == ["bash"] * 3
    assert run.turns == 3 and (run.tokens_in, run.tokens_out) == (3000, 150)
    assert run.cost_usd == pytest.approx(0.00525)  # mini-swe-agent's own (litellm) cost
    fp = run.fingerprint
    assert fp["adapter"] == "mini-swe-agent" and fp["harness"] == lock.ref
    assert fp["cli"] == "mini-swe-agent" and fp["cli_version"] == VERSION
    assert fp["model"] == MODEL and fp["tools"] == ["bash"]
    assert fp["reported_by_cli"] == ["cli_version", "model", "tools"]
    assert fp["instructions_digest"] == hashlib.sha256(INSTRUCTIONS.encode()).hexdigest()
    assert fp["skills_digest"] == tree_digest(lock.skills_dir)
    assert fp["instructions_seen"] and fp["skills_seen"] == ["careful"]
    assert len(endpoint.requests) == 3
    assert {r["path"] for r in endpoint.requests} == {"/v1/chat/completions"}
    assert {r["headers"].get("authorization") for r in endpoint.requests} == {f"Bearer {SECRET}"}
    assert SECRET not in json.dumps(run.events) + json.dumps(run.fingerprint) + run.output_tail


@needs_bwrap
def test_the_trial_budget_stops_mini(
    mini_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HANGAR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HANGAR_AGENT_BIN_DIR", str(mini_bin.parent))
    lock = make_lock(tmp_path)
    clone, _ = make_clone(tmp_path)
    # Each reply costs 0.0015 USD at the model's litellm price; the cap is passed after two.
    script = Script([bash("true")] * 5 + [bash(SUBMIT)], usage_per_reply=(1000, 25))
    with ScriptedEndpoint(script, MODEL) as endpoint:
        monkeypatch.setenv("HANGAR_OPENAI_BASE_URL", endpoint.base_url)
        ctx = replace(context(tmp_path, lock, clone), max_cost_usd=0.002)
        run = get_agent("mini-swe-agent").run(ctx)
    assert run.budget_stopped and run.error is not None and "max_cost_usd" in run.error
    assert run.turns == 2 and script.consumed == 2


def median_conversation() -> list[Reply]:
    fix = (
        "python3 - <<'EOF'\n"
        "import pathlib\n"
        "p = pathlib.Path('stats.py')\n"
        "fixed = ('    if len(ordered) % 2 == 0:\\n'\n"
        "         '        return (ordered[mid - 1] + ordered[mid]) / 2\\n'\n"
        "         '    return ordered[mid]\\n')\n"
        "p.write_text(p.read_text().replace('    return ordered[mid]\\n', fixed))\n"
        "EOF"
    )
    return [
        bash("cat stats.py", "THOUGHT: read it."),
        bash(fix, "THOUGHT: average the two middle values."),
        bash(SUBMIT, "THOUGHT: done."),
    ]


@needs_bwrap
def test_a_real_mini_trial_is_graded_on_its_edit(
    mini_bin: Path,
    example_dir: Path,
    tmp_path: Path,
    hangar_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The trial and grade functions the Dagster stages call, without the stages: the path
    # through `hangar experiment run` and the run worker is the same for every adapter and
    # is run end to end with a real CLI by test_claude_code.py and, for the OpenAI dialect,
    # test_codex.py (each about 50 s of run launches more).
    lock = make_lock(tmp_path)
    spec = median_spec(example_dir, tmp_path, "mini-e2e", {"mini": lock}, 4096)
    # Before submit: it refuses a variant whose CLI it cannot find.
    monkeypatch.setenv("HANGAR_AGENT_BIN_DIR", str(mini_bin.parent))
    exp = submit(write_spec(example_dir, spec), Settings.from_env())
    (key,) = exp.trial_keys()
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    script = Script(median_conversation(), usage_per_reply=(500, 40))
    with ScriptedEndpoint(script, MODEL) as endpoint:
        monkeypatch.setenv("HANGAR_OPENAI_BASE_URL", endpoint.base_url)
        settings = Settings.from_env()
        record, patch = run_trial(TrialRequest(exp, key, 1, None, "run-mini"), settings)
    assert script.consumed == 3
    grade = grade_trial(exp, record, patch, None, "run-mini", settings.paths, settings)
    assert (record.outcome_class, grade.passed, record.drift) == ("completed", True, None), (
        record.error,
        grade.reason,
    )
    art = Path(record.artifacts_dir)
    assert art.parts[-2:] == ("mini__median__1", "attempt-1")
    assert "+        return (ordered[mid - 1] + ordered[mid]) / 2" in patch
    assert (art / "patch.diff").read_text() == patch
    assert "5 passed" in (art / "grade.log").read_text()
    trace = json.loads((art / "trace.json").read_text())
    assert [e["tool"] for e in trace["events"] if e["type"] == "tool_call"] == ["bash"] * 3
    assert (trace["turns"], trace["tokens_in"], trace["tokens_out"]) == (3, 1500, 120)
    assert trace["cost_usd"] > 0
    assert trace["fingerprint"]["cli_version"] == VERSION
    assert trace["fingerprint"]["model"] == MODEL
    files = [f for f in (hangar_home / "artifacts").rglob("*") if f.is_file()]
    assert art / "egress.jsonl" in files and art / "agent.log" in files
    for f in files:
        assert SECRET not in f.read_text(errors="replace"), f


@needs_bwrap
def test_real_mini_through_a_pipx_link_runs_the_tasks_verify_as_the_verify_step_does(
    mini_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Installed as pipx does it: HANGAR_AGENT_BIN_DIR holds only a link to the venv's script.
    links = tmp_path / "local-bin"
    links.mkdir()
    (links / "mini").symlink_to(mini_bin)
    real_cli_env(monkeypatch, tmp_path, links, "OPENAI_API_KEY", SECRET)
    clone, _ = make_clone(tmp_path)
    script = Script([bash(VERIFY_PROBE, "THOUGHT: check."), bash(SUBMIT, "THOUGHT: done.")])
    with ScriptedEndpoint(script, MODEL) as endpoint:
        monkeypatch.setenv("HANGAR_OPENAI_BASE_URL", endpoint.base_url)
        run = get_agent("mini-swe-agent").run(context(tmp_path, make_lock(tmp_path), clone))
    assert run.error is None, run.output_tail
    assert_verify_ran_as_in_verify(run.events)


@pytest.mark.parametrize(("fault", "reason"), FAULTS)
def test_a_provider_fault_against_real_mini_is_named_by_the_proxy_within_60s(
    fault: str, reason: str, mini_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, log, elapsed = run_against(
        "mini-swe-agent",
        mini_bin.parent,
        make_lock(tmp_path),
        fix_calc_script(),
        MODEL,
        BASE_VAR,
        tmp_path,
        monkeypatch,
        fault,
    )
    assert_named_by_the_proxy(run, log, elapsed, reason)


@needs_bwrap
def test_real_mini_answered_by_another_model_ends_the_trial_as_drift_never_retried(
    mini_bin: Path,
    example_dir: Path,
    tmp_path: Path,
    hangar_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The whole trial: turn 1's model is the one the provider's first answer named (the
    # proxy's record), so the trial ends as drift and no retry is planned.
    lock = make_lock(tmp_path, "mini-drift")
    spec = median_spec(example_dir, tmp_path, "mini-drift", {"drift": lock}, 4096)
    monkeypatch.setenv("HANGAR_AGENT_BIN_DIR", str(mini_bin.parent))  # submit checks the CLI
    exp = submit(write_spec(example_dir, spec), Settings.from_env())
    (key,) = exp.trial_keys()
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    other = Reply(text="THOUGHT: done.", model="gpt-other", tool_calls=bash(SUBMIT).tool_calls)
    with ScriptedEndpoint(Script([other]), MODEL) as endpoint:
        monkeypatch.setenv(BASE_VAR, endpoint.base_url)
        record, _ = run_trial(TrialRequest(exp, key, 1, None, "run-drift"), Settings.from_env())
    assert (
        first_response_model((Path(record.artifacts_dir) / EGRESS_NAME).read_text(), MODEL)
        == "gpt-other"
    )
    assert (record.outcome_class, record.infra_reason) == ("infra_error", "drift"), record.error
    assert record.drift is not None and "gpt-other" in record.drift
    assert plan_retries([record], 1, Settings.from_env().infra_retries).retries == []


def test_the_locks_provider_retries_reach_real_minis_own_retry_knob(
    mini_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without it the CLI retried a 503 on its own until the proxy stopped it (GIVE_UP_AFTER);
    # max_retries 0 through MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT leaves one request.
    agent = {"adapter": "mini-swe-agent", "cli": "mini-swe-agent", "version": VERSION}
    lock = freeze_cli_lock(tmp_path, "mini-retries", agent, MODEL, provider_retries=NO_RETRIES)
    run, log, _ = run_against(
        "mini-swe-agent",
        mini_bin.parent,
        lock,
        fix_calc_script(),
        MODEL,
        BASE_VAR,
        tmp_path,
        monkeypatch,
        "503",
    )
    assert run.error is not None, run.output_tail
    assert failed_answers(log) == 1, log
