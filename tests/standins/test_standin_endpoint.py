"""The scripted stand-in endpoint over real HTTP on loopback: the Anthropic Messages dialect,
streaming and not, side requests, the model list, errors, and the foreground command."""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hangar_dagster.standins.model import Reply, Script, ScriptedEndpoint, ScriptError, ToolCall
from hangar_dagster.standins.model.server import SIDE_REPLY

pytestmark = pytest.mark.unit

MODEL = "claude-sonnet-4-5-20250929"
TOOLS = [{"name": "Write", "input_schema": {"type": "object"}}]
WRITE = ToolCall("Write", {"file_path": "notes/a.txt", "content": "line one\nline two\n" * 5})


def post(endpoint: ScriptedEndpoint, path: str, body: Any) -> tuple[int, str, str]:
    """(status, content type, body text) of one POST to the endpoint."""
    conn = http.client.HTTPConnection(endpoint.host, int(endpoint.base_url.rsplit(":", 1)[1]))
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    text = resp.read().decode()
    conn.close()
    return resp.status, resp.getheader("Content-Type") or "", text


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for frame in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def messages_body(stream: bool, tools: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 1000,
        "stream": stream,
        "messages": [{"role": "user", "content": "Fix it."}],
    }
    if tools:
        body["tools"] = TOOLS
    return body


def test_a_streamed_tool_call_arrives_as_the_messages_api_events() -> None:
    script = Script(
        [Reply(text="Writing the notes now.", tool_calls=(WRITE,))], usage_per_reply=(77, 9)
    )
    with ScriptedEndpoint(script, MODEL) as endpoint:
        status, ctype, text = post(endpoint, "/v1/messages?beta=true", messages_body(stream=True))
    assert status == 200 and ctype == "text/event-stream"
    events = sse_events(text)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert (
        start["model"] == MODEL and start["content"] == [] and start["usage"]["input_tokens"] == 77
    )
    # Rebuild each content block from its deltas, as a client does.
    blocks: dict[int, dict[str, Any]] = {}
    for name, data in events:
        if name == "content_block_start":
            blocks[data["index"]] = {**data["content_block"], "text": "", "json": ""}
        elif name == "content_block_delta":
            delta = data["delta"]
            key = "text" if delta["type"] == "text_delta" else "json"
            blocks[data["index"]][key] += delta.get("text") or delta.get("partial_json")
    text_block, tool_block = blocks[0], blocks[1]
    assert text_block["type"] == "text" and text_block["text"] == "Writing the notes now."
    assert tool_block["type"] == "tool_use" and tool_block["name"] == "Write"
    assert tool_block["id"].startswith("toolu_")
    assert json.loads(tool_block["json"]) == WRITE.arguments
    # The input was streamed in several pieces, not one.
    assert sum(1 for n, d in events if n == "content_block_delta" and d["index"] == 1) > 3
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "tool_use" and delta["usage"]["output_tokens"] == 9


def test_replies_in_order_then_final_and_side_requests_do_not_consume_them() -> None:
    script = Script(
        [Reply(tool_calls=(WRITE,)), Reply(text="All done.", model="claude-other-2026-01-01")],
        final=Reply(text="Nothing more."),
    )
    with ScriptedEndpoint(script, MODEL) as endpoint:
        answers = []
        for tools in (False, True, False, True, True, True):
            status, _, text = post(endpoint, "/v1/messages", messages_body(False, tools))
            assert status == 200
            answers.append(json.loads(text))
        recorded = list(endpoint.requests)
    side = [a["content"][0]["text"] for a in (answers[0], answers[2])]
    assert side == [SIDE_REPLY.text] * 2
    first = answers[1]
    assert first["stop_reason"] == "tool_use"
    assert first["content"] == [
        {
            "type": "tool_use",
            "id": first["content"][0]["id"],
            "name": "Write",
            "input": WRITE.arguments,
        }
    ]
    assert (answers[3]["content"][0]["text"], answers[3]["model"]) == (
        "All done.",
        "claude-other-2026-01-01",
    )
    assert answers[3]["stop_reason"] == "end_turn"
    assert [a["content"][0]["text"] for a in answers[4:]] == ["Nothing more."] * 2
    assert answers[4]["model"] == MODEL
    assert script.consumed == 2
    assert [(r["method"], r["path"], r["model"]) for r in recorded] == [
        ("POST", "/v1/messages", MODEL)
    ] * 6
    assert recorded[1]["body"]["tools"] == TOOLS


def test_models_errors_and_token_counts() -> None:
    with ScriptedEndpoint(Script([]), MODEL) as endpoint:
        conn = http.client.HTTPConnection(endpoint.host, int(endpoint.base_url.rsplit(":", 1)[1]))
        conn.request("GET", "/v1/models")
        models = json.loads(conn.getresponse().read())
        conn.close()
        missing = post(endpoint, "/v1/nothing", {})
        bad_json = post(endpoint, "/v1/messages", b"{not json")
        no_messages = post(endpoint, "/v1/messages", {"model": MODEL})
        counted = post(endpoint, "/v1/messages/count_tokens", messages_body(False))
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert "stand-in" in models["data"][0]["display_name"]
    assert missing[0] == 404 and "/v1/nothing" in json.loads(missing[2])["error"]["message"]
    assert bad_json[0] == 400 and no_messages[0] == 400
    assert "messages" in json.loads(no_messages[2])["error"]["message"]
    assert counted[0] == 200 and json.loads(counted[2])["input_tokens"] > 0


def _ignore_stop_signals() -> None:
    # What a test process hands its children after an in-process Dagster run under a
    # background shell: the shell ignores SIGINT, and Dagster copies SIGINT's disposition onto
    # SIGTERM; exec keeps an ignored signal ignored.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


@pytest.mark.parametrize("inherited", ["default", "sigterm_ignored_by_the_parent"])
def test_the_module_runs_in_the_foreground_and_prints_its_url(
    tmp_path: Path, inherited: str
) -> None:
    script = tmp_path / "script.yaml"
    script.write_text("replies:\n  - text: hello from the script\n")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hangar_dagster.standins.model",
            "--script",
            str(script),
            "--model",
            MODEL,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ignore_stop_signals if inherited != "default" else None,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        conn = http.client.HTTPConnection(url.removeprefix("http://"))
        conn.request("POST", "/v1/messages", body=json.dumps(messages_body(False)))
        answer = json.loads(conn.getresponse().read())
        conn.close()
        assert answer["content"][0]["text"] == "hello from the script"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("the endpoint outlived SIGTERM by 10 s")


def test_a_bad_script_file_is_refused_naming_the_field(tmp_path: Path) -> None:
    script = tmp_path / "bad.yaml"
    script.write_text("replies:\n  - tool_calls: [{name: Write, arguments: [1]}]\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hangar_dagster.standins.model",
            "--script",
            str(script),
            "--model",
            MODEL,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "replies[0].tool_calls[0].arguments" in done.stderr


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ([], "expected a mapping"),
        ({"replies": [{}]}, "replies[0]: a reply needs text"),
        ({"replies": [{"text": 1}]}, "replies[0].text"),
        ({"replies": [{"text": "a", "mood": "x"}]}, "unknown field(s) mood"),
        ({"replies": [], "usage_per_reply": [1]}, "usage_per_reply"),
        ({"final": {"tool_calls": [{"arguments": {}}]}}, "final.tool_calls[0]: needs a 'name'"),
    ],
)
def test_script_errors_name_the_field(data: Any, field: str) -> None:
    with pytest.raises(ScriptError, match=re.escape(field)):
        Script.from_data(data)


def test_script_from_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "replies:\n"
        "  - text: one\n"
        "    tool_calls: [{name: Edit, arguments: {file_path: a.py}}]\n"
        "    model: m-2\n"
        "final: {text: bye}\n"
        "usage_per_reply: [10, 2]\n"
    )
    script = Script.from_file(path)
    assert script.next_reply() == Reply("one", (ToolCall("Edit", {"file_path": "a.py"}),), "m-2")
    assert script.next_reply() == Reply("bye") == script.next_reply()
    assert script.usage_per_reply == (10, 2, 0)
