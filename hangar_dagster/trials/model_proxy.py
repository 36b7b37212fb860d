"""How an agent in a sandbox with no network reaches its model API, without ever holding the key.

The agent's sandbox keeps its own network namespace (loopback only). Two
pieces bridge it to the provider:

- on the host, ``ModelProxy``: a small HTTP reverse proxy listening on a unix
  socket in a scratch directory. It forwards each request to the upstream
  base URL (``HANGAR_ANTHROPIC_BASE_URL`` / ``HANGAR_OPENAI_BASE_URL``,
  defaults https://api.anthropic.com and https://api.openai.com), drops
  whatever credential the agent sent and adds the real key from the
  orchestrator's own ``ANTHROPIC_API_KEY`` / ``OPENAI_API_KEY``, streams the
  response back as it arrives, and appends one JSON line per request to
  ``<out_dir>/egress.jsonl`` (method, path, status, byte counts, duration and
  the request body text, cut to its head and tail: the canary is searched there,
  and ``first_request_tools`` reads from it the tools the agent first offered);
- in the sandbox, the forwarder (``trials/forwarder.py``, also
  ``python -m hangar_dagster.trials.model_proxy forward``): listens on
  ``127.0.0.1:<port>`` inside the sandbox's own loopback, relays every
  connection byte for byte to the unix socket (its directory is mounted in),
  and runs the agent CLI as its child, exiting with its status. The egress
  proxy (environment/egress.py) is reached through the same forwarder.

So the CLI is pointed at ``http://127.0.0.1:<port>`` with a placeholder key
(``hangar-proxy``); the real key stays in the orchestrator's process.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import socketserver
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from hangar_dagster.settings import (
    ANTHROPIC_BASE_URL_VAR,
    ANTHROPIC_KEY_VAR,
    OPENAI_BASE_URL_VAR,
    OPENAI_KEY_VAR,
    Settings,
)
from hangar_dagster.trials import forwarder
from hangar_dagster.trials.sandbox import Mount
from hangar_dagster.util.background import ServerThread

if TYPE_CHECKING:
    from hangar_dagster.trials.agents import AgentContext

Provider = Literal["anthropic", "openai"]

UPSTREAM_VARS: dict[Provider, tuple[str, str]] = {
    "anthropic": (ANTHROPIC_BASE_URL_VAR, "https://api.anthropic.com"),
    "openai": (OPENAI_BASE_URL_VAR, "https://api.openai.com"),
}
KEY_VARS: dict[Provider, str] = {"anthropic": ANTHROPIC_KEY_VAR, "openai": OPENAI_KEY_VAR}
PLACEHOLDER_KEY = "hangar-proxy"  # what the CLI sees as its key; the proxy replaces it
SOCKET_MOUNT = "/hangar-model-api"
SOCKET_NAME = "api.sock"
EGRESS_NAME = "egress.jsonl"
BODY_CAP = 64_000  # characters of a request body kept in the egress log: head and tail
MAX_REQUEST = 50_000_000  # bytes of a request body the proxy accepts
UPSTREAM_TIMEOUT_S = 600.0
RESPONSE_PEEK = 2_000_000  # bytes of a 2xx answer kept to read its model and check it is whole
# The proxy stops the agent after this many 5xx/429 (or cut/malformed) answers in a row, or at the first 401/403:
# a CLI's own retries (minutes, for some) would only hold the trial against a dead provider.
GIVE_UP_AFTER = 3
# How each streaming dialect says a response is complete; a stream ending before it was cut.
STREAM_ENDS = ("message_stop", "[DONE]", "response.completed", "response.incomplete")
# Credentials the agent may send: dropped, the proxy sets the real one.
AUTH_HEADERS = {"x-api-key", "authorization", "api-key"}
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "accept-encoding",
}


class ModelAccessError(ValueError):
    """The model API cannot be bridged as configured; the message names the variable to fix."""


def upstream_url(provider: Provider, settings: Settings) -> str:
    """``settings``' base URL for ``provider`` (``HANGAR_<PROVIDER>_BASE_URL``), else its own."""
    var, default = UPSTREAM_VARS[provider]
    url = settings.provider_base_url(provider) or default
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ModelAccessError(f"{var}={url!r}: expected an http(s) base URL such as {default}")
    return url.rstrip("/")


def clip_body(text: str, cap: int = BODY_CAP) -> tuple[str, bool]:
    """``text``, or its first quarter and last three quarters of ``cap`` with a marker between.

    The tail is kept longest: in an agent's conversation the newest tool
    result, where leaked text would first show, is at the end of the body.
    """
    if len(text) <= cap:
        return text, False
    head, tail = cap // 4, cap - cap // 4
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut by hangar ...]\n{text[-tail:]}", True


_EGRESS_LOCK = threading.Lock()  # every EgressLog of the process: two proxies share one file


@dataclass
class EgressLog:
    """Appends one JSON object per proxied request to ``path`` (thread-safe).

    The model proxy and the egress proxy of one trial write the same file: each line goes out
    in one ``write`` on an O_APPEND descriptor, under one lock for the process, so lines of
    the two never interleave, however long (a model request's body is up to 64 kB).
    """

    path: Path

    def write(self, entry: dict[str, Any]) -> None:
        data = (json.dumps(entry, sort_keys=True) + "\n").encode()
        with _EGRESS_LOCK:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)


def _find_model(obj: Any, depth: int = 0) -> str | None:
    """The ``model`` an answer names: at its top, or one level in (message_start, response.*)."""
    if not isinstance(obj, dict) or depth > 2:
        return None
    if isinstance(obj.get("model"), str) and obj["model"]:
        return str(obj["model"])
    for value in obj.values():
        if isinstance(value, dict) and (found := _find_model(value, depth + 1)):
            return found
    return None


def inspect_response(content_type: str, data: bytes, whole: bool) -> tuple[str | None, str | None]:
    """(the model the answer names, why it is broken) of a 2xx answer's first ``data`` bytes.

    A JSON body must parse; an event stream must reach its dialect's last event
    (``STREAM_ENDS``). ``whole`` is False when more than was kept came: then only the model
    is read.
    """
    text = data.decode("utf-8", errors="replace")
    if "text/event-stream" in content_type:
        model = None
        for line in text.splitlines():
            if line.startswith("data:") and model is None:
                try:
                    model = _find_model(json.loads(line[5:].strip()))
                except ValueError:
                    pass
        ended = any(end in text for end in STREAM_ENDS)
        return model, None if ended or not whole else "the event stream ended before its last event"
    if "json" in content_type:
        if not whole:
            return None, None
        try:
            return _find_model(json.loads(text)), None
        except ValueError:
            return None, "the body is not valid JSON"
    return None, None


def _usages(obj: Any, depth: int = 0) -> Iterator[dict[str, Any]]:
    """Every ``usage`` object an answer's JSON holds, at its top or a few levels in."""
    if not isinstance(obj, dict) or depth > 3:
        return
    if isinstance(obj.get("usage"), dict):
        yield obj["usage"]
    for value in obj.values():
        if isinstance(value, dict):
            yield from _usages(value, depth + 1)


def response_tokens(content_type: str, data: bytes) -> int:
    """Input plus output tokens a 2xx answer reports, from its JSON body or its event stream.

    Anthropic's stream says its input in ``message_start`` and its output so far, cumulative,
    in each ``message_delta``; OpenAI's chat and responses APIs say both in a final ``usage``.
    So the largest of each seen counts; 0 when the answer says none.
    """
    text = data.decode("utf-8", errors="replace")
    if "text/event-stream" in content_type:
        chunks = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    else:
        chunks = [text]
    read_in = read_out = 0
    for chunk in chunks:
        try:
            obj = json.loads(chunk)
        except ValueError:
            continue
        for usage in _usages(obj):
            got_in = usage.get("input_tokens", usage.get("prompt_tokens"))
            got_out = usage.get("output_tokens", usage.get("completion_tokens"))
            if isinstance(got_in, int):
                read_in = max(read_in, got_in)
            if isinstance(got_out, int):
                read_out = max(read_out, got_out)
    return read_in + read_out


def log_entries(egress_text: str) -> list[dict[str, Any]]:
    """The JSON objects of an ``egress.jsonl``, in order (a torn or foreign line is skipped).
    The egress proxy's lines (``source: egress-proxy``) share the file with the model proxy's."""
    entries = []
    for line in egress_text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def first_response_model(egress_text: str, asked: str | None = None) -> str | None:
    """The model the provider's first answer named, from the proxy's log.

    The first answer to a request for ``asked`` (the pinned model) when there is one: a CLI's
    side requests (Claude Code's title model) ask for others. Else the first answer naming any.
    """
    answers = [
        (entry.get("request_model"), str(entry["response_model"]))
        for entry in log_entries(egress_text)
        if entry.get("response_model")
    ]
    for requested, answered in answers:
        if asked is not None and requested == asked:
            return answered
    return answers[0][1] if answers else None


def provider_failure(egress_text: str) -> tuple[str, str] | None:
    """(infra reason, message) when the provider's last answer was a 5xx, a 429, a 401/403,
    or a 2xx cut off mid-stream or with a malformed body (``provider_stream``).

    Asked only of an agent that did not finish well: a CLI retries on its own, so a
    last answer of 5xx or 429 means it gave up on the provider, which is an outage the
    breaker counts (docs/queue.md), not a measurement of the agent.
    """
    # The model proxy's lines only: the egress proxy's (the mirror's answers) share the file.
    answered = [
        entry
        for entry in log_entries(egress_text)
        if entry.get("source") != "egress-proxy" and isinstance(entry.get("status"), int)
    ]
    last = answered[-1] if answered else None
    if last is None:
        return None
    status, where = last["status"], f"{last.get('method', '?')} {last.get('path', '?')}"
    if status in (401, 403):
        named = [var for p, var in KEY_VARS.items() if p == last.get("provider")]
        key = named[0] if named else "the provider's API key"
        return "auth", (
            f"the provider refused the key for {where} ({status}): set a valid {key} in the "
            "orchestrator's environment (the proxy adds it; the agent never holds it), then "
            "resubmit. Not retried: every attempt would fail the same way"
        )
    if status == 429:
        return "rate_limit", f"the provider rate-limited {where} (429) past the agent's own retries"
    if status >= 500:
        error = f": {last['error']}" if last.get("error") else ""
        return "provider_5xx", f"the provider answered {where} with {status}{error}"
    if 200 <= status < 300 and (last.get("stream_error") or last.get("error")):
        broken = last.get("stream_error") or last.get("error")
        return "provider_stream", f"the provider's answer to {where} was broken: {broken}"
    return None


def first_request_tools(egress_text: str, path_suffix: str) -> list[str] | None:
    """Tool names the first request to ``path_suffix`` offered, from the proxy's egress log.

    Both OpenAI shapes: Responses (``{type, name}``) and Chat Completions
    (``{type: function, function: {name}}``). None when the log cannot tell (no such
    request, or its body was clipped and is no longer JSON).
    """
    for entry in log_entries(egress_text):
        if not str(entry.get("path", "")).split("?")[0].endswith(path_suffix):
            continue
        if entry.get("body_clipped"):
            return None
        try:
            body = json.loads(str(entry.get("body")))
        except ValueError:
            return None
        tools = body.get("tools") if isinstance(body, dict) else None
        if not isinstance(tools, list):
            return None
        names = set()
        for tool in tools:
            if isinstance(tool, dict):
                function = tool.get("function")
                named = function.get("name") if isinstance(function, dict) else None
                names.add(str(named or tool.get("name") or tool.get("type")))
        return sorted(names)
    return None


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ProxyServer

    def do_GET(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def do_PUT(self) -> None:
        self._forward()

    def do_DELETE(self) -> None:
        self._forward()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # each request is logged in egress.jsonl instead

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return bytes(parts)
                if len(parts) + size > MAX_REQUEST:
                    raise ValueError(f"request body over {MAX_REQUEST} bytes")
                parts += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_REQUEST:
            raise ValueError(f"request body over {MAX_REQUEST} bytes")
        return self.rfile.read(length) if length else b""

    def _forward(self) -> None:
        proxy = self.server.proxy
        started = time.monotonic()
        self.close_connection = True  # one request per connection keeps the relay simple
        entry: dict[str, Any] = {
            "time": datetime.now(UTC).isoformat(),
            "provider": proxy.provider,
            "upstream": proxy.upstream,
            "method": self.command,
            "path": self.path,
        }
        try:
            body = self._read_body()
        except ValueError as err:
            self._fail(413, str(err), entry, started, 0)
            return
        text, clipped = clip_body(body.decode("utf-8", errors="replace"))
        entry.update(request_bytes=len(body), body=text, body_clipped=clipped)
        try:
            asked = json.loads(body).get("model") if body else None
        except (ValueError, AttributeError):
            asked = None
        if isinstance(asked, str):
            entry["request_model"] = asked
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers = {k: v for k, v in headers.items() if k.lower() not in AUTH_HEADERS}
        headers.update(proxy.auth_headers())
        headers["Accept-Encoding"] = "identity"  # streams pass through uncompressed
        target = urlsplit(proxy.upstream)
        conn_cls = (
            http.client.HTTPSConnection if target.scheme == "https" else http.client.HTTPConnection
        )
        conn = conn_cls(target.hostname or "", target.port, timeout=UPSTREAM_TIMEOUT_S)
        try:
            conn.request(self.command, target.path + self.path, body=body, headers=headers)
            upstream = conn.getresponse()
        except (OSError, http.client.HTTPException) as err:
            conn.close()
            self._fail(502, f"upstream {proxy.upstream} unreachable: {err}", entry, started, 0)
            return
        sent = 0
        kept = bytearray()
        try:
            self.send_response(upstream.status, upstream.reason)
            for name, value in upstream.getheaders():
                if name.lower() not in HOP_BY_HOP:
                    self.send_header(name, value)
            self.send_header("Connection", "close")
            self.end_headers()
            while chunk := upstream.read1(65536):
                if len(kept) < RESPONSE_PEEK:
                    kept += chunk[: RESPONSE_PEEK - len(kept)]
                self.wfile.write(chunk)
                self.wfile.flush()
                sent += len(chunk)
        except (OSError, http.client.HTTPException) as err:
            entry["error"] = f"stream broken after {sent} bytes: {err}"
        finally:
            conn.close()
        if 200 <= upstream.status < 300:
            model, broken = inspect_response(
                upstream.getheader("Content-Type") or "", bytes(kept), sent <= RESPONSE_PEEK
            )
            if model:
                entry["response_model"] = model
            if broken:
                entry["stream_error"] = broken
            tokens = response_tokens(upstream.getheader("Content-Type") or "", bytes(kept))
            if tokens:
                entry["tokens"] = tokens
                proxy.count_tokens(tokens, entry)
        entry.update(
            status=upstream.status,
            response_bytes=sent,
            duration_s=round(time.monotonic() - started, 3),
        )
        proxy.egress.write(entry)
        proxy.note(upstream.status, bool(entry.get("stream_error") or entry.get("error")))

    def _fail(
        self, status: int, message: str, entry: dict[str, Any], started: float, sent: int
    ) -> None:
        data = json.dumps(
            {"type": "error", "error": {"type": "api_error", "message": f"hangar proxy: {message}"}}
        ).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass  # the client went away; the log still says what happened
        entry.setdefault("request_bytes", 0)
        entry.update(
            status=status,
            response_bytes=sent,
            error=message,
            duration_s=round(time.monotonic() - started, 3),
        )
        self.server.proxy.egress.write(entry)
        self.server.proxy.note(status)


class _ProxyServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    proxy: ModelProxy


class ModelProxy:
    """The host side: a reverse proxy on the unix socket ``socket_path`` to ``upstream``."""

    def __init__(
        self,
        provider: Provider,
        upstream: str,
        key: str | None,
        socket_path: Path,
        egress: Path,
        on_tokens: Callable[[int], None] | None = None,
    ) -> None:
        self.provider: Provider = provider
        self.on_tokens = on_tokens
        self.upstream = upstream
        self._key = key
        self.socket_path = socket_path
        self.egress = EgressLog(egress)
        self._serving: ServerThread[_ProxyServer] | None = None
        # Set once the provider is taken for dead (GIVE_UP_AFTER): the adapter's sandbox stops.
        self.gave_up = threading.Event()
        self._failing = 0
        self._count_lock = threading.Lock()

    def count_tokens(self, tokens: int, entry: dict[str, Any]) -> None:
        """Tell ``on_tokens`` (the TPM throttle's live count) at once; never fails the answer."""
        if self.on_tokens is None:
            return
        try:
            self.on_tokens(tokens)
        except Exception as err:  # the throttle counts the tokens at the trial's end anyway
            entry["live_tokens_error"] = f"{type(err).__name__}: {err}"

    def note(self, status: int, broken: bool = False) -> None:
        """Count one answer: the first 401/403, or GIVE_UP_AFTER 5xx/429/broken answers in a
        row, give up."""
        with self._count_lock:
            failed = broken or status == 429 or status >= 500
            self._failing = self._failing + 1 if failed else 0
            if status in (401, 403) or self._failing >= GIVE_UP_AFTER:
                self.gave_up.set()

    def auth_headers(self) -> dict[str, str]:
        if not self._key:
            return {}  # e.g. a scripted endpoint in tests: nothing to add
        if self.provider == "anthropic":
            return {"x-api-key": self._key}
        return {"Authorization": f"Bearer {self._key}"}

    def start(self) -> None:
        server = _ProxyServer(str(self.socket_path), _ProxyHandler)
        server.proxy = self
        self._serving = ServerThread(server, "model-proxy")

    def stop(self) -> None:
        if self._serving is not None:
            self._serving.stop()
            self._serving = None


@dataclass(frozen=True)
class ModelAccess:
    """What an adapter adds to its sandbox request to reach the model API."""

    provider: Provider
    base_url: str  # valid inside the sandbox
    mounts: list[Mount]
    env: dict[str, str]  # placeholder key only; never the real one
    port: int
    socket: str  # the proxy's socket path inside the sandbox
    # Set by the trial's own cancel (drain, budget) or by the proxy giving up on the provider:
    # the adapter passes it as SandboxRequest.cancel.
    cancel: threading.Event = field(default_factory=threading.Event)

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` started under the in-sandbox forwarder (which listens on ``port`` first)."""
        return [*forward_argv([(self.port, self.socket)]), *argv]


def _free_port() -> int:
    # The sandbox has its own loopback, so any port works there; a free host port
    # also works when a sandbox shares the host's network.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def model_access(provider: Provider, ctx: AgentContext) -> Iterator[ModelAccess]:
    """Run the host proxy for ``provider`` while the block runs; yields what the sandbox needs."""
    upstream = upstream_url(provider, ctx.settings)
    key = ctx.settings.provider_key(provider)
    # A unix socket path must stay under ~108 bytes: a short scratch dir, not the trial's.
    scratch = Path(tempfile.mkdtemp(prefix="hangar-mapi-"))
    socket_path = scratch / SOCKET_NAME
    if len(str(socket_path)) > 100:
        shutil.rmtree(scratch, ignore_errors=True)
        raise ModelAccessError(
            f"temporary directory {tempfile.gettempdir()} is too deep for a unix socket path; "
            "set TMPDIR to a short directory such as /tmp"
        )
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    egress = ctx.out_dir / EGRESS_NAME
    egress.touch()
    proxy = ModelProxy(provider, upstream, key, socket_path, egress, ctx.on_tokens)
    proxy.start()
    port = _free_port()
    cancel, done = threading.Event(), threading.Event()

    def relay() -> None:  # either cause stops the agent's sandbox
        while not done.wait(0.2):
            if ctx.cancel.is_set() or proxy.gave_up.is_set():
                cancel.set()
                return

    watcher = threading.Thread(target=relay, name="model-proxy-cancel", daemon=True)
    watcher.start()
    try:
        yield ModelAccess(
            provider=provider,
            base_url=f"http://127.0.0.1:{port}",
            mounts=[Mount(scratch, SOCKET_MOUNT)],
            env={KEY_VARS[provider]: PLACEHOLDER_KEY},
            port=port,
            socket=f"{SOCKET_MOUNT}/{SOCKET_NAME}",
            cancel=cancel,
        )
    finally:
        done.set()
        watcher.join()
        proxy.stop()
        shutil.rmtree(scratch, ignore_errors=True)


# ---- in the sandbox: the loopback forwarder (trials/forwarder.py) ----------------------


def forward_argv(pairs: list[tuple[int, str]]) -> list[str]:
    """The argv prefix that starts the forwarder for ``pairs``; the command follows it."""
    args = [sys.executable, "-I", forwarder.__file__]
    for port, socket_path in pairs:
        args += ["--pair", f"{port}={socket_path}"]
    return [*args, "--"]


def main(args: list[str] | None = None) -> int:
    return forwarder.main(args)


if __name__ == "__main__":
    sys.exit(main())
