"""Owning a process tree (util/procs.py) with real processes: the pid lock (refusal naming the
holder, takeover after a SIGKILL) and the subreaper sweep (other sessions, orphans, a process
that ignores SIGTERM), checked against /proc."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hangar_dagster.util.procs import LockHeld, PidLock, Proc, alive

pytestmark = pytest.mark.integration

HOLD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from hangar_dagster.util.procs import PidLock
    lock = PidLock(Path(sys.argv[1]))
    lock.acquire()
    print("held", flush=True)
    time.sleep(600)
    """
)


def hold(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_holder_is_refused_with_the_pid_of_the_first(tmp_path: Path) -> None:
    first = hold(tmp_path / "ui.lock")
    try:
        with pytest.raises(LockHeld) as refused:
            PidLock(tmp_path / "ui.lock").acquire()
        assert refused.value.pid == first.pid
        assert PidLock(tmp_path / "ui.lock").holder() == first.pid
    finally:
        first.kill()
        first.wait()


def test_a_lock_left_by_a_killed_pid_is_taken_over(tmp_path: Path) -> None:
    first = hold(tmp_path / "ui.lock")
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert (tmp_path / "ui.lock").read_text().strip() == str(first.pid)  # the file stays
    lock = PidLock(tmp_path / "ui.lock")
    assert lock.holder() is None
    lock.acquire()
    try:
        assert (tmp_path / "ui.lock").read_text().strip() == str(os.getpid())
    finally:
        lock.release()
    assert not (tmp_path / "ui.lock").exists()


# A subreaper with: a child in its own session that double-forks a setsid grandchild (orphaned,
# so handed to the subreaper), and a child that ignores SIGTERM. It records their pids, then
# sweeps its tree and reports what it had to SIGKILL.
TREE = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    from hangar_dagster.util.procs import become_subreaper, descendants, stop_tree
    become_subreaper()
    out = sys.argv[1]
    subprocess.Popen([sys.executable, "-c",
        "import os, time\\n"
        "if os.fork() == 0:\\n"
        "    os.setsid()\\n"
        "    if os.fork() == 0:\\n"
        "        time.sleep(600)\\n"
        "    os._exit(0)\\n"
        "time.sleep(600)\\n"], start_new_session=True)
    subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    deadline = time.monotonic() + 30
    while len(descendants(os.getpid())) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    procs = descendants(os.getpid())
    with open(out, "w") as f:
        json.dump({"root": os.getpid(), "pgid": os.getpgid(0), "procs": [[p.pid, p.ppid, p.pgid, p.state, p.start] for p in procs]}, f)
    killed = stop_tree(os.getpid(), grace_s=1.0)
    print(len(killed), flush=True)
    """
)


def test_stop_tree_stops_other_sessions_orphans_and_sigterm_ignorers(tmp_path: Path) -> None:
    out = tmp_path / "tree.json"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", TREE, str(out)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    tree = json.loads(out.read_text())
    root, procs = tree["root"], [Proc(*row) for row in tree["procs"]]
    # The session leader's child, its orphaned setsid grandchild, and the SIGTERM ignorer.
    assert len(procs) == 3, procs
    # The grandchild was handed to the subreaper: its parent is the root, though it is neither
    # the root's group nor a session leader it started itself (its parent, gone, led it).
    assert any(p.ppid == root and p.pgid not in (p.pid, tree["pgid"]) for p in procs), procs
    survivors = [p for p in procs if alive(p)]
    assert survivors == [], survivors
    assert int(done.stdout.strip()) >= 1, "the SIGTERM ignorer needed SIGKILL"
    assert time.monotonic() - started < 60
