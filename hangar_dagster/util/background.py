"""Threads: a socket server and a poller with a clean stop, and a bounded pool for stage work."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from typing import Generic, TypeVar

S = TypeVar("S", bound=socketserver.BaseServer)
T = TypeVar("T")
R = TypeVar("R")


class ServerThread(Generic[S]):
    """Serves ``server`` from a daemon thread until ``stop``."""

    def __init__(self, server: S, name: str, poll_interval: float = 0.5) -> None:
        self.server = server
        # ``stop`` waits up to one poll interval for the loop to notice.
        self._thread = threading.Thread(
            target=server.serve_forever, args=(poll_interval,), name=name, daemon=True
        )
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


def concurrently(items: Iterable[T], fn: Callable[[T], R], workers: int) -> Iterator[tuple[T, R]]:
    """Yield (item, result) as each finishes, at most ``workers`` at once; results are handled
    on the caller's thread (so it alone writes logs and metadata)."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {pool.submit(fn, item): item for item in items}
        for fut in as_completed(futures):
            yield futures[fut], fut.result()
