"""The end-of-window drain, from inside a trials run.

A trials run watches the eval window (and a drain marker the drain schedule
writes). When it closes, the run starts no more trials and sets the cancel
event of every trial it started. Each trial has its own event (a trial
budget stops one agent through the same event), which reaches the sandboxes
of its build steps and its agent: the sandbox kills everything it started
and returns. Such an attempt ends ``infra_error / power_down`` and is retried
in the next window.

A trial is drainable only until its agent has ended: an agent that ran to its
own end keeps its outcome, and the trial goes on to take its patch, verify
(whose sandbox never gets the event), be stored and graded (trial.py,
``_drained``). So a trial finishing as the drain lands is neither lost nor
run again; and the store never overwrites an attempt.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from pathlib import Path

from hangar_dagster.settings import HangarPaths

DRAINS = "drains"


def drain_marker(paths: HangarPaths, run_id: str) -> Path:
    return paths.home / DRAINS / run_id


def request_drain(paths: HangarPaths, run_id: str) -> None:
    """Ask the trials run ``run_id`` (possibly on another machine sharing HANGAR_HOME) to drain."""
    marker = drain_marker(paths, run_id)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()


class DrainWatcher:
    """A thread that, once ``reason()`` gives a reason, sets ``cancel`` (start nothing more) and
    the cancel event of every trial handed out by ``trial_cancel``."""

    def __init__(self, reason: Callable[[dt.datetime], str | None], interval_s: float = 1.0):
        self.cancel = threading.Event()
        self.why: str | None = None
        self._reason = reason
        self._interval = interval_s
        self._lock = threading.Lock()
        self._trials: list[threading.Event] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hangar-drain", daemon=True)

    def trial_cancel(self) -> threading.Event:
        """A new trial's own cancel event; already set when the run has drained."""
        event = threading.Event()
        with self._lock:  # a trial starting as the drain lands is either seen or born set
            self._trials.append(event)
            if self.cancel.is_set():
                event.set()
        return event

    def _watch(self) -> None:
        while not self._stop.is_set():
            why = self._reason(dt.datetime.now(dt.UTC))
            if why:
                with self._lock:
                    self.why = why
                    self.cancel.set()
                    for event in self._trials:
                        event.set()
                return
            self._stop.wait(self._interval)

    def __enter__(self) -> DrainWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
