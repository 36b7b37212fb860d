"""The OpenAI dialects of the scripted endpoint (a STAND-IN, no model behind it).

``POST /v1/chat/completions`` (Chat Completions: mini-swe-agent through
litellm) answers with the script's next reply as one assistant message: its
text as ``content``, its reasoning as ``reasoning_content`` (as litellm reads
it), each tool call as a ``tool_calls`` entry in the OpenAI
shape (``function.arguments`` a JSON string), ``finish_reason`` ``tool_calls``
or ``stop``, and ``usage`` (cached input in ``prompt_tokens_details``). With ``stream: true`` the same message goes out as
``chat.completion.chunk`` events (role, content pieces, tool-call pieces by
index, the finish reason, a usage chunk when ``stream_options.include_usage``
asks for it) ending with ``[DONE]``. Chat Completions clients of these
harnesses make no side calls, so every request takes the next scripted reply.

``POST /v1/responses`` (the Responses API: Codex) answers with a response
whose output holds a ``reasoning`` item (its summary: the reply's reasoning),
a ``message`` item for the text and a ``function_call``
item per tool call (a ``custom_tool_call`` when the request offered that tool
as a freeform ``custom`` tool, its ``input`` taken from the call's ``input``
argument). Streamed, it is the event sequence Codex reads:
``response.created``, per item ``response.output_item.added``, the text as
``response.output_text.delta`` pieces (arguments as
``response.function_call_arguments.delta``), ``response.output_item.done``,
then ``response.completed`` with ``usage``. A Responses request that offers
no tools is a side call: it gets a short answer without consuming the script.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from hangar_dagster.standins.model.script import Reply, ToolCall, stream_pieces
from hangar_dagster.standins.model.server import ResponseWriter, ScriptedEndpoint, error_body


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _arguments(call: ToolCall) -> str:
    return json.dumps(call.arguments)


# Chat Completions


def chat_completions(endpoint: ScriptedEndpoint, body: dict[str, Any], out: ResponseWriter) -> None:
    if not isinstance(body.get("messages"), list):
        out.send_json(400, error_body("invalid_request_error", "messages: field required"))
        return
    reply = endpoint.next_reply(conversational=True)
    sent = endpoint.usage_sent("/v1/chat/completions", reply, True)
    usage = {
        "prompt_tokens": sent.tokens_in,
        "completion_tokens": sent.tokens_out,
        "total_tokens": sent.tokens_in + sent.tokens_out,
        "prompt_tokens_details": {"cached_tokens": sent.cached_in},
    }
    calls: list[dict[str, Any]] = [
        {
            "id": _id("call"),
            "type": "function",
            "function": {"name": call.name, "arguments": _arguments(call)},
        }
        for call in reply.tool_calls
    ]
    finish = "tool_calls" if calls else "stop"
    head = {
        "id": _id("chatcmpl"),
        "created": int(time.time()),
        "model": endpoint.model_of(reply),
        "system_fingerprint": "hangar-scripted-standin",
    }
    if not body.get("stream"):
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if reply.reasoning:
            message["reasoning_content"] = reply.reasoning
        if calls:
            message["tool_calls"] = calls
        choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        out.send_json(
            200, {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
        )
        return

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> None:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        out.send_sse(None, {**head, "object": "chat.completion.chunk", "choices": [choice]})

    out.start_sse()
    chunk({"role": "assistant", "content": ""})
    for piece in stream_pieces(reply.reasoning) if reply.reasoning else []:
        chunk({"reasoning_content": piece})
    if reply.text:
        for piece in stream_pieces(reply.text):
            chunk({"content": piece})
    for index, call in enumerate(calls):
        function = call["function"]
        opening = {**call, "index": index, "function": {"name": function["name"], "arguments": ""}}
        chunk({"tool_calls": [opening]})
        for piece in stream_pieces(function["arguments"]):
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    chunk({}, finish)
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        out.send_sse(
            None, {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}
        )
    out.send_sse(None, "[DONE]")
    out.end()


# Responses


def _custom_tools(body: dict[str, Any]) -> set[str]:
    """Names of the freeform (``custom``) tools the request offers, such as Codex's apply_patch."""
    tools = body.get("tools")
    if not isinstance(tools, list):
        return set()
    return {
        t["name"]
        for t in tools
        if isinstance(t, dict) and t.get("type") == "custom" and isinstance(t.get("name"), str)
    }


def _output_items(reply: Reply, custom: set[str]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.reasoning:
        items.append(
            {
                "id": _id("rs"),
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": reply.reasoning}],
            }
        )
    if reply.text:
        items.append(
            {
                "id": _id("msg"),
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
            }
        )
    for call in reply.tool_calls:
        if call.name in custom:
            raw = call.arguments.get("input", "")
            items.append(
                {
                    "id": _id("ctc"),
                    "type": "custom_tool_call",
                    "status": "completed",
                    "call_id": _id("call"),
                    "name": call.name,
                    "input": raw if isinstance(raw, str) else json.dumps(raw),
                }
            )
        else:
            items.append(
                {
                    "id": _id("fc"),
                    "type": "function_call",
                    "status": "completed",
                    "call_id": _id("call"),
                    "name": call.name,
                    "arguments": _arguments(call),
                }
            )
    return items


def responses(endpoint: ScriptedEndpoint, body: dict[str, Any], out: ResponseWriter) -> None:
    if "input" not in body:
        out.send_json(400, error_body("invalid_request_error", "input: field required"))
        return
    conversational = bool(body.get("tools"))
    reply = endpoint.next_reply(conversational=conversational)
    sent = endpoint.usage_sent("/v1/responses", reply, conversational)
    items = _output_items(reply, _custom_tools(body))
    response: dict[str, Any] = {
        "id": _id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": endpoint.model_of(reply),
        "output": items,
        "usage": {
            "input_tokens": sent.tokens_in,
            "input_tokens_details": {"cached_tokens": sent.cached_in},
            "output_tokens": sent.tokens_out,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": sent.tokens_in + sent.tokens_out,
        },
    }
    if not body.get("stream"):
        out.send_json(200, response)
        return

    sequence = 0

    def event(kind: str, data: dict[str, Any]) -> None:
        nonlocal sequence
        out.send_sse(kind, {"type": kind, "sequence_number": sequence, **data})
        sequence += 1

    out.start_sse()
    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    event("response.created", {"response": opening})
    event("response.in_progress", {"response": opening})
    for index, item in enumerate(items):
        where = {"output_index": index, "item_id": item["id"]}
        if item["type"] == "message":
            text = item["content"][0]["text"]
            event(
                "response.output_item.added",
                {"output_index": index, "item": {**item, "status": "in_progress", "content": []}},
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            event("response.content_part.added", {**where, "content_index": 0, "part": part})
            for piece in stream_pieces(text):
                event("response.output_text.delta", {**where, "content_index": 0, "delta": piece})
            event("response.output_text.done", {**where, "content_index": 0, "text": text})
            done_part = {**part, "text": text}
            event("response.content_part.done", {**where, "content_index": 0, "part": done_part})
        elif item["type"] == "reasoning":
            text = item["summary"][0]["text"]
            event(
                "response.output_item.added",
                {"output_index": index, "item": {**item, "summary": []}},
            )
            part = {"type": "summary_text", "text": ""}
            event(
                "response.reasoning_summary_part.added", {**where, "summary_index": 0, "part": part}
            )
            for piece in stream_pieces(text):
                event(
                    "response.reasoning_summary_text.delta",
                    {**where, "summary_index": 0, "delta": piece},
                )
            event(
                "response.reasoning_summary_text.done", {**where, "summary_index": 0, "text": text}
            )
            event(
                "response.reasoning_summary_part.done",
                {**where, "summary_index": 0, "part": {**part, "text": text}},
            )
        elif item["type"] == "function_call":
            started = {**item, "status": "in_progress", "arguments": ""}
            event("response.output_item.added", {"output_index": index, "item": started})
            for piece in stream_pieces(item["arguments"]):
                event("response.function_call_arguments.delta", {**where, "delta": piece})
            event(
                "response.function_call_arguments.done", {**where, "arguments": item["arguments"]}
            )
        else:
            started = {**item, "status": "in_progress", "input": ""}
            event("response.output_item.added", {"output_index": index, "item": started})
            for piece in stream_pieces(item["input"]):
                event("response.custom_tool_call_input.delta", {**where, "delta": piece})
            event("response.custom_tool_call_input.done", {**where, "input": item["input"]})
        event("response.output_item.done", {"output_index": index, "item": item})
    event("response.completed", {"response": response})
    out.end()
