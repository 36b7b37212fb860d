"""The HTTP core of the scripted model endpoint (a STAND-IN for a model provider, no model behind it).

``ScriptedEndpoint`` serves on loopback in a background thread. Each API
dialect is a handler in ``ROUTES`` (path -> ``"module:function"``, imported on
first use) with the signature ``handle(endpoint, body, out)``: ``body`` is the
request's JSON body (``{}`` for a GET) and ``out`` a ``ResponseWriter`` that
sends one JSON answer or a server-sent event stream. Every request is recorded
in ``endpoint.requests`` (path, method, model, body, headers), and the usage
each answer reported in ``endpoint.sent`` (what a trace's totals are checked
against: the endpoint's own word, not numbers copied into a test).

Requests that are not part of the scripted conversation (an agent CLI's side
calls: titles, quota probes, requests that offer no tools) are answered with
``SIDE_REPLY`` and do not consume a scripted reply; each dialect decides which
requests are conversational and calls ``endpoint.next_reply``.
"""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Callable
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from hangar_dagster.standins.model.script import Reply, Script, Usage
from hangar_dagster.util.background import ServerThread

ROUTES: dict[str, str] = {
    "/v1/messages": "hangar_dagster.standins.model.anthropic:messages",
    "/v1/messages/count_tokens": "hangar_dagster.standins.model.anthropic:count_tokens",
    "/v1/models": "hangar_dagster.standins.model.server:models",
    "/v1/chat/completions": "hangar_dagster.standins.model.openai:chat_completions",
    "/v1/responses": "hangar_dagster.standins.model.openai:responses",
}

SIDE_REPLY = Reply(text="(scripted stand-in endpoint: side request answered without the script)")
MAX_BODY = 50_000_000  # bytes of a request body accepted

Handler = Callable[["ScriptedEndpoint", dict[str, Any], "ResponseWriter"], None]


class ResponseWriter:
    """One response: either ``send_json`` once, or ``start_sse``, ``send_sse``... and ``end``."""

    def __init__(self, handler: BaseHTTPRequestHandler) -> None:
        self._h = handler
        self.started = False
        self.streaming = False
        self.ended = False

    def send_json(self, status: int, obj: Any) -> None:
        self._begin()
        data = json.dumps(obj).encode()
        self._h.send_response(status)
        self._h.send_header("Content-Type", "application/json")
        self._h.send_header("Content-Length", str(len(data)))
        self._h.end_headers()
        self._h.wfile.write(data)
        self._h.wfile.flush()
        self.ended = True

    def start_sse(self) -> None:
        self._begin()
        self.streaming = True
        self._h.send_response(200)
        self._h.send_header("Content-Type", "text/event-stream")
        self._h.send_header("Cache-Control", "no-cache")
        self._h.send_header("Transfer-Encoding", "chunked")
        self._h.end_headers()

    def send_sse(self, event: str | None, data: Any) -> None:
        """One event; ``data`` is sent as is when a string (e.g. ``[DONE]``), else as JSON."""
        if not self.streaming or self.ended:
            raise RuntimeError("send_sse needs start_sse first and no end() yet")
        text = data if isinstance(data, str) else json.dumps(data)
        frame = (f"event: {event}\n" if event else "") + f"data: {text}\n\n"
        self._chunk(frame.encode())

    def end(self) -> None:
        if self.streaming and not self.ended:
            self._chunk(b"")  # the zero-length chunk closes a chunked body
        self.ended = True

    def _begin(self) -> None:
        if self.started:
            raise RuntimeError("a response was already started for this request")
        self.started = True

    def _chunk(self, data: bytes) -> None:
        self._h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self._h.wfile.flush()


def error_body(kind: str, message: str) -> dict[str, Any]:
    """An error in the shape both provider APIs' clients read (type + error.message)."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def models(endpoint: ScriptedEndpoint, body: dict[str, Any], out: ResponseWriter) -> None:
    """``GET /v1/models``: the endpoint's one model, in a shape both providers' clients read."""
    del body
    entry = {
        "id": endpoint.model,
        "type": "model",
        "object": "model",
        "display_name": f"{endpoint.model} (scripted stand-in)",
        "created_at": "2026-01-01T00:00:00Z",
        "created": 1767225600,
        "owned_by": "hangar-scripted-standin",
    }
    out.send_json(
        200,
        {
            "object": "list",
            "data": [entry],
            "has_more": False,
            "first_id": endpoint.model,
            "last_id": endpoint.model,
        },
    )


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:
        self._serve(read_body=False)

    def do_POST(self) -> None:
        self._serve(read_body=True)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # requests are recorded in endpoint.requests instead

    def _serve(self, read_body: bool) -> None:
        endpoint = self.server.endpoint
        out = ResponseWriter(self)
        path = urlsplit(self.path).path.rstrip("/") or "/"
        body: dict[str, Any] = {}
        if read_body:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self.close_connection = True
                out.send_json(413, error_body("request_too_large", f"body over {MAX_BODY} bytes"))
                return
            raw = self.rfile.read(length) if length else b"{}"
            try:
                parsed = json.loads(raw or b"{}")
            except ValueError:
                out.send_json(400, error_body("invalid_request_error", "body is not JSON"))
                return
            if not isinstance(parsed, dict):
                out.send_json(400, error_body("invalid_request_error", "body must be an object"))
                return
            body = parsed
        endpoint.record(self.command, path, body, dict(self.headers.items()))
        if endpoint.api_key is not None and not endpoint.key_matches(self.headers):
            out.send_json(401, error_body("authentication_error", "invalid x-api-key"))
            return
        if endpoint.fault is not None and path in CONVERSATIONAL:
            self._fail_as(endpoint.fault, out)
            return
        handler = endpoint.handler_for(path)
        if handler is None:
            out.send_json(404, error_body("not_found_error", f"no route for {path}"))
            return
        try:
            handler(endpoint, body, out)
        except Exception as err:  # a broken script or dialect must answer, not hang the client
            if not out.started:
                out.send_json(500, error_body("api_error", f"{type(err).__name__}: {err}"))
                return
            self.close_connection = True
        if out.streaming:
            out.end()

    def _fail_as(self, fault: str, out: ResponseWriter) -> None:
        self.close_connection = True
        if fault.isdigit():
            out.send_json(int(fault), error_body("api_error", f"scripted fault {fault}"))
            return
        cut = fault == "cut"
        data = (
            b'event: message_start\ndata: {"type": "message_start", "message": {"model": "x"'
            if cut
            else b'{"id": "broken", "model": '
        )
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if cut else "application/json")
        if not cut:
            self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


CONVERSATIONAL = frozenset({"/v1/messages", "/v1/chat/completions", "/v1/responses"})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    endpoint: ScriptedEndpoint


class ScriptedEndpoint:
    """A stand-in model API on loopback that answers from ``script`` as model ``model``."""

    def __init__(
        self,
        script: Script,
        model: str,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
    ) -> None:
        self.script = script
        self.model = model
        # When set, a request carrying any other key is answered 401, as a provider answers an
        # expired or wrong key (x-api-key, or Authorization: Bearer).
        self.api_key = api_key
        # When set, every conversational request fails this way (provider-fault tests): an HTTP
        # status ("503", "429", "401"), "cut" (a 200 event stream broken off before its end) or
        # "malformed" (a 200 whose JSON body does not parse).
        self.fault: str | None = None
        self.host = host
        self.port = port
        self.requests: list[dict[str, Any]] = []
        # Per answer sent: path, conversational, model, tokens_in (cached included), tokens_out,
        # cached_tokens_in, and the reply's tool calls and reasoning.
        self.sent: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._handlers: dict[str, Handler] = {}
        self._serving: ServerThread[_Server] | None = None

    @property
    def base_url(self) -> str:
        if self._serving is None:
            raise RuntimeError("the endpoint is not started")
        return f"http://{self.host}:{self._serving.server.server_port}"

    def start(self) -> str:
        """Start serving in a background thread; returns the base URL (``http://host:port``)."""
        if self._serving is None:
            server = _Server((self.host, self.port), _RequestHandler)
            server.endpoint = self
            self._serving = ServerThread(server, "scripted-endpoint")
        return self.base_url

    def stop(self) -> None:
        if self._serving is not None:
            self._serving.stop()
            self._serving = None

    def __enter__(self) -> ScriptedEndpoint:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def record(self, method: str, path: str, body: dict[str, Any], headers: dict[str, str]) -> None:
        model = body.get("model")
        entry = {
            "method": method,
            "path": path,
            "model": model if isinstance(model, str) else None,
            "body": body,
            "headers": {k.lower(): v for k, v in headers.items()},
        }
        with self._lock:
            self.requests.append(entry)

    def key_matches(self, headers: Message) -> bool:
        bearer = headers.get("Authorization", "")
        sent = headers.get("x-api-key") or bearer.removeprefix("Bearer ").strip()
        return sent == self.api_key

    def next_reply(self, conversational: bool) -> Reply:
        """The script's next reply for a conversational request, ``SIDE_REPLY`` otherwise."""
        return self.script.next_reply() if conversational else SIDE_REPLY

    def usage_sent(self, path: str, reply: Reply, conversational: bool) -> Usage:
        """The usage to report for ``reply``, recorded in ``sent`` as it goes out."""
        usage = self.script.usage_of(reply)
        entry = {
            "path": path,
            "conversational": conversational,
            "model": self.model_of(reply),
            "tokens_in": usage.tokens_in,
            "tokens_out": usage.tokens_out,
            "cached_tokens_in": usage.cached_in,
            "tool_calls": [call.name for call in reply.tool_calls],
            "reasoning": reply.reasoning,
        }
        with self._lock:
            self.sent.append(entry)
        return usage

    def sent_totals(self, conversational_only: bool = True) -> dict[str, int]:
        """Responses and token sums over ``sent`` (the conversational ones by default)."""
        with self._lock:
            rows = [r for r in self.sent if r["conversational"] or not conversational_only]
        keys = ("tokens_in", "tokens_out", "cached_tokens_in")
        return {"responses": len(rows), **{k: sum(r[k] for r in rows) for k in keys}}

    def model_of(self, reply: Reply) -> str:
        """The model id reported for ``reply`` (its own override, else the endpoint's)."""
        return reply.model or self.model

    def handler_for(self, path: str) -> Handler | None:
        target = ROUTES.get(path)
        if target is None:
            return None
        with self._lock:
            if path not in self._handlers:
                module, function = target.split(":")
                self._handlers[path] = getattr(importlib.import_module(module), function)
            return self._handlers[path]
