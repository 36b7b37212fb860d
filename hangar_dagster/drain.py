"""The end-of-window drain, from inside a trials run.

A trials run watches the eval window (and a drain marker the drain schedule
writes). When it closes, the run stops starting trials, sets every in-flight
trial's cancel event, and kills the sandboxes this process started, so those
attempts end as ``infra_error / power_down`` and are retried in the next
window. A trial already stored stays stored: the store never overwrites an
attempt, so a trial that finishes as the drain lands keeps its result.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from hangar_dagster.config import HangarPaths

DRAINS = "drains"


def drain_marker(paths: HangarPaths, run_id: str) -> Path:
    return paths.home / DRAINS / run_id


def request_drain(paths: HangarPaths, run_id: str) -> None:
    """Ask the trials run ``run_id`` (possibly on another machine sharing HANGAR_HOME) to drain."""
    marker = drain_marker(paths, run_id)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()


def own_sandbox_groups() -> list[int]:
    """Process groups led by direct children of this process: every sandbox is started that way."""
    me = os.getpid()
    groups = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid, pgrp = int(entry.name), int(fields[1]), int(fields[2])
        if ppid == me and pgrp == pid and fields[0] not in ("Z", "X"):
            groups.append(pid)
    return groups


def kill_own_sandboxes() -> int:
    killed = 0
    for pgid in own_sandbox_groups():
        try:
            os.killpg(pgid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    return killed


class DrainWatcher:
    """A thread that sets ``cancel`` once ``reason()`` says why, then keeps the sandboxes dead."""

    def __init__(self, reason: Callable[[dt.datetime], str | None], interval_s: float = 1.0):
        self.cancel = threading.Event()
        self.why: str | None = None
        self._reason = reason
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hangar-drain", daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            if not self.cancel.is_set():
                why = self._reason(dt.datetime.now(dt.UTC))
                if why:
                    self.why = why
                    self.cancel.set()
            if self.cancel.is_set():
                # Again each tick: a trial between its last check and its sandbox start must die too.
                kill_own_sandboxes()
            self._stop.wait(self._interval)

    def __enter__(self) -> DrainWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
