"""The Anthropic Messages API dialect of the scripted endpoint (a STAND-IN, no model behind it).

``POST /v1/messages`` answers with the script's next reply as one assistant
message: its reasoning as a ``thinking`` block, its text as a ``text`` block, each tool call as a ``tool_use`` block,
``stop_reason`` ``tool_use`` when it calls tools and ``end_turn`` otherwise.
With ``stream: true`` the same message is sent as the API's server-sent
events: ``message_start``, per block ``content_block_start`` / ``_delta``
(``thinking_delta`` then ``signature_delta``, ``text_delta``, or
``input_json_delta`` pieces of the tool input) / ``_stop``,
then ``message_delta`` (stop reason, output tokens) and ``message_stop``.
Cached input is reported as the API does, apart: ``cache_read_input_tokens``,
with ``input_tokens`` the rest.

A request that offers no tools is a side call (Claude Code's title and quota
probes, for instance): it gets a short text answer without consuming the script.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from hangar_dagster.standins.model.script import Reply, stream_pieces
from hangar_dagster.standins.model.server import ResponseWriter, ScriptedEndpoint, error_body


def _blocks(reply: Reply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.reasoning:
        blocks.append(
            {"type": "thinking", "thinking": reply.reasoning, "signature": "scripted-standin"}
        )
    if reply.text:
        blocks.append({"type": "text", "text": reply.text})
    for call in reply.tool_calls:
        blocks.append(
            {
                "type": "tool_use",
                "id": f"toolu_{uuid.uuid4().hex[:24]}",
                "name": call.name,
                "input": call.arguments,
            }
        )
    return blocks


def messages(endpoint: ScriptedEndpoint, body: dict[str, Any], out: ResponseWriter) -> None:
    if not isinstance(body.get("messages"), list):
        out.send_json(400, error_body("invalid_request_error", "messages: field required"))
        return
    conversational = bool(body.get("tools"))
    reply = endpoint.next_reply(conversational=conversational)
    sent = endpoint.usage_sent("/v1/messages", reply, conversational)
    tokens_out = sent.tokens_out
    blocks = _blocks(reply)
    stop_reason = "tool_use" if reply.tool_calls else "end_turn"
    # Anthropic counts cache reads apart from input_tokens.
    usage = {
        "input_tokens": sent.tokens_in - sent.cached_in,
        "output_tokens": tokens_out,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": sent.cached_in,
    }
    message: dict[str, Any] = {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": endpoint.model_of(reply),
        "content": blocks,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage,
    }
    if not body.get("stream"):
        out.send_json(200, message)
        return
    out.start_sse()
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    out.send_sse("message_start", {"type": "message_start", "message": start})
    out.send_sse("ping", {"type": "ping"})
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in stream_pieces(block["text"])]
        elif block["type"] == "thinking":
            opening = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": p} for p in stream_pieces(block["thinking"])
            ] + [{"type": "signature_delta", "signature": block["signature"]}]
        else:
            opening = {**block, "input": {}}
            deltas = [
                {"type": "input_json_delta", "partial_json": p}
                for p in stream_pieces(json.dumps(block["input"]))
            ]
        out.send_sse(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": opening},
        )
        for delta in deltas:
            out.send_sse(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
        out.send_sse("content_block_stop", {"type": "content_block_stop", "index": index})
    out.send_sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": tokens_out},
        },
    )
    out.send_sse("message_stop", {"type": "message_stop"})
    out.end()


def count_tokens(endpoint: ScriptedEndpoint, body: dict[str, Any], out: ResponseWriter) -> None:
    """A rough count (4 characters a token): no tokenizer stands behind the stand-in."""
    del endpoint
    text = json.dumps([body.get("system"), body.get("messages"), body.get("tools")])
    out.send_json(200, {"input_tokens": max(1, len(text) // 4)})
