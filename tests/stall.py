"""A webserver stand-in for reload requests: a real socket that accepts, records what it is
sent and never answers (tests/cli/test_submit_no_wait.py, tests/shadow/test_shadow_sensor.py)."""

from __future__ import annotations

import socket
import threading


class Stall:
    """A webserver stand-in: accepts, reads what it is sent, never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.received = b""
        self.held: list[socket.socket] = []
        self.stopped = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.held.append(conn)  # kept open, never answered
            conn.settimeout(2)
            try:
                self.received += conn.recv(65536)
            except OSError:
                pass

    def close(self) -> None:
        self.stopped.set()
        for c in self.held:
            c.close()
        self.sock.close()
