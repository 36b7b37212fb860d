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

The same mechanism stops a run when its process is interrupted (SIGINT or
SIGTERM to ``hangar experiment run --wait`` or ``resume``: ``interrupt``): no
trial starts from then on, and the trials it cut off end ``infra_error /
interrupted``, retried by the next run like a power-down.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from pathlib import Path

from hangar_dagster.settings import HangarPaths

DRAINS = "drains"
POWER_DOWN = "power_down"
INTERRUPTED = "interrupted"
# Why a cut-off trial ended, by the reason the watcher gave (``<infra_reason>: ...``).
CUT_OFF_MESSAGES = {
    POWER_DOWN: "drained at the end of the eval window; runs again in the next one",
    INTERRUPTED: "the run was interrupted (SIGINT or SIGTERM); runs again on resume",
}

# This process was asked to stop (a signal to the CLI): set once, never cleared.
_interrupt = threading.Event()
_interrupt_why: list[str] = []


def interrupt(why: str) -> None:
    """Ask every trials run of this process to stop: start nothing more, cut off the rest."""
    if not _interrupt.is_set():
        _interrupt_why.append(why)
        _interrupt.set()


def interrupted() -> str | None:
    """``interrupted: <why>`` once ``interrupt`` was called in this process, else None."""
    return f"{INTERRUPTED}: {_interrupt_why[0]}" if _interrupt.is_set() else None


def interrupt_wait(seconds: float) -> None:
    """Sleep ``seconds``, or less once this process is interrupted."""
    _interrupt.wait(seconds)


class TrialCancel(threading.Event):
    """A trial's cancel event, with the infra_reason its attempt ends with when it is set."""

    def __init__(self) -> None:
        super().__init__()
        self.reason = POWER_DOWN

    @property
    def message(self) -> str:
        return CUT_OFF_MESSAGES.get(self.reason, CUT_OFF_MESSAGES[POWER_DOWN])


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
        self._trials: list[TrialCancel] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hangar-drain", daemon=True)

    def trial_cancel(self) -> TrialCancel:
        """A new trial's own cancel event; already set when the run has drained."""
        event = TrialCancel()
        with self._lock:  # a trial starting as the drain lands is either seen or born set
            self._trials.append(event)
            if self.cancel.is_set():
                event.reason = self._infra_reason()
                event.set()
        return event

    def _infra_reason(self) -> str:
        head = (self.why or "").split(":", 1)[0]
        return head if head in CUT_OFF_MESSAGES else POWER_DOWN

    def _watch(self) -> None:
        while not self._stop.is_set():
            why = self._reason(dt.datetime.now(dt.UTC))
            if why:
                with self._lock:
                    self.why = why
                    self.cancel.set()
                    for event in self._trials:
                        event.reason = self._infra_reason()
                        event.set()
                return
            self._stop.wait(self._interval)

    def __enter__(self) -> DrainWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
