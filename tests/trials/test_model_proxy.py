"""The model API bridge: the host proxy (key injection, streaming, egress log) and the in-sandbox
loopback forwarder, against the scripted stand-in endpoint on host loopback."""

from __future__ import annotations

import dataclasses
import http.client
import json
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hangar_dagster.environment.egress import NO_EGRESS
from hangar_dagster.experiment.harness import freeze
from hangar_dagster.settings import Settings
from hangar_dagster.standins.model import Reply, Script, ScriptedEndpoint, ToolCall
from hangar_dagster.trials.agents import AgentContext
from hangar_dagster.trials.model_proxy import (
    GIVE_UP_AFTER,
    PLACEHOLDER_KEY,
    ModelAccessError,
    clip_body,
    first_request_tools,
    first_response_model,
    model_access,
    provider_failure,
    response_tokens,
    upstream_url,
)
from hangar_dagster.trials.sandbox import SandboxRequest, get_sandbox

pytestmark = pytest.mark.unit

SECRET = "sk-ant-proxy-test-key-never-in-a-sandbox"
MODEL = "claude-sonnet-4-5-20250929"
BODY = {
    "model": MODEL,
    "max_tokens": 100,
    "stream": True,
    "tools": [{"name": "Write"}],
    "messages": [{"role": "user", "content": "marker-in-the-body"}],
}


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost")
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self.unix_path)
        self.sock = sock


def context(tmp_path: Path, backend: str = "bwrap") -> AgentContext:
    src = tmp_path / "h"
    src.mkdir()
    manifest = {
        "name": "h",
        "agent": {"adapter": "command", "command": "true", "cli": "sh", "version": "1"},
    }
    (src / "harness.yaml").write_text(yaml.safe_dump({**manifest, "model": MODEL}))
    return AgentContext(
        trial_key="v/t/1",
        task_id="t",
        seed="s",
        workdir=tmp_path,
        harness=freeze(src, tmp_path / "registry"),
        model=MODEL,
        instructions="",
        verify=None,
        timeout_s=60,
        memory_mb=1024,
        sandbox=get_sandbox(backend),
        egress=NO_EGRESS,
        out_dir=tmp_path / "agent-out",
        settings=Settings.from_env(),
    )


def egress_lines(ctx: AgentContext) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (ctx.out_dir / "egress.jsonl").read_text().splitlines()]


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Any:
    script = Script([Reply(tool_calls=(ToolCall("Write", {"file_path": "a", "content": "b"}),))])
    with ScriptedEndpoint(script, MODEL) as ep:
        monkeypatch.setenv("HANGAR_ANTHROPIC_BASE_URL", ep.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
        yield ep


def test_the_proxy_swaps_the_key_streams_and_logs(
    endpoint: ScriptedEndpoint, tmp_path: Path
) -> None:
    ctx = context(tmp_path)
    with model_access("anthropic", ctx) as access:
        assert access.env == {"ANTHROPIC_API_KEY": PLACEHOLDER_KEY}
        (mount,) = access.mounts
        conn = UnixHTTPConnection(str(mount.source / Path(access.socket).name))
        conn.request(
            "POST",
            "/v1/messages?beta=true",
            body=json.dumps(BODY),
            headers={
                "x-api-key": PLACEHOLDER_KEY,
                "Authorization": "Bearer nope",
                "Content-Type": "application/json",
            },
        )
        resp = conn.getresponse()
        streamed = resp.read().decode()
        conn.close()
    assert not mount.source.exists()  # the scratch socket dir goes with the block
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
    assert streamed.count("event: content_block_delta") >= 1 and "event: message_stop" in streamed
    (seen,) = endpoint.requests
    assert seen["headers"]["x-api-key"] == SECRET and "authorization" not in seen["headers"]
    assert seen["path"] == "/v1/messages" and seen["body"] == BODY
    (entry,) = egress_lines(ctx)
    assert entry["method"] == "POST" and entry["path"] == "/v1/messages?beta=true"
    assert entry["status"] == 200 and entry["provider"] == "anthropic"
    assert entry["request_bytes"] == len(json.dumps(BODY)) and entry["response_bytes"] == len(
        streamed
    )
    assert "marker-in-the-body" in entry["body"] and not entry["body_clipped"]
    assert SECRET not in (ctx.out_dir / "egress.jsonl").read_text()


@pytest.mark.needs_sandbox("bwrap")
def test_a_sandbox_without_network_reaches_the_endpoint_through_the_forwarder(
    endpoint: ScriptedEndpoint, tmp_path: Path
) -> None:
    ctx = context(tmp_path)
    client = (
        "import json, os, urllib.request\n"
        "req = urllib.request.Request(os.environ['BASE'] + '/v1/messages', "
        "data=json.dumps({'messages': [], 'tools': [1], 'model': 'x'}).encode(), "
        "headers={'x-api-key': os.environ['ANTHROPIC_API_KEY']})\n"
        "print(json.load(urllib.request.urlopen(req))['content'][0]['name'])\n"
        "print(os.environ['ANTHROPIC_API_KEY'])\n"
    )
    with model_access("anthropic", ctx) as access:
        result = ctx.sandbox.run(
            SandboxRequest(
                argv=access.wrap([sys.executable, "-I", "-c", client]),
                workdir=tmp_path,
                env={"PATH": "/usr/bin:/bin", "BASE": access.base_url, **access.env},
                timeout_s=60,
                mounts=access.mounts,
                network=False,
            )
        )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == ["Write", PLACEHOLDER_KEY]
    assert endpoint.requests[0]["headers"]["x-api-key"] == SECRET
    assert [e["status"] for e in egress_lines(ctx)] == [200]


@pytest.mark.needs_sandbox("bwrap")
def test_the_forwarder_passes_on_the_exit_status(
    endpoint: ScriptedEndpoint, tmp_path: Path
) -> None:
    ctx = context(tmp_path)
    with model_access("anthropic", ctx) as access:
        result = ctx.sandbox.run(
            SandboxRequest(
                argv=access.wrap(["/bin/sh", "-c", "echo out; exit 7"]),
                workdir=tmp_path,
                env={"PATH": "/usr/bin:/bin"},
                timeout_s=60,
                mounts=access.mounts,
            )
        )
    assert (result.exit_code, result.stdout) == (7, "out\n")


def test_an_unreachable_upstream_is_a_502_and_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HANGAR_OPENAI_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    ctx = context(tmp_path)
    with model_access("openai", ctx) as access:
        assert access.env == {"OPENAI_API_KEY": PLACEHOLDER_KEY}
        conn = UnixHTTPConnection(str(access.mounts[0].source / "api.sock"))
        conn.request("POST", "/v1/chat/completions", body=b"{}")
        resp = conn.getresponse()
        answer = json.loads(resp.read())
        conn.close()
    assert resp.status == 502 and "unreachable" in answer["error"]["message"]
    (entry,) = egress_lines(ctx)
    assert entry["status"] == 502 and "unreachable" in entry["error"]


def test_upstream_url_names_the_variable_to_fix() -> None:
    assert upstream_url("anthropic", Settings.from_env({})) == "https://api.anthropic.com"
    assert (
        upstream_url("openai", Settings.from_env({"HANGAR_OPENAI_BASE_URL": "http://127.0.0.1:9/"}))
        == "http://127.0.0.1:9"
    )
    with pytest.raises(ModelAccessError, match="HANGAR_ANTHROPIC_BASE_URL"):
        upstream_url("anthropic", Settings.from_env({"HANGAR_ANTHROPIC_BASE_URL": "ftp://x"}))


def test_long_bodies_keep_their_head_and_their_tail() -> None:
    text = "H" * 50 + "m" * 10_000 + "T" * 50
    clipped, cut = clip_body(text, cap=400)
    assert cut and clipped.startswith("H" * 50) and clipped.endswith("T" * 50)
    assert len(clipped) < 500 and "characters cut" in clipped
    assert clip_body("short", cap=400) == ("short", False)


def test_tools_come_from_the_first_logged_request() -> None:
    tools = [{"type": "function", "name": "b"}, {"type": "web_search"}]
    chat_tools = [{"type": "function", "function": {"name": "bash"}}]
    lines: list[dict[str, Any]] = [
        {"path": "/v1/models", "body": ""},
        {"path": "/v1/responses", "body": json.dumps({"tools": tools}), "body_clipped": False},
        {"path": "/v1/responses", "body": json.dumps({"tools": []})},
        {"path": "/v1/chat/completions?x=1", "body": json.dumps({"tools": chat_tools})},
    ]
    log = "\n".join(json.dumps(x) for x in lines)
    assert first_request_tools(log, "/responses") == ["b", "web_search"]
    assert first_request_tools(log, "/chat/completions") == ["bash"]
    assert first_request_tools(log, "/messages") is None
    clipped = {**lines[1], "body_clipped": True}
    assert first_request_tools(json.dumps(clipped), "/responses") is None


def test_a_refused_key_is_auth_naming_the_variable_to_fix_not_a_measurement() -> None:
    ok = json.dumps(
        {"provider": "anthropic", "method": "POST", "path": "/v1/messages", "status": 200}
    )
    for provider, path, status, var in (
        ("anthropic", "/v1/messages", 401, "ANTHROPIC_API_KEY"),
        ("openai", "/v1/responses", 403, "OPENAI_API_KEY"),
    ):
        refused = json.dumps(
            {"provider": provider, "method": "POST", "path": path, "status": status}
        )
        found = provider_failure("\n".join([ok, refused]))
        assert found is not None, (provider, status)
        reason, message = found
        assert reason == "auth"
        assert f"POST {path}" in message and str(status) in message
        assert var in message and "orchestrator" in message


def test_a_provider_that_gave_up_the_agent_is_an_outage_not_a_measurement() -> None:
    ok = json.dumps({"method": "POST", "path": "/v1/messages", "status": 200})
    busy = json.dumps({"method": "POST", "path": "/v1/messages", "status": 529})
    limited = json.dumps({"method": "POST", "path": "/v1/responses", "status": 429})
    gone = json.dumps({"method": "POST", "path": "/v1/messages", "status": 502, "error": "refused"})
    assert provider_failure("\n".join([ok, busy])) == (
        "provider_5xx",
        "the provider answered POST /v1/messages with 529",
    )
    assert provider_failure("\n".join([ok, limited]))[0] == "rate_limit"  # type: ignore[index]
    assert provider_failure(gone) == (
        "provider_5xx",
        "the provider answered POST /v1/messages with 502: refused",
    )
    # The last answer decides: a 5xx the CLI retried past is no outage; nor is no request.
    assert provider_failure("\n".join([busy, ok])) is None
    assert provider_failure("") is None and provider_failure("not json\n") is None


def _ask(access: Any, model: str = MODEL) -> tuple[int, str]:
    (mount,) = access.mounts
    conn = UnixHTTPConnection(str(mount.source / Path(access.socket).name))
    conn.request(
        "POST",
        "/v1/messages",
        body=json.dumps({**BODY, "model": model}),
        headers={"Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    data = resp.read().decode(errors="replace")
    conn.close()
    return resp.status, data


def test_each_answers_tokens_reach_the_throttle_as_it_passes(
    endpoint: ScriptedEndpoint, tmp_path: Path
) -> None:
    seen: list[int] = []
    failing = [False]

    def count(n: int) -> None:
        if failing[0]:
            raise OSError("tally unreachable")
        seen.append(n)

    ctx = dataclasses.replace(context(tmp_path), on_tokens=count)
    with model_access("anthropic", ctx) as access:
        assert _ask(access)[0] == 200
        failing[0] = True
        assert _ask(access)[0] == 200  # a count that fails never fails the answer
    sent = [s["tokens_in"] - s["cached_tokens_in"] + s["tokens_out"] for s in endpoint.sent]
    first, second = egress_lines(ctx)
    assert seen == [first["tokens"]] == sent[:1] and seen[0] > 0
    assert second["tokens"] == sent[1]
    assert "OSError: tally unreachable" in second["live_tokens_error"]


def test_answer_tokens_are_read_in_each_providers_dialect() -> None:
    chat = {"choices": [], "usage": {"prompt_tokens": 120, "completion_tokens": 30}}
    assert response_tokens("application/json", json.dumps(chat).encode()) == 150
    stream = (
        'event: message_start\ndata: {"type": "message_start", "message": {"usage": '
        '{"input_tokens": 900, "output_tokens": 1}}}\n\n'
        'event: message_delta\ndata: {"type": "message_delta", "usage": {"output_tokens": 40}}\n\n'
        'event: message_delta\ndata: {"type": "message_delta", "usage": {"output_tokens": 75}}\n\n'
    )
    assert response_tokens("text/event-stream", stream.encode()) == 975  # output is cumulative
    responses = (
        'data: {"type": "response.completed", "response": {"usage": '
        '{"input_tokens": 10, "output_tokens": 5}}}\n\ndata: [DONE]\n\n'
    )
    assert response_tokens("text/event-stream; charset=utf-8", responses.encode()) == 15
    assert response_tokens("application/json", b"not json") == 0


def test_the_turn_1_model_is_what_the_provider_answered_not_what_was_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    script = Script([Reply(text="side"), Reply(text="hi", model="claude-other-2026-01-01")])
    with ScriptedEndpoint(script, MODEL) as ep:
        monkeypatch.setenv("HANGAR_ANTHROPIC_BASE_URL", ep.base_url)
        ctx = context(tmp_path)
        with model_access("anthropic", ctx) as access:
            assert _ask(access, "claude-haiku-side")[0] == 200  # a side request, answered first
            assert _ask(access)[0] == 200
    side, main = egress_lines(ctx)
    assert main["request_model"] == MODEL and main["response_model"] == "claude-other-2026-01-01"
    assert "stream_error" not in main and "stream_error" not in side
    log = (ctx.out_dir / "egress.jsonl").read_text()
    # The answer to the pinned model's request decides, not the side request answered first.
    assert first_response_model(log, MODEL) == "claude-other-2026-01-01"
    assert side["response_model"] == MODEL and first_response_model(log) == MODEL
    assert provider_failure(log) is None


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("cut", "provider_stream"),
        ("malformed", "provider_stream"),
        ("503", "provider_5xx"),
        ("429", "rate_limit"),
        ("401", "auth"),
    ],
)
def test_a_provider_fault_is_named_by_the_proxy(
    fault: str, reason: str, endpoint: ScriptedEndpoint, tmp_path: Path
) -> None:
    endpoint.fault = fault
    ctx = context(tmp_path)
    with model_access("anthropic", ctx) as access:
        status, _ = _ask(access)
    assert status == (200 if not fault.isdigit() else int(fault))
    found = provider_failure((ctx.out_dir / "egress.jsonl").read_text())
    assert found is not None and found[0] == reason, found


@pytest.mark.parametrize(("fault", "asked"), [("503", 3), ("429", 3), ("401", 1)])
def test_the_proxy_stops_the_agent_against_a_dead_provider(
    fault: str, asked: int, endpoint: ScriptedEndpoint, tmp_path: Path
) -> None:
    endpoint.fault = fault
    ctx = context(tmp_path)
    with model_access("anthropic", ctx) as access:
        for n in range(1, asked + 1):
            assert not access.cancel.wait(0.5) or n > asked, f"gave up after {n - 1}"
            _ask(access)
        # GIVE_UP_AFTER 5xx/429 in a row, or the first 401: the agent's sandbox is cancelled.
        assert access.cancel.wait(2)
    assert len(endpoint.requests) == asked == (1 if fault == "401" else GIVE_UP_AFTER)


def test_a_provider_that_recovers_is_not_given_up_on(
    endpoint: ScriptedEndpoint, tmp_path: Path
) -> None:
    ctx = context(tmp_path)
    with model_access("anthropic", ctx) as access:
        for _ in range(GIVE_UP_AFTER - 1):
            endpoint.fault = "503"
            _ask(access)
            endpoint.fault = None
            _ask(access)
        assert not access.cancel.wait(0.5)
