"""The ``claude-code`` adapter with the real Claude Code CLI (npm), offline.

The CLI runs in a bwrap sandbox with no network and reaches the scripted
stand-in endpoint on host loopback only through hangar's model proxy. Its
scripted replies are tool calls (Read, Edit, Bash) that the real CLI carries
out on the trial's clone.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from hangar_dagster.experiment.harness import HarnessLock, freeze, tree_digest
from hangar_dagster.experiment.submit import submit
from hangar_dagster.queue.retries import plan_retries
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings, paths
from hangar_dagster.standins.model import Reply, Script, ScriptedEndpoint, ToolCall
from hangar_dagster.trials.agents import get_agent
from hangar_dagster.trials.agents.claude_code import (
    ClaudeCodeAgent,
    StreamJson,
    argv_for,
    turns_of,
)
from hangar_dagster.trials.agents.install import install_mounts
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

pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("bwrap")]

PACKAGE = "@anthropic-ai/claude-code"
VERSION = VERSIONS[PACKAGE]
MODEL = "claude-sonnet-4-5-20250929"
SECRET = "sk-ant-test-0000-not-a-real-key-but-secret"


@pytest.fixture(scope="module")
def claude_bin() -> Path:
    return ensure_npm_cli(PACKAGE, VERSION, "claude")


def make_lock(
    tmp_path: Path, name: str = "claude-team", version: str = VERSION, **settings: Any
) -> HarnessLock:
    agent = {"adapter": "claude-code", "cli": "claude", "version": version}
    extra = {"claude-code": settings} if settings else {}
    return freeze_cli_lock(tmp_path, name, agent, MODEL, approvals="full-auto", **extra)


PLUGIN = "hangar-tools"


def plugin_lock(tmp_path: Path) -> HarnessLock:
    """``make_lock``'s harness plus one plugin, ``hangar-tools``, with a ``/greet`` command."""
    src = make_lock(tmp_path, "claude-plugged").path.parent.parent / "claude-plugged-src"
    plugin = src / "plugins" / PLUGIN
    (plugin / ".claude-plugin").mkdir(parents=True)
    (plugin / ".claude-plugin" / "plugin.json").write_text(json.dumps({"name": PLUGIN}))
    (plugin / "commands").mkdir()
    (plugin / "commands" / "greet.md").write_text("---\ndescription: Say hello.\n---\nSay hello.\n")
    (src / "plugins" / "notes.txt").write_text("not a plugin\n")
    return freeze(src, tmp_path / "registry")


def fix_calc_script() -> Script:
    return Script(
        [
            Reply(
                text="Reading calc.py.", tool_calls=(ToolCall("Read", {"file_path": "calc.py"}),)
            ),
            Reply(
                tool_calls=(
                    ToolCall(
                        "Edit",
                        {"file_path": "calc.py", "old_string": "a - b", "new_string": "a + b"},
                    ),
                )
            ),
            Reply(
                tool_calls=(
                    ToolCall("Bash", {"command": "python -c 'import calc; print(calc.add(2, 3))'"}),
                )
            ),
            Reply(text="add() now adds."),
        ],
        usage_per_reply=(1000, 50),
    )


def test_registry_gives_the_adapter() -> None:
    assert isinstance(get_agent("claude-code"), ClaudeCodeAgent)


def test_stream_parser_counts_messages_once_and_cuts_nothing_it_needs() -> None:
    stream = StreamJson()
    lines = [
        {
            "type": "system",
            "subtype": "init",
            "claude_code_version": "9.9.9",
            "tools": ["Write", "Bash"],
            "model": "m-1",
        },
        {
            "type": "assistant",
            "message": {
                "id": "a",
                "model": "m-2",
                "usage": {"input_tokens": 5, "output_tokens": 1},
                "content": [{"type": "text", "text": "hi"}],
            },
        },
        {
            "type": "assistant",
            "message": {
                "id": "a",
                "model": "m-2",
                "usage": {"input_tokens": 5, "output_tokens": 1},
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "Write", "input": {"file_path": "x"}}
                ],
            },
        },
        {
            "type": "user",
            "message": {"content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
        },
    ]
    data = "".join(json.dumps(line) + "\n" for line in lines) + "not json\n"
    # Fed in odd-sized chunks, as a pipe delivers them.
    for i in range(0, len(data), 7):
        stream.feed(data[i : i + 7].encode())
    stream.close()
    kinds = [e["type"] for e in stream.events]
    assert kinds == ["init", "turn", "message", "tool_call", "tool_result", "raw"]
    assert stream.events[0]["tools"] == ["Bash", "Write"]
    assert stream.first_model == "m-2" and stream.messages == {"a": (5, 1, 0, 0)}


def test_turns_count_model_responses_not_tool_results_plus_one() -> None:
    # One model response making two parallel tool calls, then a closing one: 2 responses.
    # Claude Code's own num_turns counts tool results + 1, so it says 3.
    def assistant(mid: str, *content: dict[str, Any]) -> dict[str, Any]:
        usage = {"input_tokens": 1, "output_tokens": 1}
        return {
            "type": "assistant",
            "message": {"id": mid, "usage": usage, "content": list(content)},
        }

    def result(tid: str) -> dict[str, Any]:
        block = {"type": "tool_result", "tool_use_id": tid, "content": "ok"}
        return {"type": "user", "message": {"content": [block]}}

    lines = [
        assistant("a", {"type": "tool_use", "id": "t1", "name": "Read", "input": {}}),
        assistant("a", {"type": "tool_use", "id": "t2", "name": "Read", "input": {}}),
        result("t1"),
        result("t2"),
        assistant("b", {"type": "text", "text": "done"}),
        {"type": "result", "subtype": "success", "num_turns": 3, "usage": {}},
    ]
    stream = StreamJson()
    stream.feed("".join(json.dumps(line) + "\n" for line in lines).encode())
    stream.close()
    assert stream.result is not None and stream.result["num_turns"] == 3
    assert turns_of(stream) == 2
    # With no assistant message seen (killed before its first response), the CLI's count is used.
    empty = StreamJson()
    empty.feed(json.dumps({"type": "result", "num_turns": 1, "usage": {}}).encode() + b"\n")
    empty.close()
    assert turns_of(empty) == 1


def test_the_clis_own_synthetic_error_message_is_not_the_turn_1_model() -> None:
    # On a 401 Claude Code writes its error as an assistant message of model "<synthetic>":
    # taking that as the model the first turn ran turned an expired key into "drift".
    error = {
        "type": "assistant",
        "message": {
            "id": "e",
            "model": "<synthetic>",
            "usage": {"input_tokens": 0, "output_tokens": 0},
            "content": [{"type": "text", "text": "Invalid API key · Please run /login"}],
        },
    }
    stream = StreamJson()
    stream.feed((json.dumps(error) + "\n").encode())
    stream.close()
    assert stream.first_model is None
    assert turns_of(stream) == 0  # no model answered
    assert any(e.get("type") == "message" for e in stream.events)  # the text is still kept


def test_argv_carries_the_locks_settings(tmp_path: Path) -> None:
    lock = make_lock(tmp_path, max_turns=3)
    ctx = cli_context(tmp_path, lock, tmp_path, MODEL, instructions="-Fix it.", verify="make check")
    argv = argv_for(ctx, Path("/opt/claude"))
    assert argv[:5] == ["/opt/claude", "-p", "--output-format", "stream-json", "--verbose"]
    flags = dict(zip(argv[5:-2:2], argv[6:-2:2], strict=True))
    assert flags == {"--model": MODEL, "--permission-mode": "bypassPermissions", "--max-turns": "3"}
    # The prompt follows "--", so one starting with a dash is not read as a flag.
    assert argv[-2] == "--" and argv[-1].startswith("-Fix it.") and "make check" in argv[-1]


def test_argv_names_each_plugin_folder(tmp_path: Path) -> None:
    ctx = cli_context(tmp_path, plugin_lock(tmp_path), tmp_path, MODEL)
    argv = argv_for(ctx, Path("/opt/claude"))
    # One --plugin-dir per plugin folder, at the sandbox path it is placed at; loose files skipped.
    dirs = [argv[i + 1] for i, a in enumerate(argv[:-2]) if a == "--plugin-dir"]
    assert dirs == [f"/hangar-home/.claude/plugins/{PLUGIN}"]


def test_install_mounts_cover_the_npm_prefix(claude_bin: Path) -> None:
    mounts = install_mounts(claude_bin)
    prefix = claude_bin.parents[2]  # <prefix>/node_modules/.bin/claude
    assert [m.target for m in mounts] == [str(prefix)]
    assert all(not m.writable for m in mounts)


def test_real_claude_code_edits_the_clone_through_the_proxy(
    claude_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HANGAR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HANGAR_AGENT_BIN_DIR", str(claude_bin.parent))
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    lock = make_lock(tmp_path, max_turns=8)
    clone, base = make_clone(tmp_path)
    with ScriptedEndpoint(fix_calc_script(), MODEL) as endpoint:
        monkeypatch.setenv("HANGAR_ANTHROPIC_BASE_URL", endpoint.base_url)
        run = get_agent("claude-code").run(cli_context(tmp_path, lock, clone, MODEL))
    assert run.error is None, run.output_tail
    assert run.exit_code == 0
    # The real CLI's Edit tool made the change; the Bash tool ran in the sandbox.
    patch = take_patch(clone, base)
    assert "+    return a + b" in patch and "-    return a - b" in patch
    tools = [e["tool"] for e in run.events if e["type"] == "tool_call"]
    assert tools == ["Read", "Edit", "Bash"]
    results = [e for e in run.events if e["type"] == "tool_result"]
    assert len(results) == 3 and "5" in str(results[2]["content"])
    assert run.turns == 4
    assert (run.tokens_in, run.tokens_out) == (4000, 200)
    assert run.cost_usd > 0
    fp = run.fingerprint
    assert fp["adapter"] == "claude-code" and fp["harness"] == lock.ref and fp["cli"] == "claude"
    assert fp["cli_version"] == VERSION and "cli_version" in fp["reported_by_cli"]
    assert fp["model"] == MODEL
    assert {"Bash", "Edit", "Read", "Write"} <= set(fp["tools"])
    # The lock's skill was placed where Claude Code looks, and it listed it.
    (init,) = [e for e in run.events if e["type"] == "init"]
    assert "careful" in init["skills"]
    assert fp["instructions_digest"] == hashlib.sha256(INSTRUCTIONS.encode()).hexdigest()
    assert fp["skills_digest"] == tree_digest(lock.skills_dir)
    # The CLI sent the harness instructions (placed as ~/.claude/CLAUDE.md) to the model.
    conversational = [r for r in endpoint.requests if r["body"].get("tools")]
    assert len(conversational) == 4
    assert INSTRUCTIONS.strip() in json.dumps(conversational[0]["body"])
    # The proxy swapped the placeholder key for the orchestrator's.
    assert {r["headers"].get("x-api-key") for r in endpoint.requests} == {SECRET}
    egress = [
        json.loads(line)
        for line in (tmp_path / "agent-out" / "egress.jsonl").read_text().splitlines()
    ]
    assert len(egress) == len(endpoint.requests)
    assert all(e["status"] == 200 and e["path"].startswith("/v1/") for e in egress)
    assert SECRET not in (tmp_path / "agent-out" / "egress.jsonl").read_text()
    assert SECRET not in json.dumps(run.events) + json.dumps(run.fingerprint) + run.output_tail
    # The harness files stayed out of the repo.
    assert "CLAUDE.md" not in patch and "SKILL.md" not in patch


def test_real_claude_code_loads_the_locks_plugin(
    claude_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HANGAR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HANGAR_AGENT_BIN_DIR", str(claude_bin.parent))
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    lock = plugin_lock(tmp_path)
    clone, _base = make_clone(tmp_path)
    script = Script([Reply(text="Nothing to change.")])
    with ScriptedEndpoint(script, MODEL) as endpoint:
        monkeypatch.setenv("HANGAR_ANTHROPIC_BASE_URL", endpoint.base_url)
        run = get_agent("claude-code").run(cli_context(tmp_path, lock, clone, MODEL))
    assert run.error is None, run.output_tail
    # The CLI itself said it loaded the plugin and its command.
    (init,) = [e for e in run.events if e["type"] == "init"]
    assert f"{PLUGIN}@inline" in init["plugins"]
    assert f"{PLUGIN}:greet" in init["slash_commands"]
    assert run.fingerprint["plugins_loaded"] == [PLUGIN]
    assert run.fingerprint["plugins_digest"] == tree_digest(lock.plugins_dir)


MEDIAN_FIX = (
    "    if len(ordered) % 2 == 0:\n"
    "        return (ordered[mid - 1] + ordered[mid]) / 2\n"
    "    return ordered[mid]"
)
CANARY = "HANGAR-CANARY-00112233445566778899aabbccddeeff"


def median_conversation() -> list[Reply]:
    return [
        Reply(tool_calls=(ToolCall("Read", {"file_path": "stats.py"}),)),
        Reply(
            text="Averaging the two middle values.",
            tool_calls=(
                ToolCall(
                    "Edit",
                    {
                        "file_path": "stats.py",
                        "old_string": "    return ordered[mid]",
                        "new_string": MEDIAN_FIX,
                    },
                ),
            ),
        ),
        # Which key the agent's environment holds (as a digest: traces redact key values).
        Reply(
            tool_calls=(
                ToolCall("Bash", {"command": 'printf %s "$ANTHROPIC_API_KEY" | sha256sum'}),
            )
        ),
        Reply(text="median() now averages the middle pair."),
    ]


@pytest.mark.slow
def test_experiment_runs_real_claude_code_and_grades_its_edit(
    claude_bin: Path, example_dir: Path, tmp_path: Path
) -> None:
    clean = make_lock(tmp_path, "claude-clean")
    # A harness whose instructions carry the canary: it reaches the model only in request bodies.
    leaky_src = tmp_path / "leaky"
    shutil.copytree(clean.path, leaky_src)
    (leaky_src / "harness.yaml").write_text(
        (leaky_src / "harness.yaml").read_text().replace("claude-clean", "claude-leaky")
    )
    (leaky_src / "instructions.md").write_text(f"{INSTRUCTIONS}Reference: {CANARY}\n")
    leaky = freeze(leaky_src, tmp_path / "registry")
    spec = median_spec(example_dir, tmp_path, "claude-e2e", {"clean": clean, "leaky": leaky}, 4096)
    spec["grader"]["canary"] = CANARY
    home = tmp_path / "home"
    script = Script(median_conversation() * 2, usage_per_reply=(500, 40))
    with ScriptedEndpoint(script, MODEL) as endpoint:
        env = {
            "HANGAR_AGENT_BIN_DIR": str(claude_bin.parent),
            "HANGAR_ANTHROPIC_BASE_URL": endpoint.base_url,
            "ANTHROPIC_API_KEY": SECRET,
        }
        ran = hangar(
            "experiment", "run", str(write_spec(example_dir, spec)), "--wait", home=home, env=env
        )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert script.consumed == 8
    got = hangar("experiment", "get", "claude-e2e", "--json", home=home)
    assert got.returncode == 0, got.stderr
    rows = {r["variant"]: r for r in json.loads(got.stdout)["trials"]}
    assert {v: (r["outcome_class"], r["passed"]) for v, r in rows.items()} == {
        "clean": ("completed", True),
        "leaky": ("completed", True),
    }
    assert not rows["clean"]["contamination"]
    assert "egress" in rows["leaky"]["contamination"]

    (clean_art,) = (home / "artifacts").glob("*/clean__median__*/attempt-1")
    assert (
        "+        return (ordered[mid - 1] + ordered[mid]) / 2"
        in (clean_art / "patch.diff").read_text()
    )
    trace = json.loads((clean_art / "trace.json").read_text())
    tools = [e["tool"] for e in trace["events"] if e["type"] == "tool_call"]
    assert tools == ["Read", "Edit", "Bash"]
    assert (trace["turns"], trace["tokens_in"], trace["tokens_out"]) == (4, 2000, 160)
    assert trace["cost_usd"] > 0
    assert trace["fingerprint"]["cli_version"] == VERSION
    assert trace["fingerprint"]["model"] == MODEL
    assert rows["clean"]["drift"] is None  # turn 1 ran what the pin set pinned
    env_dump = [e for e in trace["events"] if e["type"] == "tool_result"][2]["content"]
    assert hashlib.sha256(b"hangar-proxy").hexdigest() in env_dump
    egress = [json.loads(x) for x in (clean_art / "egress.jsonl").read_text().splitlines()]
    assert [e["path"].split("?")[0] for e in egress] == ["/v1/messages"] * 4
    assert all(e["status"] == 200 and e["request_bytes"] > 0 for e in egress)
    # Neither the key nor the raw canary is in anything the trials left behind.
    for f in (home / "artifacts").rglob("*"):
        if f.is_file():
            text = f.read_text(errors="replace")
            assert SECRET not in text and CANARY not in text, f


OTHER_MODEL = "claude-opus-4-5-20251101"


@pytest.mark.parametrize(
    "lock_version,reported_model,summary",
    [
        # The endpoint answers as another model, and the real CLI reports that model.
        (VERSION, OTHER_MODEL, f"harness: model {MODEL!r} -> {OTHER_MODEL!r}"),
        # The lock pins another CLI version than the one installed, which the CLI reports
        # (the test's registry has no harnesses.lock.yaml, so submit lets it through).
        ("2.1.0", None, f"harness: cli_version '2.1.0' -> {VERSION!r}"),
    ],
    ids=["model", "cli_version"],
)
def test_real_claude_code_reporting_other_than_pinned_drifts(
    claude_bin: Path,
    example_dir: Path,
    tmp_path: Path,
    hangar_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    lock_version: str,
    reported_model: str | None,
    summary: str,
) -> None:
    lock = make_lock(tmp_path, "claude-drift", version=lock_version)
    name = f"claude-drift-{lock_version.replace('.', '-')}"
    spec = median_spec(example_dir, tmp_path, name, {"drift": lock}, 4096)
    # Before submit: it refuses a variant whose CLI it cannot find.
    monkeypatch.setenv("HANGAR_AGENT_BIN_DIR", str(claude_bin.parent))
    exp = submit(write_spec(example_dir, spec), Settings.from_env())
    (key,) = exp.trial_keys()
    script = Script([Reply(text="Nothing to change.", model=reported_model)])
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    with ScriptedEndpoint(script, MODEL) as endpoint:
        monkeypatch.setenv("HANGAR_ANTHROPIC_BASE_URL", endpoint.base_url)
        record, _patch = run_trial(
            TrialRequest(exp, key, 1, None, "run-drift"), Settings.from_env()
        )
    assert script.consumed == 1  # the CLI ran and took its scripted answer
    assert (record.outcome_class, record.infra_reason) == ("infra_error", "drift"), record.error
    assert record.drift == summary
    assert record.error is not None and summary in record.error
    assert record.verify_passed is None  # a drifted run is not measured
    fingerprint = record.trace["fingerprint"]
    assert {"cli_version", "model"} <= set(fingerprint["reported_by_cli"])
    assert record.trace["drift"]["environment"] == {}
    # Never retried: running it again would not run what was pinned either.
    store = Store(paths())
    store.put(record)
    plan = plan_retries(
        store.trials(record.experiment_id, all_attempts=True), 1, Settings.from_env().infra_retries
    )
    assert plan.retries == [] and plan.notes == [f"drift is never retried: {record.trial_key}"]


def test_real_claude_code_with_a_refused_key_is_auth_not_drift(
    claude_bin: Path,
    example_dir: Path,
    tmp_path: Path,
    hangar_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Regression: the CLI wrote the 401 as an assistant message of model "<synthetic>", the
    # adapter took that as the turn-1 model, and an expired key ended as drift, never retried
    # and never counted by the breaker.
    lock = make_lock(tmp_path, "claude-auth")
    spec = median_spec(example_dir, tmp_path, "claude-auth", {"auth": lock}, 4096)
    # The CLI retries a refused key with backoff (0.6, 1, 2, 4, 8, 20, 35 s apart) until its
    # time limit: 40 s holds several refusals even on a loaded machine (the first came 3 s in),
    # where median_spec's 120 s spent two minutes on the same outcome.
    spec["environment"]["resources"]["timeout_s"] = 40
    # Before submit: it refuses a variant whose CLI it cannot find.
    monkeypatch.setenv("HANGAR_AGENT_BIN_DIR", str(claude_bin.parent))
    exp = submit(write_spec(example_dir, spec), Settings.from_env())
    (key,) = exp.trial_keys()
    script = Script([Reply(text="Nothing to change.")])
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-expired-0000")
    with ScriptedEndpoint(script, MODEL, api_key=SECRET) as endpoint:
        monkeypatch.setenv("HANGAR_ANTHROPIC_BASE_URL", endpoint.base_url)
        record, _patch = run_trial(TrialRequest(exp, key, 1, None, "run-auth"), Settings.from_env())
    assert script.consumed == 0  # every request was refused before the script was asked
    assert (record.outcome_class, record.infra_reason) == ("infra_error", "auth"), record.error
    assert record.error is not None and "ANTHROPIC_API_KEY" in record.error
    assert "sk-ant-expired" not in json.dumps(record.trace)  # the key never reaches the trace
    store = Store(paths())
    store.put(record)
    plan = plan_retries(
        store.trials(record.experiment_id, all_attempts=True), 1, Settings.from_env().infra_retries
    )
    assert plan.retries == [] and plan.notes == [f"auth is never retried: {record.trial_key}"]


def test_real_claude_code_runs_the_tasks_verify_as_the_verify_step_does(
    claude_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Claude Code runs its Bash tool through a shell snapshot taken with a login shell.
    real_cli_env(monkeypatch, tmp_path, claude_bin.parent, "ANTHROPIC_API_KEY", SECRET)
    clone, _ = make_clone(tmp_path)
    script = Script(
        [Reply(tool_calls=(ToolCall("Bash", {"command": VERIFY_PROBE}),)), Reply(text="Checked.")]
    )
    with ScriptedEndpoint(script, MODEL) as endpoint:
        monkeypatch.setenv("HANGAR_ANTHROPIC_BASE_URL", endpoint.base_url)
        run = get_agent("claude-code").run(cli_context(tmp_path, make_lock(tmp_path), clone, MODEL))
    assert run.error is None, run.output_tail
    assert_verify_ran_as_in_verify(run.events)


@pytest.mark.parametrize(("fault", "reason"), FAULTS)
def test_a_provider_fault_against_real_claude_code_is_named_by_the_proxy_within_60s(
    fault: str, reason: str, claude_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = make_lock(tmp_path, max_turns=8)
    run, log, elapsed = run_against(
        "claude-code",
        claude_bin.parent,
        lock,
        fix_calc_script(),
        MODEL,
        "HANGAR_ANTHROPIC_BASE_URL",
        tmp_path,
        monkeypatch,
        fault,
    )
    assert_named_by_the_proxy(run, log, elapsed, reason)


def test_real_claude_code_answered_by_another_model_is_turn_one_of_that_model(
    claude_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script([Reply(text="done", model="claude-other-2026-01-01")])
    _, log, _ = run_against(
        "claude-code",
        claude_bin.parent,
        make_lock(tmp_path, max_turns=8),
        script,
        MODEL,
        "HANGAR_ANTHROPIC_BASE_URL",
        tmp_path,
        monkeypatch,
    )
    assert first_response_model(log, MODEL) == "claude-other-2026-01-01"


def test_the_locks_provider_retries_reach_real_claude_codes_own_retry_knob(
    claude_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without it the CLI retried a 503 on its own until the proxy stopped it (GIVE_UP_AFTER);
    # max_retries 0 through CLAUDE_CODE_MAX_RETRIES leaves one request.
    agent = {"adapter": "claude-code", "cli": "claude", "version": VERSION}
    lock = freeze_cli_lock(
        tmp_path, "claude-retries", agent, MODEL, approvals="full-auto", provider_retries=NO_RETRIES
    )
    run, log, _ = run_against(
        "claude-code",
        claude_bin.parent,
        lock,
        fix_calc_script(),
        MODEL,
        "HANGAR_ANTHROPIC_BASE_URL",
        tmp_path,
        monkeypatch,
        "503",
    )
    assert run.error is not None, run.output_tail
    assert failed_answers(log) == 1, log
