"""Whether a stage run's process still runs: hangar's own check, for launchers without one.

Every stage run records its process when its ``hangar`` resource starts
(``HANGAR_HOME/runs/<run id>.json``: host, boot id, pid and the pid's start
time): in the run worker under the daemon, in the CLI under ``run --wait`` and
``resume``. ``worker_gone`` says, from the same host, that the process is
provably gone (no such pid, a pid reused by a later process, or the machine
rebooted since), or None when it runs or cannot be told (no record yet,
another host). The Dagster side (the driver sensor, ``resume``) marks such a
run failed with this reason (docs/queue.md, "Runs whose worker died").
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

from hangar_dagster.results.records import utcnow
from hangar_dagster.settings import HangarPaths
from hangar_dagster.util.fs import write_atomic
from hangar_dagster.util.procs import read_proc

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class RunProcess:
    run_id: str
    host: str
    boot_id: str
    pid: int
    start_ticks: int  # /proc/<pid>/stat starttime: tells the process from a reuse of its pid
    recorded_at: str


def record_file(paths: HangarPaths, run_id: str) -> Path:
    return paths.home / "runs" / f"{run_id}.json"


def record_run_process(paths: HangarPaths, run_id: str) -> RunProcess:
    me = read_proc(os.getpid())
    record = RunProcess(
        run_id=run_id,
        host=socket.gethostname(),
        boot_id=boot_id(),
        pid=os.getpid(),
        start_ticks=me.start if me is not None else -1,
        recorded_at=utcnow().isoformat(),
    )
    path = record_file(paths, run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(asdict(record), sort_keys=True))
    return record


def read_run_process(paths: HangarPaths, run_id: str) -> RunProcess | None:
    try:
        return RunProcess(**json.loads(record_file(paths, run_id).read_text()))
    except (OSError, ValueError, TypeError):
        return None  # not recorded (yet), or torn: cannot tell


def worker_gone(paths: HangarPaths, run_id: str, creator: str | None = None) -> str | None:
    """Why run ``run_id``'s process is known to be gone, or None (it runs, or cannot be told).

    ``creator``: the run's ``TAG_CREATOR`` tag, the answer for a run that recorded no process
    yet (a CLI killed between creating its run and starting it).
    """
    rec = read_run_process(paths, run_id)
    if rec is None and creator is not None:
        rec = _from_creator_tag(run_id, creator)
    if rec is None or rec.host != socket.gethostname():
        return None
    who = f"its process (pid {rec.pid} on {rec.host}, recorded {rec.recorded_at})"
    if rec.boot_id and boot_id() and rec.boot_id != boot_id():
        return f"{who} is gone: the machine rebooted since"
    now = read_proc(rec.pid)
    if now is None or now.state in ("Z", "X"):
        return f"{who} is gone"
    if rec.start_ticks >= 0 and now.start != rec.start_ticks:
        return f"{who} is gone (pid {rec.pid} is another process now)"
    return None


# The tag of a run the CLI creates and executes itself (`run --wait`, `resume`): the process
# that will run it. Dagster creates the run NOT_STARTED and starts it only once the
# definitions have loaded (seconds); a CLI killed in between leaves it NOT_STARTED for good,
# with no process record, and it would block the experiment (found by tests/chaos.py).
TAG_CREATOR = "hangar/creator"


def creator_tag() -> str:
    """This process as ``TAG_CREATOR``'s value (the fields of a process record, as JSON)."""
    me = read_proc(os.getpid())
    return json.dumps(
        {
            "host": socket.gethostname(),
            "boot_id": boot_id(),
            "pid": os.getpid(),
            "start_ticks": me.start if me is not None else -1,
            "recorded_at": utcnow().isoformat(),
        },
        sort_keys=True,
    )


def _from_creator_tag(run_id: str, tag: str) -> RunProcess | None:
    try:
        return RunProcess(run_id=run_id, **json.loads(tag))
    except (ValueError, TypeError):
        return None  # a foreign or torn tag: cannot tell


# A run the daemon launched has no creator tag, and no process record until its worker has
# loaded the definitions and started (seconds, or more under load). If the whole `hangar ui`
# dies in between, nothing is left to read, and run monitoring would fail the run only after
# its start timeout (300 s), the experiment waiting beside it all that time (tests/chaos.py).
# On the embedded instance the launcher lives in `hangar ui`'s process tree and only one UI
# runs per home (its lock), so a run that became STARTING before the current UI started, or
# while none runs, was launched by a UI that is gone: its worker, if one ever began, died
# with it, and a late one would find the run failed and stop (Dagster ignores a run worker
# that starts after its run finished).
def launcher_gone(paths: HangarPaths, starting_since: dt.datetime) -> str | None:
    """Why the launcher of a daemon-launched run, STARTING since ``starting_since`` with no
    process record, is gone, or None when the `hangar ui` running now may have launched it."""
    from hangar_dagster.util.procs import PidLock, started_at

    holder = PidLock(paths.ui_lock).holder()
    since = f"STARTING since {starting_since.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC"
    if holder is None:
        return (
            f"its launcher is gone: no `hangar ui` runs on this home, and the run is {since}"
            " with no process recorded"
        )
    ui_start = started_at(holder)
    # One second of slack: the boot time the start is counted from is whole seconds.
    if ui_start is None or starting_since >= ui_start - dt.timedelta(seconds=1):
        return None
    return (
        f"its launcher is gone: the run is {since} with no process recorded, and the"
        f" `hangar ui` that launched it is gone (this one, pid {holder}, started"
        f" {ui_start:%Y-%m-%d %H:%M:%S} UTC)"
    )


def not_under_the_ui(paths: HangarPaths) -> str | None:
    """Why this process may not launch runs on the home's embedded instance, or None.

    There the launcher is the code server of the one `hangar ui` holding the home's lock, and
    ``launcher_gone`` relies on it: a second daemon (``dagster dev`` or ``dagster-daemon``
    started by hand on the same instance) would launch every run twice and its runs would be
    taken for a dead UI's. So a sensor or schedule evaluated anywhere but below that UI
    refuses to launch anything.
    """
    from hangar_dagster.util.procs import PidLock, ancestors

    holder = PidLock(paths.ui_lock).holder()
    if holder is not None and holder in ancestors(os.getpid()):
        return None
    who = f"`hangar ui` pid {holder} holds {paths.ui_lock}" if holder else "no `hangar ui` runs"
    return (
        f"refused: this daemon is not the `hangar ui`'s of HANGAR_HOME {paths.home} ({who});"
        " a second daemon on the embedded instance would launch every run twice. Stop it and"
        " run `hangar ui` (one per home)"
    )
