"""Real loopback listeners for egress tests, and a probe script run inside a sandbox."""

from __future__ import annotations

import socket
import socketserver
import threading
from types import TracebackType


class Listener:
    """A TCP listener on the host's 127.0.0.1 that records every connection it accepts.

    It answers any HTTP request with 200 and a small simple-index page, so it can also stand
    in for a package index (``HANGAR_PACKAGE_MIRROR_URL`` pointed at it).
    """

    def __init__(self) -> None:
        self.connections: list[bytes] = []  # the first bytes each connection sent
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.settimeout(5)
                try:
                    data = self.request.recv(65536)
                except OSError:
                    data = b""
                owner.connections.append(data)
                body = b"<html><body>listener</body></html>"
                self.request.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\nConnection: close\r\n\r\n"
                    + body
                )

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Listener:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Run in the sandbox with argv: the mirror's index URL, the outside listener's port. Prints one
# JSON object: what each attempt got (an HTTP status, or the exception's name).
PROBE = r"""
import json, os, socket, sys, urllib.error, urllib.request

mirror, outside = sys.argv[1], int(sys.argv[2])


def get(url, proxies=None):
    handler = urllib.request.ProxyHandler(proxies) if proxies is not None else None
    opener = urllib.request.build_opener(*([handler] if handler else []))
    try:
        return opener.open(url, timeout=10).status
    except urllib.error.HTTPError as err:
        return err.code
    except Exception as err:
        reason = getattr(err, "reason", None)
        return type(reason).__name__ if isinstance(reason, Exception) else type(err).__name__


def connect(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        return "connected"
    except OSError as err:
        return type(err).__name__


proxy = os.environ.get("http_proxy")
got = {
    "mirror": get(mirror),
    "outside_direct": connect(outside),
    "outside_via_env": get(f"http://127.0.0.1:{outside}/"),
    "mirror_post": get(urllib.request.Request(mirror, data=b"x", method="POST")),
}
# Past NO_PROXY (which urllib honours even for an explicit proxy): straight to the egress proxy.
os.environ.pop("no_proxy", None)
os.environ.pop("NO_PROXY", None)
forced = {"http": proxy} if proxy else None
got.update({
    "outside_via_proxy": get(f"http://127.0.0.1:{outside}/", forced) if forced else None,
    "link_local_via_proxy": get("http://169.254.169.254/latest/", forced) if forced else None,
    "mirror_post_via_proxy": (
        get(urllib.request.Request(mirror, data=b"x", method="POST"), forced) if forced else None
    ),
})
print(json.dumps(got))
"""
