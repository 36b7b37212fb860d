"""Daemon threads with a clean stop: a socket server, and a poller that runs while a block runs."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

S = TypeVar("S", bound=socketserver.BaseServer)


class ServerThread(Generic[S]):
    """Serves ``server`` from a daemon thread until ``stop``."""

    def __init__(self, server: S, name: str) -> None:
        self.server = server
        self._thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)


@contextmanager
def while_running(target: Callable[[threading.Event], None], name: str) -> Iterator[None]:
    """Run ``target(done)`` in a daemon thread during the block; ``done`` is set when it ends."""
    done = threading.Event()
    thread = threading.Thread(target=target, args=(done,), name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=10)
