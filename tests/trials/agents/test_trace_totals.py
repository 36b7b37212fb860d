"""Traces that add up (issue 17, item 5), for each real agent CLI.

Every model response is a ``turn`` with its tokens (cached ones apart), whether
or not it called a tool; every tool call the model made is a ``tool_call``,
a refused one marked ``refused``; reasoning is a ``reasoning`` event; the run's
totals are the sum of its turns, and they equal what the scripted STAND-IN
endpoint recorded it sent (``endpoint.sent``), not numbers copied into the test.
The parsers are also checked on output saved from these real runs (samples/).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hangar_dagster.standins.model import Reply, Script, ScriptedEndpoint, ToolCall
from hangar_dagster.trials.agents import AgentRun, get_agent, prices
from hangar_dagster.trials.agents.claude_code import StreamJson, transcript_usage
from hangar_dagster.trials.agents.codex import calls_not_shown, estimate_cost, parse_session
from hangar_dagster.trials.agents.mini_swe import parse_trajectory
from hangar_dagster.trials.agents.run_common import turn_totals
from tests.agent_clis import VERSIONS, ensure_npm_cli, ensure_pip_cli
from tests.gitfixtures import make_clone
from tests.trials.agents.cli_locks import cli_context, freeze_cli_lock

SAMPLES = Path(__file__).parent / "samples"
GPT = "gpt-5-2025-08-07"
CLAUDE = "claude-sonnet-4-5-20250929"
REASONING = "Think: read calc.py first."

pytestmark = pytest.mark.integration
needs_bwrap = pytest.mark.needs_sandbox("bwrap")


def turns_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "turn"]


# ---- parsers, on saved output of the real CLIs ----------------------------------------


@pytest.mark.unit
def test_mini_response_without_a_tool_call_is_a_turn_with_its_tokens() -> None:
    # Reply 2 of the saved run had no tool call: mini answered it with a FormatError.
    traj = parse_trajectory((SAMPLES / "mini-trajectory-no-tool-call.json").read_text())
    turns = turns_of(traj.events)
    assert len(turns) == traj.turns == traj.api_calls == 4
    assert [(t["tokens_in"], t["tokens_out"], t["cached_tokens_in"]) for t in turns] == [
        (1000, 50, 600),
        (1200, 30, 900),
        (1300, 40, 1000),
        (1400, 20, 1100),
    ]
    assert turn_totals(traj.events) == (4, (traj.tokens_in, traj.tokens_out, traj.cached_in))
    # The per-turn costs are litellm's and add up to mini's own total.
    assert sum(t["cost_usd"] for t in turns) == pytest.approx(traj.cost_usd)
    after_second = traj.events[traj.events.index(turns[1]) + 1]
    assert after_second == {"type": "message", "text": "I think it subtracts."}
    assert [e["text"] for e in traj.events if e["type"] == "reasoning"] == [REASONING]


@pytest.mark.unit
def test_codex_call_to_a_tool_it_did_not_offer_is_in_the_trace_refused() -> None:
    session = parse_session((SAMPLES / "codex-session-refused-call.jsonl").read_text())
    shown = calls_not_shown(session)
    assert [(e["type"], e.get("tool"), e.get("refused")) for e in shown] == [
        ("tool_call", "fetch_url", True),
        ("tool_result", None, None),
    ]
    assert shown[1]["content"] == "unsupported call: fetch_url" and shown[1]["is_error"]
    # Each response's usage, cached input apart, from the session file.
    assert [session.usage[r] for r in session.responses] == [
        (1000, 50, 600),
        (1200, 30, 900),
        (1300, 40, 1000),
        (1400, 20, 1100),
    ]


@pytest.mark.unit
def test_codex_cost_prices_cached_input_at_the_cached_price() -> None:
    # gpt-5: 1.25 USD per million input, 0.125 cached, 10 output (prices.OPENAI).
    assert estimate_cost(GPT, 1_000_000, 0, 1_000_000) == pytest.approx(0.125)
    assert estimate_cost(GPT, 1000, 50, 600) == pytest.approx(
        (400 * 1.25 + 600 * 0.125 + 500) / 1e6
    )
    assert isinstance(estimate_cost("some-local-model", 10, 10, 5), prices.UnknownCost)
    # Anthropic: cache reads at 0.1x, writes at 1.25x the input price.
    assert prices.cost(prices.ANTHROPIC, CLAUDE, 300, 0, 100, 100) == pytest.approx(
        (100 * 3.0 + 100 * 0.3 + 100 * 3.75) / 1e6
    )


@pytest.mark.unit
def test_claude_turns_take_their_final_usage_from_the_transcript(tmp_path: Path) -> None:
    stream = StreamJson()
    stream.feed((SAMPLES / "claude-stream.jsonl").read_bytes())
    stream.close()
    # The stream gives each message its usage as the response began: one output token.
    assert {t["tokens_out"] for t in turns_of(stream.events)} == {1}
    session_id = (stream.init or {})["session_id"]
    project = tmp_path / ".claude" / "projects" / "-clone"
    project.mkdir(parents=True)
    (project / f"{session_id}.jsonl").write_bytes(
        (SAMPLES / "claude-transcript.jsonl").read_bytes()
    )
    assert stream.settle(transcript_usage(tmp_path, session_id))
    turns = turns_of(stream.events)
    assert [(t["tokens_in"], t["tokens_out"], t["cached_tokens_in"]) for t in turns] == [
        (1000, 50, 600),
        (1300, 40, 1000),
        (1400, 20, 1100),
    ]
    result = stream.result or {}
    usage = result["usage"]
    _, (tokens_in, tokens_out, cached_in) = turn_totals(stream.events)
    assert tokens_out == usage["output_tokens"] and cached_in == usage["cache_read_input_tokens"]
    assert tokens_in == usage["input_tokens"] + usage["cache_read_input_tokens"]
    assert [e["text"] for e in stream.events if e["type"] == "reasoning"] == [REASONING]


@pytest.mark.unit
def test_a_transcript_through_a_symlink_is_not_read(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "s1.jsonl").write_bytes((SAMPLES / "claude-transcript.jsonl").read_bytes())
    (tmp_path / "home" / ".claude" / "projects").mkdir(parents=True)
    (tmp_path / "home" / ".claude" / "projects" / "x").symlink_to(elsewhere)
    assert transcript_usage(tmp_path / "home", "s1") == {}


@pytest.mark.unit
def test_the_endpoint_records_the_usage_it_sent_and_reports_cached_tokens_apart() -> None:
    script = Script([Reply(text="hi", reasoning="hm", usage=(50, 5, 30))], usage_per_reply=(7, 1))
    with ScriptedEndpoint(script, CLAUDE) as endpoint:
        import urllib.request

        body = {"model": CLAUDE, "messages": [], "tools": [{"name": "Bash"}]}
        request = urllib.request.Request(
            f"{endpoint.base_url}/v1/messages",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            message = json.loads(response.read())
    assert (
        message["usage"]["input_tokens"] == 20 and message["usage"]["cache_read_input_tokens"] == 30
    )
    assert message["content"][0] == {
        "type": "thinking",
        "thinking": "hm",
        "signature": "scripted-standin",
    }
    assert endpoint.sent_totals() == {
        "responses": 1,
        "tokens_in": 50,
        "tokens_out": 5,
        "cached_tokens_in": 30,
    }


# ---- one real run per CLI: totals against what the endpoint sent ----------------------


def run_cli(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    binary: Path,
    agent: dict[str, str],
    model: str,
    replies: list[Reply],
    base_url_var: str,
    memory_mb: int = 4096,
) -> tuple[AgentRun, ScriptedEndpoint]:
    monkeypatch.setenv("HANGAR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HANGAR_AGENT_BIN_DIR", str(binary.parent))
    lock = freeze_cli_lock(tmp_path, f"{agent['adapter']}-totals", agent, model)
    clone, _ = make_clone(tmp_path)
    with ScriptedEndpoint(Script(replies), model) as endpoint:
        monkeypatch.setenv(base_url_var, endpoint.base_url)
        run = get_agent(agent["adapter"]).run(cli_context(tmp_path, lock, clone, model, memory_mb))
    assert run.error is None, run.output_tail
    return run, endpoint


def assert_totals_match_what_was_sent(run: AgentRun, endpoint: ScriptedEndpoint) -> None:
    sent = [s for s in endpoint.sent if s["conversational"]]
    turns = turns_of(run.events)
    assert [(t["tokens_in"], t["tokens_out"], t["cached_tokens_in"]) for t in turns] == [
        (s["tokens_in"], s["tokens_out"], s["cached_tokens_in"]) for s in sent
    ]
    totals = endpoint.sent_totals()
    assert turn_totals(run.events) == (
        run.turns,
        (run.tokens_in, run.tokens_out, run.cached_tokens_in),
    )
    assert (run.turns, run.tokens_in, run.tokens_out, run.cached_tokens_in) == (
        totals["responses"],
        totals["tokens_in"],
        totals["tokens_out"],
        totals["cached_tokens_in"],
    )
    assert [e["text"] for e in run.events if e["type"] == "reasoning"] == [
        s["reasoning"] for s in sent if s["reasoning"]
    ]
    # Every tool call the model made is in the trace; the one to a tool not offered, refused.
    calls = [e for e in run.events if e["type"] == "tool_call"]
    assert len(calls) == sum(len(s["tool_calls"]) for s in sent)
    assert [c["tool"] for c in calls if c.get("refused")] == ["fetch_url"]


@needs_bwrap
def test_real_codex_trace_adds_up_with_a_refused_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = ensure_npm_cli("@openai/codex", VERSIONS["@openai/codex"], "codex")
    shell = lambda cmd: ToolCall("exec_command", {"cmd": cmd})  # noqa: E731
    replies = [
        Reply(
            text="Looking.",
            reasoning=REASONING,
            tool_calls=(shell("cat calc.py"),),
            usage=(1000, 50, 600),
        ),
        Reply(tool_calls=(ToolCall("fetch_url", {"url": "http://x"}),), usage=(1200, 30, 900)),
        Reply(tool_calls=(shell("sed -i 's/a - b/a + b/' calc.py"),), usage=(1300, 40, 1000)),
        Reply(text="add() now adds.", usage=(1400, 20, 1100)),
    ]
    agent = {"adapter": "codex", "cli": "codex", "version": VERSIONS["@openai/codex"]}
    run, endpoint = run_cli(
        tmp_path, monkeypatch, binary, agent, GPT, replies, "HANGAR_OPENAI_BASE_URL", 8192
    )
    assert_totals_match_what_was_sent(run, endpoint)
    calls = [e for e in run.events if e["type"] == "tool_call"]
    assert sorted(str(c["tool"]) for c in calls) == ["fetch_url", "shell", "shell"]
    assert run.cost_usd == pytest.approx(
        estimate_cost(GPT, run.tokens_in, run.tokens_out, run.cached_tokens_in)
    )
    assert run.cost_usd < estimate_cost(GPT, run.tokens_in, run.tokens_out)  # the discount


@needs_bwrap
def test_real_mini_trace_adds_up_with_a_response_without_a_tool_call_and_a_refused_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = ensure_pip_cli("mini-swe-agent", VERSIONS["mini-swe-agent"], "mini")
    bash = lambda cmd: (ToolCall("bash", {"command": cmd}),)  # noqa: E731
    replies = [
        Reply(
            text="THOUGHT: read.",
            reasoning=REASONING,
            tool_calls=bash("cat calc.py"),
            usage=(1000, 50, 600),
        ),
        Reply(text="I think it subtracts.", usage=(1200, 30, 900)),
        Reply(tool_calls=(ToolCall("fetch_url", {"url": "http://x"}),), usage=(1250, 35, 950)),
        Reply(
            text="THOUGHT: fix.",
            tool_calls=bash("sed -i 's/a - b/a + b/' calc.py"),
            usage=(1300, 40, 1000),
        ),
        Reply(
            tool_calls=bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"), usage=(1400, 20, 1100)
        ),
    ]
    agent = {
        "adapter": "mini-swe-agent",
        "cli": "mini-swe-agent",
        "version": VERSIONS["mini-swe-agent"],
    }
    run, endpoint = run_cli(
        tmp_path, monkeypatch, binary, agent, GPT, replies, "HANGAR_OPENAI_BASE_URL"
    )
    assert_totals_match_what_was_sent(run, endpoint)
    assert len([e for e in run.events if e["type"] == "tool_call"]) == 4
    # mini's own (litellm) cost, with cached input at OpenAI's cached price: the same table.
    assert run.cost_usd == pytest.approx(
        estimate_cost(GPT, run.tokens_in, run.tokens_out, run.cached_tokens_in)
    )


@needs_bwrap
def test_real_claude_code_trace_adds_up_with_thinking_and_a_refused_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = "@anthropic-ai/claude-code"
    binary = ensure_npm_cli(package, VERSIONS[package], "claude")
    edit = {"file_path": "calc.py", "old_string": "a - b", "new_string": "a + b"}
    replies = [
        Reply(
            text="Reading.",
            reasoning=REASONING,
            tool_calls=(ToolCall("Read", {"file_path": "calc.py"}),),
            usage=(1000, 50, 600),
        ),
        Reply(tool_calls=(ToolCall("fetch_url", {"url": "http://x"}),), usage=(1200, 30, 900)),
        Reply(tool_calls=(ToolCall("Edit", edit),), usage=(1300, 40, 1000)),
        Reply(text="add() now adds.", usage=(1400, 20, 1100)),
    ]
    agent = {"adapter": "claude-code", "cli": "claude", "version": VERSIONS[package]}
    run, endpoint = run_cli(
        tmp_path, monkeypatch, binary, agent, CLAUDE, replies, "HANGAR_ANTHROPIC_BASE_URL"
    )
    assert_totals_match_what_was_sent(run, endpoint)
    assert [e["tool"] for e in run.events if e["type"] == "tool_call"] == [
        "Read",
        "fetch_url",
        "Edit",
    ]
    # Claude Code reports its own cost; it prices cache reads as Anthropic does.
    assert run.cost_usd == pytest.approx(
        prices.cost(prices.ANTHROPIC, CLAUDE, run.tokens_in, run.tokens_out, run.cached_tokens_in)
    )


@pytest.mark.unit
def test_reasoning_is_redacted_like_the_rest_of_the_trace() -> None:
    from hangar_dagster.trials.redact import redact

    key = "sk-proj-" + "abcdefghijklmnopqrstuvwx0123"
    events = parse_trajectory(
        (SAMPLES / "mini-trajectory-no-tool-call.json").read_text().replace(REASONING, key)
    ).events
    (reasoning,) = [e for e in events if e["type"] == "reasoning"]
    assert reasoning["text"] == key  # the parser keeps it; the trial writer's pass masks it
    assert key not in json.dumps(redact({"events": events}, None, []))


@pytest.mark.unit
def test_mini_call_to_a_tool_it_has_not_is_in_the_trace_refused() -> None:
    # Saved run: reply 2 called fetch_url; mini ran nothing and answered with a FormatError.
    traj = parse_trajectory((SAMPLES / "mini-trajectory-unknown-tool.json").read_text())
    calls = [e for e in traj.events if e["type"] == "tool_call"]
    assert [(c["tool"], c.get("refused", False)) for c in calls] == [
        ("bash", False),
        ("fetch_url", True),
        ("bash", False),
        ("bash", False),
    ]
    assert json.loads(calls[1]["input"]) == {"url": "http://x"}
    assert traj.turns == traj.api_calls == 4


@pytest.mark.unit
def test_claude_call_to_a_tool_it_has_not_is_marked_refused() -> None:
    stream = StreamJson()
    lines = [
        {
            "type": "assistant",
            "message": {
                "id": "m1",
                "model": CLAUDE,
                "usage": {"input_tokens": 5, "output_tokens": 1},
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "fetch_url", "input": {}},
                    {"type": "tool_use", "id": "t2", "name": "Bash", "input": {"command": "x"}},
                ],
            },
        },
        {
            "type": "user",
            "message": {
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "is_error": True,
                        "content": "<tool_use_error>Error: No such tool available: fetch_url"
                        "</tool_use_error>",
                    },
                    {"type": "tool_result", "tool_use_id": "t2", "is_error": True, "content": "1"},
                ]
            },
        },
    ]
    stream.feed("".join(json.dumps(line) + "\n" for line in lines).encode())
    calls = [e for e in stream.events if e["type"] == "tool_call"]
    assert [(c["tool"], c.get("refused", False)) for c in calls] == [
        ("fetch_url", True),
        ("Bash", False),  # a failed command is an error, not a refusal
    ]


@needs_bwrap
def test_real_mini_with_a_model_nobody_prices_stores_its_cost_as_unknown_with_an_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: litellm has no price for a local model, mini reports 0, and hangar stored
    cost_usd 0.0: an unpriced model's trials looked free to every budget."""
    binary = ensure_pip_cli("mini-swe-agent", VERSIONS["mini-swe-agent"], "mini")
    replies = [
        Reply(
            tool_calls=(
                ToolCall("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
            ),
            usage=(1000, 50, 0),
        )
    ]
    agent = {
        "adapter": "mini-swe-agent",
        "cli": "mini-swe-agent",
        "version": VERSIONS["mini-swe-agent"],
    }
    model = "qwen-local-7b"
    run, _ = run_cli(tmp_path, monkeypatch, binary, agent, model, replies, "HANGAR_OPENAI_BASE_URL")
    assert run.cost_unknown is not None and f"no list price for {model!r}" in run.cost_unknown
    expected = prices.upper_estimate(
        [prices.ANTHROPIC, prices.OPENAI], model, run.tokens_in, run.tokens_out
    )
    assert run.tokens_in == 1000 and expected.estimate_usd > 0
    assert run.cost_usd == pytest.approx(expected.estimate_usd)
    assert any("cost unknown, estimated at" in str(e.get("text")) for e in run.events)
