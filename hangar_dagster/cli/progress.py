"""The progress display of `run --wait` and `resume`: trials done of planned, graded, passed,
failed, infra errors and time elapsed, read from the store while the stages run.

The stages run in a worker thread (``orchestration.driver.drive``); ``Ticker`` reads the store
from another one every ``interval_s`` (less often when a read is slow) and shows what it read. On a terminal it is one line that
rich redraws in place; piped (logs, CI) it is a plain ``progress:`` line each time a count
changes, so a log shows it move without a line per tick.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text


@dataclass(frozen=True)
class Progress:
    planned: int  # trial keys the spec plans
    done: int  # keys whose latest attempt ran (not an infra error, which is retried)
    graded: int  # of those, the ones with a grade
    passed: int
    failed: int
    infra_errors: int  # attempts that ended as infra errors, retried ones too
    elapsed_s: float

    def line(self) -> str:
        m, s = divmod(int(self.elapsed_s), 60)
        return (
            f"trials {self.done}/{self.planned} done, {self.graded} graded: "
            f"{self.passed} passed, {self.failed} failed, {self.infra_errors} infra error(s); "
            f"{m}:{s:02d} elapsed"
        )

    def counts(self) -> tuple[int, ...]:
        """Everything but the clock: what makes a piped line worth printing."""
        return (self.planned, self.done, self.graded, self.passed, self.failed, self.infra_errors)


def read_progress(store: Any, experiment_id: str, planned: int, elapsed_s: float) -> Progress:
    """The counts of ``experiment_id`` as the store has them now (``Store.progress_counts``)."""
    return Progress(planned=planned, elapsed_s=elapsed_s, **store.progress_counts(experiment_id))


class Ticker:
    """Shows ``read()``'s progress every ``interval_s`` while the ``with`` block runs."""

    def __init__(
        self,
        console: Console,
        read: Callable[[float], Progress],
        interval_s: float = 1.0,
    ) -> None:
        self.console = console
        self.read = read
        self.interval_s = interval_s
        self.start = time.monotonic()
        self.stop = threading.Event()
        self.last: Progress | None = None
        self.live: Live | None = None
        self.thread = threading.Thread(target=self._run, name="hangar-progress", daemon=True)

    def _tick(self) -> None:
        try:
            now = self.read(time.monotonic() - self.start)
        except Exception:  # the store is busy (a write holds its lock): the next tick reads
            return
        changed = self.last is None or now.counts() != self.last.counts()
        self.last = now
        if self.live is not None:
            self.live.update(Text(f"progress: {now.line()}", style="cyan"))
        elif changed:
            self.console.print(f"progress: {now.line()}", markup=False, highlight=False)

    def _run(self) -> None:
        wait = self.interval_s
        while not self.stop.wait(wait):
            started = time.monotonic()
            self._tick()
            # A read holds the store's lock, which the stages' writes wait for: reads that
            # got slow (a busy store, many trials) come less often, for at most a tenth of it.
            wait = max(self.interval_s, 9 * (time.monotonic() - started))

    def __enter__(self) -> Ticker:
        if self.console.is_terminal:
            self.live = Live(console=self.console, refresh_per_second=4, transient=False)
            self.live.start()
        self._tick()
        self.thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop.set()
        self.thread.join(5 * self.interval_s)
        self._tick()  # the last counts, whatever the last tick saw
        if self.live is not None:
            self.live.stop()
