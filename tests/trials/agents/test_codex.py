"""The ``codex`` adapter with the real Codex CLI (npm ``@openai/codex``), offline.

The CLI runs in a bwrap sandbox with no network and reaches the scripted
stand-in endpoint (Responses API) on host loopback only through hangar's
model proxy. Its scripted replies are ``exec_command`` calls that the real
CLI runs on the trial's clone. The parsers are also checked on output saved
from the real CLI (``samples/codex-*``).
"""

from __future__ import annotations

import hashlib
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from hangar_dagster.experiment.harness import HarnessError, HarnessLock, tree_digest
from hangar_dagster.experiment.submit import submit
from hangar_dagster.queue.retries import plan_retries
from hangar_dagster.settings import Settings
from hangar_dagster.standins.model import Reply, Script, ScriptedEndpoint, ToolCall
from hangar_dagster.trials.agents import AgentContext, get_agent, prices
from hangar_dagster.trials.agents.codex import (
    CodexAgent,
    config_toml,
    estimate_cost,
    parse_exec_json,
    parse_session,
)
from hangar_dagster.trials.model_proxy import first_response_model
from hangar_dagster.trials.trial import TrialRequest, run_trial
from hangar_dagster.util.gitrepo import take_patch
from tests.agent_clis import VERSIONS, ensure_npm_cli
from tests.conftest import hangar, write_spec
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
PACKAGE = "@openai/codex"
VERSION = VERSIONS[PACKAGE]
MODEL = "gpt-5-2025-08-07"
SECRET = "sk-proj-test-0000-not-a-real-key-but-secret"
MEMORY_MB = 8192  # the Rust binary reserves a large address space

pytestmark = pytest.mark.integration
needs_bwrap = pytest.mark.needs_sandbox("bwrap")


@pytest.fixture(scope="module")
def codex_bin() -> Path:
    return ensure_npm_cli(PACKAGE, VERSION, "codex")


def make_lock(
    tmp_path: Path, name: str = "codex-team", approvals: str = "full-auto"
) -> HarnessLock:
    agent = {"adapter": "codex", "cli": "codex", "version": VERSION}
    return freeze_cli_lock(tmp_path, name, agent, MODEL, approvals=approvals)


def context(tmp_path: Path, lock: HarnessLock, clone: Path) -> AgentContext:
    return cli_context(tmp_path, lock, clone, MODEL, MEMORY_MB)


def shell(cmd: str) -> ToolCall:
    return ToolCall("exec_command", {"cmd": cmd})


def post(url: str, body: dict[str, Any]) -> str:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(response.read().decode())


def test_responses_dialect_streams_the_events_codex_reads() -> None:
    patch = "*** Begin Patch\n*** End Patch\n"
    script = Script(
        [
            Reply(text="Running.", tool_calls=(shell("ls"),)),
            Reply(tool_calls=(ToolCall("apply_patch", {"input": patch}),)),
        ]
    )
    tools = [
        {"type": "function", "name": "exec_command"},
        {"type": "custom", "name": "apply_patch"},
    ]
    with ScriptedEndpoint(script, MODEL) as endpoint:
        url = f"{endpoint.base_url}/v1/responses"
        side = json.loads(post(url, {"model": MODEL, "input": "title?"}))
        stream = post(url, {"model": MODEL, "input": [], "tools": tools, "stream": True})
        custom = json.loads(post(url, {"model": MODEL, "input": [], "tools": tools}))
    # A request offering no tools is a side call: answered, the script untouched.
    assert side["output"][0]["type"] == "message" and script.consumed == 2
    frames = [f for f in stream.split("\n\n") if f.strip()]
    events = [(f.split("\n")[0][7:], json.loads(f.split("\n")[1][6:])) for f in frames]
    kinds = [k for k, _ in events]
    assert all(k == d["type"] for k, d in events)
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    done = [d["item"] for k, d in events if k == "response.output_item.done"]
    assert [i["type"] for i in done] == ["message", "function_call"]
    text = "".join(d["delta"] for k, d in events if k == "response.output_text.delta")
    args = "".join(d["delta"] for k, d in events if k == "response.function_call_arguments.delta")
    assert text == "Running." and json.loads(args) == {"cmd": "ls"} == json.loads(
        done[1]["arguments"]
    )
    assert done[1]["name"] == "exec_command" and done[1]["call_id"].startswith("call_")
    usage = events[-1][1]["response"]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (100, 20)
    # A freeform (custom) tool gets a custom_tool_call carrying the raw input.
    (item,) = custom["output"]
    assert (item["type"], item["name"], item["input"]) == ("custom_tool_call", "apply_patch", patch)


def test_registry_gives_the_adapter() -> None:
    assert isinstance(get_agent("codex"), CodexAgent)


def test_exec_json_sample_becomes_trace_events() -> None:
    out = parse_exec_json((SAMPLES / "codex-exec.jsonl").read_text() + "not json\n")
    kinds = [e["type"] for e in out.events]
    assert kinds[0] == "init" and kinds[-1] == "raw"
    calls = [e for e in out.events if e["type"] == "tool_call"]
    results = [e for e in out.events if e["type"] == "tool_result"]
    # One call per command, though Codex reports each command started and completed.
    assert [c["tool"] for c in calls] == ["shell", "shell"]
    assert [r["id"] for r in results] == [c["id"] for c in calls]
    assert "cat calc.py" in str(calls[0]["input"]) and "a + b" in str(calls[1]["input"])
    assert "return a + b" in results[1]["content"] and results[1]["exit_code"] == 0
    assert out.turns_completed == 1 and (out.tokens_in, out.tokens_out) == (3000, 150)
    # Codex's own warning (no metadata for this model) is kept, not taken for a failure.
    assert any(e["type"] == "warning" and "metadata" in e["message"] for e in out.events)
    assert out.final_message == "add() now adds."
    assert not out.errors


def test_session_sample_gives_turn_one_facts() -> None:
    session = parse_session((SAMPLES / "codex-session.jsonl").read_text())
    assert session.cli_version == VERSION
    assert session.model == MODEL and session.provider == "hangar"
    assert len(session.responses) == 3
    assert session.total_tokens == (3000, 150)
    assert session.instructions_seen
    assert "- careful:" in session.skills_text


def test_price_table_and_provider_config() -> None:
    assert estimate_cost("gpt-5-mini-2025-08-07", 1_000_000, 0) == 0.25
    assert estimate_cost(MODEL, 1_000_000, 1_000_000) == 11.25
    unknown = estimate_cost("some-local-model", 10, 10)  # unknown, not free
    assert isinstance(unknown, prices.UnknownCost) and unknown.estimate_usd > 0
    toml = config_toml('gpt-"odd"', "http://127.0.0.1:5555/")
    assert 'model = "gpt-\\"odd\\""' in toml
    assert 'base_url = "http://127.0.0.1:5555/v1"' in toml and 'wire_api = "responses"' in toml


def test_approvals_other_than_full_auto_are_refused(tmp_path: Path) -> None:
    lock = make_lock(tmp_path, approvals="suggest")
    clone, _ = make_clone(tmp_path)
    with pytest.raises(HarnessError, match="approvals 'suggest'.*full-auto"):
        get_agent("codex").run(context(tmp_path, lock, clone))


def fix_calc_script() -> Script:
    return Script(
        [
            Reply(text="Looking at calc.py.", tool_calls=(shell("cat calc.py"),)),
            Reply(tool_calls=(shell("sed -i 's/a - b/a + b/' calc.py && cat calc.py"),)),
            Reply(text="add() now adds."),
        ],
        usage_per_reply=(1000, 50),
    )


@needs_bwrap
def test_real_codex_edits_the_clone_through_the_proxy(
    codex_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HANGAR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HANGAR_AGENT_BIN_DIR", str(codex_bin.parent))
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    lock = make_lock(tmp_path)
    clone, base = make_clone(tmp_path)
    with ScriptedEndpoint(fix_calc_script(), MODEL) as endpoint:
        monkeypatch.setenv("HANGAR_OPENAI_BASE_URL", endpoint.base_url)
        run = get_agent("codex").run(context(tmp_path, lock, clone))
    assert run.error is None, run.output_tail
    assert run.exit_code == 0
    # The real CLI ran the scripted command in the sandbox, on the clone.
    patch = take_patch(clone, base)
    assert "+    return a + b" in patch and "-    return a - b" in patch
    calls = [e for e in run.events if e["type"] == "tool_call"]
    assert [c["tool"] for c in calls] == ["shell", "shell"]
    results = [e for e in run.events if e["type"] == "tool_result"]
    assert [r["exit_code"] for r in results] == [0, 0] and "a + b" in results[1]["content"]
    assert run.turns == 3
    assert (run.tokens_in, run.tokens_out) == (3000, 150)
    assert run.cost_usd == pytest.approx((3000 * 1.25 + 150 * 10.0) / 1_000_000)
    fp = run.fingerprint
    assert fp["adapter"] == "codex" and fp["harness"] == lock.ref and fp["cli"] == "codex"
    assert fp["cli_version"] == VERSION and "cli_version" in fp["reported_by_cli"]
    assert fp["model"] == MODEL and "model" in fp["reported_by_cli"]
    assert fp["tools"] is not None and "exec_command" in fp["tools"]
    assert fp["instructions_digest"] == hashlib.sha256(INSTRUCTIONS.encode()).hexdigest()
    assert fp["skills_digest"] == tree_digest(lock.skills_dir)
    assert fp["instructions_seen"] and fp["skills_seen"] == ["careful"]
    # The CLI sent the harness instructions (placed as CODEX_HOME/AGENTS.md) to the model.
    conversational = [r for r in endpoint.requests if r["body"].get("tools")]
    assert len(conversational) == 3
    assert INSTRUCTIONS.strip() in json.dumps(conversational[0]["body"])
    # The proxy swapped the placeholder key for the orchestrator's.
    assert {r["headers"].get("authorization") for r in conversational} == {f"Bearer {SECRET}"}
    assert SECRET not in json.dumps(run.events) + json.dumps(run.fingerprint) + run.output_tail
    assert "AGENTS.md" not in patch and "SKILL.md" not in patch


MEDIAN_FIX = (
    "    if len(ordered) % 2 == 0:\n"
    "        return (ordered[mid - 1] + ordered[mid]) / 2\n"
    "    return ordered[mid]\n"
)


def median_conversation() -> list[Reply]:
    fix = (
        "cat > /tmp/fix.py <<'EOF'\n"
        + (
            "import pathlib\n"
            "p = pathlib.Path('stats.py')\n"
            f"p.write_text(p.read_text().replace('    return ordered[mid]\\n', {MEDIAN_FIX!r}))\n"
        )
        + "EOF\npython3 /tmp/fix.py && cat stats.py"
    )
    return [
        Reply(tool_calls=(shell("cat stats.py"),)),
        Reply(text="Averaging the two middle values.", tool_calls=(shell(fix),)),
        # What the agent's environment holds: the placeholder key, never the real one
        # (hashed: the trace redacts anything that looks like a key).
        Reply(tool_calls=(shell('printf %s "$OPENAI_API_KEY" | sha256sum'),)),
        Reply(text="median() now averages the middle pair."),
    ]


@needs_bwrap
def test_experiment_runs_real_codex_and_grades_its_edit(
    codex_bin: Path, example_dir: Path, tmp_path: Path
) -> None:
    lock = make_lock(tmp_path)
    spec = median_spec(example_dir, tmp_path, "codex-e2e", {"codex": lock}, MEMORY_MB)
    home = tmp_path / "home"
    script = Script(median_conversation(), usage_per_reply=(500, 40))
    with ScriptedEndpoint(script, MODEL) as endpoint:
        env = {
            "HANGAR_AGENT_BIN_DIR": str(codex_bin.parent),
            "HANGAR_OPENAI_BASE_URL": endpoint.base_url,
            "OPENAI_API_KEY": SECRET,
        }
        ran = hangar(
            "experiment", "run", str(write_spec(example_dir, spec)), "--wait", home=home, env=env
        )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert script.consumed == 4
    got = hangar("experiment", "get", "codex-e2e", "--json", home=home)
    assert got.returncode == 0, got.stderr
    (row,) = json.loads(got.stdout)["trials"]
    assert (row["outcome_class"], row["passed"], row["drift"]) == ("completed", True, None)
    (art,) = (home / "artifacts").glob("*/codex__median__*/attempt-1")
    assert (
        "+        return (ordered[mid - 1] + ordered[mid]) / 2" in (art / "patch.diff").read_text()
    )
    trace = json.loads((art / "trace.json").read_text())
    assert [e["tool"] for e in trace["events"] if e["type"] == "tool_call"] == ["shell"] * 3
    assert (trace["turns"], trace["tokens_in"], trace["tokens_out"]) == (4, 2000, 160)
    assert trace["cost_usd"] > 0
    assert trace["fingerprint"]["cli_version"] == VERSION
    assert trace["fingerprint"]["model"] == MODEL
    env_dump = [e for e in trace["events"] if e["type"] == "tool_result"][2]["content"]
    assert hashlib.sha256(b"hangar-proxy").hexdigest() in env_dump
    for f in (home / "artifacts").rglob("*"):
        if f.is_file():
            assert SECRET not in f.read_text(errors="replace"), f


@needs_bwrap
def test_real_codex_runs_the_tasks_verify_in_its_login_shell(
    codex_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Codex runs commands as `bash -lc`: the system's /etc/profile dropped the venv from PATH,
    # so the task's own verify answered "python: command not found" (exit 127) inside it.
    # Found through a bin folder of links to npm's own link (node_modules/.bin/codex).
    links = tmp_path / "links"
    links.mkdir()
    (links / "codex").symlink_to(codex_bin)
    real_cli_env(monkeypatch, tmp_path, links, "OPENAI_API_KEY", SECRET)
    clone, _ = make_clone(tmp_path)
    script = Script([Reply(tool_calls=(shell(VERIFY_PROBE),)), Reply(text="Checked.")])
    with ScriptedEndpoint(script, MODEL) as endpoint:
        monkeypatch.setenv("HANGAR_OPENAI_BASE_URL", endpoint.base_url)
        run = get_agent("codex").run(context(tmp_path, make_lock(tmp_path), clone))
    assert run.error is None, run.output_tail
    assert_verify_ran_as_in_verify(run.events)


@needs_bwrap
def test_real_codex_is_offered_apply_patch_with_a_dated_id_through_the_locks_model_family(
    codex_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gpt-5-2025-08-07 is in no slug of Codex 0.171's bundled catalog: Codex fell back to
    # "fallback metadata" and offered no apply_patch. The lock's codex.model_family gives it
    # the catalog entry of a family Codex ships (written to CODEX_HOME/models.json).
    real_cli_env(monkeypatch, tmp_path, codex_bin.parent, "OPENAI_API_KEY", SECRET)
    agent = {"adapter": "codex", "cli": "codex", "version": VERSION}
    lock = freeze_cli_lock(
        tmp_path,
        "codex-family",
        agent,
        MODEL,
        approvals="full-auto",
        codex={"model_family": "gpt-5.5"},
    )
    clone, _ = make_clone(tmp_path)
    with ScriptedEndpoint(Script([Reply(text="Nothing to do.")]), MODEL) as endpoint:
        monkeypatch.setenv("HANGAR_OPENAI_BASE_URL", endpoint.base_url)
        run = get_agent("codex").run(context(tmp_path, lock, clone))
    assert run.error is None, run.output_tail
    (first, *_) = [r for r in endpoint.requests if r["body"].get("tools")]
    offered = [t.get("name") or t.get("type") for t in first["body"]["tools"]]
    assert "apply_patch" in offered and "exec_command" in offered
    assert first["body"]["model"] == MODEL  # the dated id is still what is asked for
    assert "fallback metadata" not in run.output_tail


def test_a_model_family_codex_does_not_ship_is_refused(
    codex_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HANGAR_AGENT_BIN_DIR", str(codex_bin.parent))
    agent = {"adapter": "codex", "cli": "codex", "version": VERSION}
    lock = freeze_cli_lock(
        tmp_path,
        "codex-nofamily",
        agent,
        MODEL,
        approvals="full-auto",
        codex={"model_family": "gpt-1"},
    )
    with pytest.raises(HarnessError, match="codex.model_family 'gpt-1' is not in the bundled"):
        get_agent("codex").run(context(tmp_path, lock, tmp_path))


@pytest.mark.parametrize(("fault", "reason"), FAULTS)
def test_a_provider_fault_against_real_codex_is_named_by_the_proxy_within_60s(
    fault: str, reason: str, codex_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, log, elapsed = run_against(
        "codex",
        codex_bin.parent,
        make_lock(tmp_path),
        fix_calc_script(),
        MODEL,
        "HANGAR_OPENAI_BASE_URL",
        tmp_path,
        monkeypatch,
        fault,
        MEMORY_MB,
    )
    assert_named_by_the_proxy(run, log, elapsed, reason)


@needs_bwrap
def test_real_codex_answered_by_another_model_is_turn_one_of_that_model(
    codex_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Codex's session file echoes its config's model; the proxy saw what the provider said.
    script = Script([Reply(text="done", model="gpt-other")])
    run, log, _ = run_against(
        "codex",
        codex_bin.parent,
        make_lock(tmp_path),
        script,
        MODEL,
        "HANGAR_OPENAI_BASE_URL",
        tmp_path,
        monkeypatch,
        None,
        MEMORY_MB,
    )
    assert run.fingerprint.get("model") == MODEL  # the echo the trial no longer trusts
    assert first_response_model(log, MODEL) == "gpt-other"


@needs_bwrap
def test_real_codex_answered_by_another_model_ends_the_trial_as_drift_never_retried(
    codex_bin: Path,
    example_dir: Path,
    tmp_path: Path,
    hangar_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Regression: Codex's session file echoes its config's model, so a provider answering
    # another model ended `completed`, drift none. The proxy's record of the answer decides.
    lock = make_lock(tmp_path, "codex-drift")
    spec = median_spec(example_dir, tmp_path, "codex-drift", {"drift": lock}, MEMORY_MB)
    monkeypatch.setenv("HANGAR_AGENT_BIN_DIR", str(codex_bin.parent))  # submit checks the CLI
    exp = submit(write_spec(example_dir, spec), Settings.from_env())
    (key,) = exp.trial_keys()
    script = Script([Reply(text="Nothing to change.", model="gpt-other")])
    with ScriptedEndpoint(script, MODEL) as endpoint:
        monkeypatch.setenv("HANGAR_OPENAI_BASE_URL", endpoint.base_url)
        record, _ = run_trial(TrialRequest(exp, key, 1, None, "run-drift"), Settings.from_env())
    assert (record.outcome_class, record.infra_reason) == ("infra_error", "drift"), record.error
    assert record.drift is not None and "gpt-other" in record.drift
    plan = plan_retries([record], 1, Settings.from_env().infra_retries)
    assert plan.retries == []


def test_the_locks_provider_retries_reach_real_codexs_own_retry_knob(
    codex_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without it the CLI retried a 503 on its own until the proxy stopped it (GIVE_UP_AFTER);
    # max_retries 0 through request_max_retries leaves one request.
    agent = {"adapter": "codex", "cli": "codex", "version": VERSION}
    lock = freeze_cli_lock(
        tmp_path, "codex-retries", agent, MODEL, approvals="full-auto", provider_retries=NO_RETRIES
    )
    run, log, _ = run_against(
        "codex",
        codex_bin.parent,
        lock,
        fix_calc_script(),
        MODEL,
        "HANGAR_OPENAI_BASE_URL",
        tmp_path,
        monkeypatch,
        "503",
    )
    assert run.error is not None, run.output_tail
    assert failed_answers(log) == 1, log
