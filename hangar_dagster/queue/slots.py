"""An experiment's ``parallel`` held across the processes of one machine: one lock file per slot.

Inside one trials run a thread pool of ``parallel`` bounds the trials. When a slice's run
overlaps the next one's (``hangar experiment run --wait`` and ``resume``: the next slice's run is
created and started while this one still works, docs/architecture.md, "Between slices"), both
runs' trials must share those slots. Each trial, with its grade, holds one of ``parallel`` lock
files (``flock``): the kernel releases a lock when its holder dies, so a killed run leaves no slot
taken, and two threads of one process that open the file separately exclude each other as two
processes do. Within one run nothing ever waits here (as many threads as lock files); across two,
the later run's threads take the slots the earlier one's threads give up as its keys run out.

The files live in the experiment's folder under ``HANGAR_HOME``, so a run worker container
that mounts the home shares them with the host (one kernel); runs on other machines are held
by the run queue's one-trials-run-per-experiment rule instead (docs/queue.md).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

# How often a thread with no free slot looks again: it waits only while another run of the
# experiment still holds the slots, at a slice boundary.
POLL_S = 0.05


class Slots:
    """``count`` slots under ``root`` (created on first use)."""

    def __init__(self, root: Path, count: int, poll_s: float = POLL_S) -> None:
        if count < 1:
            raise ValueError(f"an experiment's parallel must be at least 1, not {count}")
        self.root = root
        self.count = count
        self.poll_s = poll_s

    def _take(self) -> int | None:
        """A file descriptor holding a free slot's lock, or None when every slot is held."""
        self.root.mkdir(parents=True, exist_ok=True)
        for i in range(self.count):
            fd = os.open(
                self.root / f"slot-{i}.lock", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644
            )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return fd
        return None

    def next_due(self, run_id: str) -> Path:
        """The mark run ``run_id`` leaves once the next slice's run should be made
        (``next_run_due``; removed when it ends): the daemon's driver then asks for that run
        beside it (orchestration/sensors.py, ``overlap_request``)."""
        return self.root / f"next-due-{run_id}"

    def turn(self) -> Turn:
        return Turn(self.root / "turn.lock", self.poll_s)

    @contextmanager
    def hold(self, stop: Callable[[], str | None]) -> Iterator[str | None]:
        """Hold a slot for the block (yields None), or yield ``stop()``'s reason if it says to
        stop before one frees (an interrupt, a drain): the caller then starts nothing."""
        while (fd := self._take()) is None:
            if why := stop():
                yield why
                return
            time.sleep(self.poll_s)
        try:
            yield None
        finally:
            os.close(fd)  # closing the only descriptor releases the lock


class Turn:
    """Which run of the experiment may start trials: one at a time.

    Two overlapping runs that both took slots as they free would share the slots from the
    start, run out of keys together, and leave the slots idle at the boundary all the same. So
    a run takes the turn before its first start and gives it up once every key of its own has
    been handed to a slot; only then do the next run's trials take the slots the earlier run's
    last trials let go. A lock file too: a dead run gives up the turn with its process.
    """

    def __init__(self, path: Path, poll_s: float = POLL_S) -> None:
        self.path = path
        self.poll_s = poll_s
        self._fd: int | None = None
        self._guard = threading.Lock()

    def take(self, stop: Callable[[], str | None]) -> str | None:
        """Wait for the turn (None), or return ``stop()``'s reason if it says to stop first."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if why := stop():
                    os.close(fd)
                    return why
                time.sleep(self.poll_s)
                continue
            with self._guard:
                self._fd = fd
            return None

    def give_up(self) -> None:
        """Let the next run start trials (idempotent: from any thread, any number of times)."""
        with self._guard:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


# How long before a run hands out its last key the next slice's run should be asked for: the
# daemon's path from a request to a run waiting for the turn (a sensor tick, its evaluation, the
# run queue's dequeue, a run worker's start and definitions, the run's 1,000 planned events)
# took about 30 s at the product's slice of 500 alone, and 60-70 s beside the earlier run's
# trials at load 5-6 (docs/performance.md, "The daemon's path"): twice that. Early costs a run
# worker waiting for the turn, not slot time.
NEXT_RUN_LEAD_S = 120.0


def next_run_due(
    handed: int, total: int, parallel: int, elapsed_s: float, lead_s: float = NEXT_RUN_LEAD_S
) -> bool:
    """Whether a run that has handed ``handed`` of its ``total`` keys to a slot, ``elapsed_s``
    after it began, should have the next slice's run made now: when its last key is handed, or
    when the keys left would be handed out within ``lead_s`` at the pace slots have freed since
    the first ``parallel`` (those go at once and say nothing of the pace). The run made early
    waits for the turn (``Turn``), so early costs a waiting run worker, not slot time."""
    if handed >= total:
        return True
    if handed <= parallel:
        return False
    return (total - handed) * elapsed_s / (handed - parallel) <= lead_s


def experiment_slots(experiment_dir: Path, parallel: int) -> Slots:
    """The slots of one experiment: ``slots/`` in its folder (``HangarPaths.experiment_dir``)."""
    return Slots(experiment_dir / "slots", parallel)
