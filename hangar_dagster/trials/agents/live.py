"""Live usage: stop an agent once the spend it reports passes the trial's budget.

``trial_job_budget.max_cost_usd`` reaches an adapter as ``ctx.max_cost_usd``.
An adapter sums the cost its CLI reports while it runs with a ``LiveUsage``;
once the sum passes the cap, the watcher sets ``ctx.cancel`` (the sandbox
kills the agent and returns ``cancelled``) and ``watcher.stopped`` turns
true. The adapter copies that into ``AgentRun.budget_stopped`` and the trial
ends as ``budget_exceeded``: an outcome (the agent spent too much), not an
infrastructure error, so it is never retried. The partial patch is kept.

Usage, for a CLI that streams JSON lines on stdout::

    watcher = LiveUsage(ctx, cost_of=my_cost)    # my_cost(event) -> USD this event adds
    request = SandboxRequest(..., cancel=ctx.cancel, on_stdout=watcher.feed)
    result = ctx.sandbox.run(request)
    run = AgentRun(..., budget_stopped=watcher.stopped)

or, for a CLI that appends JSON lines to a trace file the host can read::

    with watcher.follow(host_path_of_the_trace_file):
        result = ctx.sandbox.run(request)

``cost_of`` gets each JSON object (a dict) and returns the cost in USD it adds,
or None. A CLI that reports a running total instead passes
``running_total=True``: ``cost_of`` then returns the total so far and the
watcher keeps the highest. Lines that are not JSON objects are skipped;
``cost_of`` must not raise. Without a cap (``ctx.max_cost_usd`` None) the
watcher only sums. One watcher reads one stream: ``feed`` keeps the partial
last line between calls.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hangar_dagster.trials.agents import AgentContext
from hangar_dagster.util.background import while_running

CostOf = Callable[[dict[str, Any]], float | None]
MAX_LINE = 1_000_000  # bytes; a longer line is skipped rather than buffered
POLL_S = 0.1


def usage_cost(event: dict[str, Any]) -> float | None:
    """The cost of a hangar trace ``usage`` event (the command adapter's format)."""
    value = event.get("cost_usd") if event.get("type") == "usage" else None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


class LiveUsage:
    """Sums reported cost as it arrives; cancels the agent once it passes ``ctx.max_cost_usd``."""

    def __init__(
        self, ctx: AgentContext, cost_of: CostOf = usage_cost, *, running_total: bool = False
    ) -> None:
        self._ctx = ctx
        self._cost_of = cost_of
        self._running_total = running_total
        self._lock = threading.Lock()
        self._partial = b""
        self._skipping = False  # inside a line longer than MAX_LINE
        self.cost_usd = 0.0
        self.stopped = False

    def feed(self, chunk: bytes) -> None:
        """Take the next bytes of a JSON-lines stream (``SandboxRequest.on_stdout``)."""
        with self._lock:
            *lines, rest = (self._partial + chunk).split(b"\n")
            if self._skipping and lines:
                lines, self._skipping = lines[1:], False
            if len(rest) > MAX_LINE:
                rest, self._skipping = b"", True
            self._partial = rest
        for line in lines:
            self._line(line)

    def _line(self, raw: bytes) -> None:
        try:
            event = json.loads(raw)
        except ValueError:
            return
        if isinstance(event, dict):
            cost = self._cost_of(event)
            if isinstance(cost, int | float) and not isinstance(cost, bool):
                self.add(float(cost))

    def add(self, cost: float) -> None:
        """Count ``cost`` (or a new running total); cancel the agent once past the cap."""
        cap = self._ctx.max_cost_usd
        with self._lock:
            if self._running_total:
                self.cost_usd = max(self.cost_usd, cost)
            else:
                self.cost_usd += cost
            over = cap is not None and self.cost_usd > cap and not self.stopped
            if over:
                self.stopped = True
        if over:
            self._ctx.cancel.set()

    def _restart(self) -> None:
        with self._lock:
            self.cost_usd, self._partial, self._skipping = 0.0, b"", False

    @contextmanager
    def follow(self, path: Path, interval_s: float = POLL_S) -> Iterator[None]:
        """Poll ``path`` (a file the sandboxed agent appends to) while the block runs.

        The file is opened without following symlinks and read only while it is a
        regular file. When the agent replaces or truncates it, counting starts
        over from the new content, as the adapter's final read of the file will.
        """
        where: dict[str, Any] = {"file": None, "offset": 0}

        def poll() -> None:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                return
            with os.fdopen(fd, "rb") as f:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    return
                file = (info.st_dev, info.st_ino)
                if file != where["file"] or info.st_size < where["offset"]:
                    where["file"], where["offset"] = file, 0
                    self._restart()
                f.seek(where["offset"])
                while chunk := f.read(65536):
                    where["offset"] += len(chunk)
                    self.feed(chunk)

        def loop(done: threading.Event) -> None:
            while not done.wait(interval_s):
                poll()
            poll()

        with while_running(loop, "hangar-live-usage"):
            yield
