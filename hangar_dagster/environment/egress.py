"""A sandbox's only way out: one small forward proxy per sandbox, on a unix socket, by policy.

A sandbox keeps its own network namespace (loopback only; ``SandboxRequest.network``
stays False). ``open_egress(policy, log_path, settings)`` runs, for the block, a
forward proxy on the host (an in-process thread, like the model proxy) listening
on unix sockets in a short scratch directory, and yields the ``EgressGrant`` a
sandbox request adds: that directory mounted read-only, the environment that
points the tools at it (``http_proxy`` and friends, ``PIP_INDEX_URL`` = the
mirror) and the argv prefix that starts the in-sandbox loopback forwarder
(``trials/forwarder.py``, the model proxy's) and runs the command as its child.

The policies (the spec's ``environment.egress.mode`` and ``grader.network``):

- ``none``: nothing beyond the sandbox's loopback. No proxy runs and the grant
  is empty (an agent still gets the model proxy, which its adapter adds).
- ``mirror``: the package mirror only, GET and HEAD (read-only: no upload route).
- ``allowlist``: the model API through the model proxy (the adapter's, as under
  ``none``) and the package mirror; nothing else.

Every request the proxy sees, allowed or refused, is one JSON line in
``log_path`` (the trial's ``egress.jsonl``, shared with the model proxy's lines):
``source: egress-proxy``, ``policy``, ``method``, ``host``, ``port``, ``url``,
``verdict`` (``allowed`` / ``refused``), ``bytes`` (both ways), and ``reason`` for a
refusal. A refused request gets a 403. Destinations are matched as (host, port)
exactly as the mirror's URL names them, before any name is resolved: another
loopback port of the host, a link-local address or a name that happens to
resolve to the mirror is refused.

Two ways in, one socket each: ``proxy.sock`` is the forward proxy (absolute-URL
requests and CONNECT); ``mirror.sock`` is a fixed route to a mirror on the host's
loopback, which the sandbox sees at a port of its own loopback (relayed), so pip
treats it as a local, secure origin and needs no proxy setting for it. The
embedded mirror is started by the first request that reaches it, not by
``open_egress``. docs/operations.md says why this is hangar's own code and not
squid or tinyproxy.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import socketserver
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

from hangar_dagster.environment.mirror import MirrorError, ensure_mirror
from hangar_dagster.settings import Settings
from hangar_dagster.trials.model_proxy import EgressLog, forward_argv
from hangar_dagster.trials.sandbox import Mount
from hangar_dagster.util.background import ServerThread

Policy = Literal["none", "allowlist", "mirror"]
POLICIES: tuple[str, ...] = get_args(Policy)
SOCKET_MOUNT = "/hangar-egress"
PROXY_SOCKET = "proxy.sock"
MIRROR_SOCKET = "mirror.sock"
CONNECT_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 600.0  # a relayed connection with no byte either way for this long is closed
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
}


class EgressError(ValueError):
    """The egress policy cannot be given as asked; the message names what to fix."""


@dataclass(frozen=True)
class EgressGrant:
    """What a sandbox request adds to get its policy's way out (nothing, for ``none``)."""

    policy: Policy
    mounts: tuple[Mount, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    prefix: tuple[str, ...] = ()
    mirror_url: str | None = None  # the mirror's index URL as the sandbox sees it (PIP_INDEX_URL)

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` under the grant's forwarder (``argv`` itself when there is none)."""
        return [*self.prefix, *argv]


NO_EGRESS = EgressGrant(policy="none")


@dataclass(frozen=True)
class _Route:
    host: str  # as the sandbox names it
    port: int
    methods: frozenset[str]  # the HTTP methods allowed; CONNECT for a TLS destination
    # Where it really goes, asked on first use (the embedded mirror starts then); None: itself.
    upstream: Callable[[], tuple[str, int]] | None = field(default=None, compare=False)

    def destination(self) -> tuple[str, int]:
        return self.upstream() if self.upstream is not None else (self.host, self.port)


class _OnDemand:
    """The embedded mirror's address, started by the first request that needs it."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._address: tuple[str, int] | None = None

    def __call__(self) -> tuple[str, int]:
        with self._lock:
            if self._address is None:
                mirror = ensure_mirror(self._settings)
                self._address = (mirror.host, mirror.port)
            return self._address


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # every request is a line in egress.jsonl instead

    def do_CONNECT(self) -> None:
        self.close_connection = True
        host, _, port_text = self.path.rpartition(":")
        host = host.strip("[]")
        if not host or not port_text.isdigit():
            self._refuse(host or self.path, 0, "CONNECT needs host:port")
            return
        port = int(port_text)
        if (why := self.server.proxy.refusal(host, port, "CONNECT")) is not None:
            self._refuse(host, port, why)
            return
        started = time.monotonic()
        upstream = self._connect(host, port)
        if upstream is None:
            return
        self.wfile.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        self.wfile.flush()
        up, down = _splice(self.connection, self.rfile, upstream)
        self.server.proxy.record(
            method="CONNECT", host=host, port=port, url=self.path, verdict="allowed",
            request_bytes=up, response_bytes=down, started=started,
        )  # fmt: skip

    def do_GET(self) -> None:
        self._http()

    def do_HEAD(self) -> None:
        self._http()

    def do_POST(self) -> None:
        self._http()

    def do_PUT(self) -> None:
        self._http()

    def do_PATCH(self) -> None:
        self._http()

    def do_DELETE(self) -> None:
        self._http()

    def do_OPTIONS(self) -> None:
        self._http()

    def _http(self) -> None:
        self.close_connection = True  # one request per connection keeps the relay simple
        fixed = self.server.fixed
        target = urlsplit(self.path)
        if fixed is not None and not target.scheme:
            host, port, path = fixed.host, fixed.port, self.path
        elif target.scheme == "http" and target.hostname:
            host, port = target.hostname, target.port or 80
            path = target.path or "/"
            path += f"?{target.query}" if target.query else ""
        else:
            why = "not an http:// URL (use CONNECT for https)" if target.scheme else "no host"
            self._refuse(target.hostname or self.path, target.port or 0, why)
            return
        if fixed is not None and (host, port) != (fixed.host, fixed.port):
            self._refuse(host, port, "this socket reaches only the package mirror")
            return
        if (refused := self.server.proxy.refusal(host, port, self.command)) is not None:
            self._refuse(host, port, refused)
            return
        started = time.monotonic()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        upstream = self._connect(host, port)
        if upstream is None:
            return
        dest_host, dest_port = upstream.getpeername()[:2]
        lines = [f"{self.command} {path} HTTP/1.1"]
        for name, value in self.headers.items():
            if name.lower() not in HOP_BY_HOP and name.lower() != "host":
                lines.append(f"{name}: {value}")
        lines += [f"Host: {dest_host}:{dest_port}", "Connection: close", "", ""]
        head = "\r\n".join(lines).encode("latin-1")
        status: int | None = None
        down = 0
        try:
            upstream.sendall(head + body)
            upstream.settimeout(IDLE_TIMEOUT_S)
            while data := upstream.recv(65536):
                if status is None:
                    status = _status_of(data)
                self.wfile.write(data)
                down += len(data)
            self.wfile.flush()
        except OSError:
            pass  # either side went away; the line still says how much went through
        finally:
            upstream.close()
        self.server.proxy.record(
            method=self.command, host=host, port=port, url=self.path, verdict="allowed",
            request_bytes=len(head) + len(body), response_bytes=down, started=started,
            http_status=status,
        )  # fmt: skip

    def _connect(self, host: str, port: int) -> socket.socket | None:
        """A connection to the allowed route's destination; None (answered 502) if none."""
        try:
            dest = self.server.proxy.routes[(host.lower(), port)].destination()
            return socket.create_connection(dest, timeout=CONNECT_TIMEOUT_S)
        except (OSError, MirrorError) as err:
            self._error(host, port, 502, f"cannot connect: {err}")
            return None

    def _refuse(self, host: str, port: int, why: str) -> None:
        self._answer(403, f"hangar egress ({self.server.proxy.policy}): {why}")
        self.server.proxy.record(
            method=self.command, host=host, port=port, url=self.path, verdict="refused",
            request_bytes=0, response_bytes=0, started=time.monotonic(), reason=why,
        )  # fmt: skip

    def _error(self, host: str, port: int, status: int, why: str) -> None:
        self._answer(status, f"hangar egress: {why}")
        self.server.proxy.record(
            method=self.command, host=host, port=port, url=self.path, verdict="allowed",
            request_bytes=0, response_bytes=0, started=time.monotonic(), error=why,
        )  # fmt: skip

    def _answer(self, status: int, text: str) -> None:
        data = (text + "\n").encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        except OSError:
            pass  # the client went away; the log still says what happened


def _status_of(data: bytes) -> int | None:
    first = data.split(b"\r\n", 1)[0].split()
    return int(first[1]) if len(first) >= 2 and first[1].isdigit() else None


def _splice(client: socket.socket, client_in: Any, upstream: socket.socket) -> tuple[int, int]:
    """Relay both ways until both sides are done; the bytes (client→upstream, upstream→client)."""
    counts = [0, 0]

    def up() -> None:
        try:
            # What the request's reader already buffered comes first, then the socket.
            while data := client_in.read1(65536):
                upstream.sendall(data)
                counts[0] += len(data)
        except OSError:
            pass
        finally:
            try:
                upstream.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    thread = threading.Thread(target=up, daemon=True)
    thread.start()
    try:
        upstream.settimeout(IDLE_TIMEOUT_S)
        while data := upstream.recv(65536):
            client.sendall(data)
            counts[1] += len(data)
    except OSError:
        pass
    finally:
        try:
            client.shutdown(socket.SHUT_WR)
        except OSError:
            pass
    thread.join(timeout=IDLE_TIMEOUT_S)
    upstream.close()
    return counts[0], counts[1]


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    proxy: EgressProxy
    fixed: _Route | None = None  # set: this socket reaches only this destination


class EgressProxy:
    """The host side: the forward proxy (and the mirror's fixed route) on unix sockets."""

    def __init__(self, policy: Policy, routes: list[_Route], log_path: Path) -> None:
        self.policy: Policy = policy
        self.routes = {(r.host, r.port): r for r in routes}
        self.log = EgressLog(log_path)
        self._serving: list[ServerThread[_Server]] = []

    def refusal(self, host: str, port: int, method: str) -> str | None:
        """Why ``method`` to ``host:port`` is refused under the policy; None when allowed."""
        route = self.routes.get((host.lower(), port))
        if route is None:
            return f"{host}:{port} is not on the {self.policy} policy's list"
        if method not in route.methods:
            allowed = ", ".join(sorted(route.methods))
            return f"{method} to {host}:{port} is not allowed (only {allowed}: read-only)"
        return None

    def record(
        self, *, started: float, request_bytes: int, response_bytes: int, **what: Any
    ) -> None:
        entry = {
            "time": datetime.now(UTC).isoformat(),
            "source": "egress-proxy",
            "policy": self.policy,
            **{k: v for k, v in what.items() if v is not None},
            "request_bytes": request_bytes,
            "response_bytes": response_bytes,
            "bytes": request_bytes + response_bytes,
            "duration_s": round(time.monotonic() - started, 3),
        }
        self.log.write(entry)

    def serve(self, socket_path: Path, fixed: _Route | None = None) -> None:
        server = _Server(str(socket_path), _Handler)
        # The grader's command runs as a fresh unprivileged uid: it must be able to connect.
        socket_path.chmod(0o666)
        server.proxy = self
        server.fixed = fixed
        # A short poll: a sandbox run waits for the proxy's stop (0.5 s by default, per socket).
        self._serving.append(
            ServerThread(server, f"egress-proxy-{socket_path.name}", poll_interval=0.02)
        )

    def stop(self) -> None:
        for serving in self._serving:
            serving.stop()
        self._serving = []


def _free_port() -> int:
    # Any port works in the sandbox's own loopback; a free host port just avoids the mirror's.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _mirror_route(settings: Settings, avoid: int) -> tuple[_Route, str, str]:
    """The mirror's route, its index URL in the sandbox, and its scheme.

    The embedded mirror is not started here: the sandbox sees it at a port of its own
    loopback, and the first request that reaches it starts it (most sandboxes never ask).
    """
    if settings.package_mirror_url:
        mirror = ensure_mirror(settings)  # an existing mirror: nothing starts
        methods = frozenset({"CONNECT"}) if mirror.scheme == "https" else mirror.methods
        return _Route(mirror.host.lower(), mirror.port, methods), mirror.index_url, mirror.scheme
    port = _free_port()
    while port == avoid:
        port = _free_port()
    route = _Route("127.0.0.1", port, frozenset({"GET", "HEAD"}), upstream=_OnDemand(settings))
    return route, f"http://127.0.0.1:{port}/index/", "http"


def _env(proxy_port: int, mirror_url: str) -> dict[str, str]:
    proxy_url = f"http://127.0.0.1:{proxy_port}"
    no_proxy = ",".join(LOOPBACK_NAMES)  # the forwarder's own ports (model API, the mirror)
    env = {
        "http_proxy": proxy_url,
        "https_proxy": proxy_url,
        "HTTP_PROXY": proxy_url,
        "HTTPS_PROXY": proxy_url,
        "no_proxy": no_proxy,
        "NO_PROXY": no_proxy,
        "PIP_INDEX_URL": mirror_url,
        # The host's pip.conf names host paths (find-links, file:// indexes) a sandbox lacks.
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    parts = urlsplit(mirror_url)
    if parts.scheme == "http" and parts.hostname not in LOOPBACK_NAMES:
        env["PIP_TRUSTED_HOST"] = parts.hostname or ""  # pip ignores a plain-http host otherwise
    return env


@contextmanager
def open_egress(policy: Policy, log_path: Path, settings: Settings) -> Iterator[EgressGrant]:
    """Run the egress proxy of one sandbox under ``policy`` while the block runs.

    Yields the grant a ``SandboxRequest`` adds (``grant.mounts``, ``grant.env``,
    ``grant.wrap(argv)``). Each request, allowed or refused, is a line in
    ``log_path``. ``none`` starts nothing and yields an empty grant.
    """
    if policy not in POLICIES:
        raise EgressError(f"egress policy {policy!r}: expected one of {', '.join(POLICIES)}")
    if policy == "none":
        yield NO_EGRESS
        return
    # A unix socket path must stay under ~108 bytes: a short scratch dir, not the trial's.
    scratch = Path(tempfile.mkdtemp(prefix="hangar-egress-"))
    if len(str(scratch / PROXY_SOCKET)) > 100:
        shutil.rmtree(scratch, ignore_errors=True)
        raise EgressError(
            f"temporary directory {tempfile.gettempdir()} is too deep for a unix socket path; "
            "set TMPDIR to a short directory such as /tmp"
        )
    scratch.chmod(0o755)  # mkdtemp's 0700 would keep the grader's unprivileged uid out
    log_path.parent.mkdir(parents=True, exist_ok=True)  # the file: at the first request
    proxy_port = _free_port()
    try:
        route, mirror_url, scheme = _mirror_route(settings, avoid=proxy_port)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    proxy = EgressProxy(policy, [route], log_path)
    pairs = [(proxy_port, f"{SOCKET_MOUNT}/{PROXY_SOCKET}")]
    try:
        proxy.serve(scratch / PROXY_SOCKET)
        if route.host in LOOPBACK_NAMES and scheme == "http":
            # The sandbox's own 127.0.0.1:<port> is relayed to the mirror (no proxy setting).
            proxy.serve(scratch / MIRROR_SOCKET, fixed=route)
            pairs.append((route.port, f"{SOCKET_MOUNT}/{MIRROR_SOCKET}"))
        yield EgressGrant(
            policy=policy,
            mounts=(Mount(scratch, SOCKET_MOUNT),),
            env=_env(proxy_port, mirror_url),
            prefix=tuple(forward_argv(pairs)),
            mirror_url=mirror_url,
        )
    finally:
        proxy.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def egress_lines(text: str) -> list[dict[str, Any]]:
    """The egress proxy's lines of an ``egress.jsonl`` text (the model proxy's left out)."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("source") == "egress-proxy":
            out.append(entry)
    return out
