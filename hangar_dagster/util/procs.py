"""Owning a process tree: a pid lock, the child subreaper, parent-death signals, and /proc walks.

``hangar ui`` uses these so that stopping it stops everything it started (docs/operations.md,
"Who owns the UI's processes"): Linux-only, like the sandboxes.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import errno
import fcntl
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"prctl({option}, {value}): {os.strerror(e)}")


def become_subreaper() -> None:
    """Orphaned descendants (a run worker whose code server exited, a double fork) become ours,
    so ``descendants`` still finds them and nothing escapes to init."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """In a child before exec: the kernel sends ``sig`` when the parent (thread) dies."""
    _prctl(PR_SET_PDEATHSIG, sig)


def restore_stop_signals() -> None:
    """In a server's own ``main``: SIGTERM and SIGINT stop it again, whatever it inherited.

    exec keeps an ignored signal ignored. A shell without job control starts background commands
    with SIGINT ignored, and Dagster's interrupt handling then copies SIGINT's disposition onto
    SIGTERM in the process that runs it; every child started after that ignored ``terminate()``.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    state: str
    start: int  # clock ticks since boot: tells a pid from a later reuse of it


def read_proc(pid: int) -> Proc | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the parenthesised command name: state ppid pgrp session ... starttime (22nd)
    fields = stat.rsplit(")", 1)[1].split()
    return Proc(pid, int(fields[1]), int(fields[2]), fields[0], int(fields[19]))


def started_at(pid: int) -> dt.datetime | None:
    """When process ``pid`` started, in UTC (to the second: the kernel's boot time is whole
    seconds), or None when there is no such process."""
    proc = read_proc(pid)
    if proc is None:
        return None
    try:
        btime = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    seconds = btime + proc.start / os.sysconf("SC_CLK_TCK")
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC)


def cmdline(pid: int) -> list[str]:
    """Process ``pid``'s arguments ([] when it is gone or unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def ancestors(pid: int) -> list[int]:
    """The pids above ``pid``, its parent first, up to (not including) pid 0."""
    out: list[int] = []
    proc = read_proc(pid)
    while proc is not None and proc.ppid > 0 and proc.ppid not in out:
        out.append(proc.ppid)
        proc = read_proc(proc.ppid)
    return out


def all_procs() -> list[Proc]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (p := read_proc(int(entry.name))) is not None:
            out.append(p)
    return out


def descendants(pid: int) -> list[Proc]:
    """Every live (non-zombie) process below ``pid``, whatever its session or group."""
    children: dict[int, list[Proc]] = {}
    for p in all_procs():
        children.setdefault(p.ppid, []).append(p)
    out: list[Proc] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            todo.append(child.pid)
            if child.state not in ("Z", "X"):
                out.append(child)
    return out


def alive(p: Proc) -> bool:
    """Whether ``p`` (the same process, not a reuse of its pid) is still running."""
    now = read_proc(p.pid)
    return now is not None and now.start == p.start and now.state not in ("Z", "X")


def reap_children() -> None:
    """Collect exited children (ours, or orphans handed to us as subreaper) without blocking."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_tree(root: int, grace_s: float) -> list[Proc]:
    """SIGTERM everything below ``root``, SIGKILL what is left after ``grace_s``; wait until gone.

    Returns what had to be killed. New descendants appearing meanwhile (a run worker starting a
    sandbox) are caught by the next pass.
    """
    killed: list[Proc] = []
    deadline = time.monotonic() + grace_s
    sig = signal.SIGTERM
    while procs := descendants(root):
        if time.monotonic() >= deadline and sig == signal.SIGTERM:
            sig = signal.SIGKILL
            killed = procs
        for p in procs:
            try:
                os.kill(p.pid, sig)
            except ProcessLookupError:
                pass
        reap_children()
        if time.monotonic() > deadline + 10:
            break  # unkillable (D state): give up rather than hang the shutdown
        time.sleep(0.2)
    reap_children()
    return killed


class LockHeld(RuntimeError):
    def __init__(self, path: Path, pid: int | None):
        super().__init__(f"{path} is held by pid {pid if pid is not None else '?'}")
        self.path = path
        self.pid = pid


class PidLock:
    """An ``flock`` on ``path`` held for this process's life, with its pid written inside.

    The kernel drops the lock when the process dies however it dies, so a lock file left by a
    dead pid is simply taken over; the file descriptor is not inherited by children (Python's
    default), so a child outliving us cannot keep it.
    """

    def __init__(self, path: Path):
        self.path = path
        self._fh: IO[str] | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")  # noqa: SIM115 - held until release()
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            fh.close()
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise LockHeld(self.path, self.holder()) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        self._fh = fh

    def holder(self) -> int | None:
        """The pid written by whoever holds the lock now (None: nobody holds it)."""
        try:
            with open(self.path) as fh:
                try:
                    fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except OSError:
                    text = fh.read().strip()
                    return int(text) if text.isdigit() else None
                fcntl.flock(fh, fcntl.LOCK_UN)
                return None
        except FileNotFoundError:
            return None

    def release(self) -> None:
        if self._fh is not None:
            self.path.unlink(missing_ok=True)
            self._fh.close()  # closing drops the flock
            self._fh = None
