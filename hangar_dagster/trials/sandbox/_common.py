"""What both local namespace backends share: the visible host paths and the process supervision.

The backends differ only in how they build the namespaces and the mount tree;
both hand ``run_launcher`` an argv that starts the sandbox, and it enforces
the time, memory and output limits the same way:

- memory: ``prlimit --as`` (RLIMIT_AS) on the launcher, inherited by every
  process inside. Chosen because it needs no privileges and no writable
  cgroup (containers such as the one this was built in mount the cgroup
  controllers read-only); the cost is that it limits address space, not
  resident memory, so runtimes that reserve large virtual ranges (JVM, Go,
  V8) need a generous ``memory_mb``.
- time: the launcher starts in its own process group, which also holds the
  pid namespace's init; at the limit the group is killed, and the init's
  death makes the kernel kill everything else in the namespace (a
  double-forked, ``setsid`` child included). ``run_launcher`` then waits
  until no member of the group is alive, so nothing outlives ``run()``.
- output: stdout and stderr are read to EOF in threads; bytes past the limit
  are read and dropped so the command never blocks on a full pipe.
- uid split (``request.run_as``): ``prlimit --nproc`` and ``--fsize`` on the
  launcher too (the process count is not enforced while it is root, and is
  once the command switched uid);
  each backend switches uid its own way (bwrap: ``setpriv``; unshare: its
  init), both ending with every capability set empty and no_new_privs.
- pipes (``request.pass_fds``): inherited under the same numbers through the
  launcher, the namespace setup and the uid switch.
- environment: the launcher is started with exactly ``request.env``; the only
  variable added is ``PWD`` (the workdir), which bwrap always sets and the
  unshare backend sets to match. Passing it as the process environment (not
  as ``--clearenv``/``--setenv`` arguments) keeps secrets out of argv, where
  ``ps`` shows them.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hangar_dagster.trials.sandbox import Mount, SandboxRequest, SandboxResult, SandboxUnavailable

# Shown read-only where present; a symlink (as /bin -> usr/bin on merged-/usr
# systems) is recreated as the same symlink rather than bound.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc")

# Kernel knobs under /proc stay writable to uid 0 even without capabilities
# (kernel.core_pattern runs a program on the host), so both backends cover
# them read-only, as container runtimes do.
PROC_READ_ONLY = tuple(
    p for p in ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus") if Path(p).exists()
)

# hangar_dagster/, bound at its host path so the editable install resolves inside.
PACKAGE_DIR = Path(__file__).resolve().parents[2]

# Bound read-only over /etc/profile in every backend: a login shell keeps the sandbox's environment.
LOGIN_PROFILE = Path(__file__).with_name("login_profile.sh")
PROFILE_TARGET = "/etc/profile"


def require_binary(name: str, package: str) -> str:
    """The absolute path of ``name`` on the host PATH, or SandboxUnavailable naming the package."""
    found = shutil.which(name)
    if found is None:
        raise SandboxUnavailable(f"{name} is not installed (install the {package!r} package)")
    return found


def system_entries() -> list[tuple[str, str | None]]:
    """(path, symlink target or None for a directory) for each system dir present on the host."""
    entries: list[tuple[str, str | None]] = []
    for d in SYSTEM_DIRS:
        p = Path(d)
        if p.is_symlink():
            entries.append((d, os.readlink(p)))
        elif p.is_dir():
            entries.append((d, None))
    return entries


def runtime_dirs() -> list[str]:
    """The Python runtime (base interpreter and venv) and hangar's package, bound read-only."""
    dirs: list[str] = []
    for d in (sys.base_prefix, sys.prefix, str(PACKAGE_DIR)):
        if d not in dirs:
            dirs.append(d)
    return dirs


def sandbox_mounts(
    request: SandboxRequest, *, etc_from_host: bool = True, profile: bool = True
) -> list[Mount]:
    """The request's mounts, then hangar's ``/etc/profile`` over the system's.

    Every backend mounts these (the one place the login-shell fix lives): a login shell an
    agent CLI starts (Codex runs each command as ``bash -lc``) would otherwise read the
    system's ``/etc/profile``, which resets ``PATH`` and drops the trial's venv.
    ``etc_from_host``: ``/etc`` is the host's, bound read-only, where a bind needs the file to
    exist (a host without ``/etc/profile`` has nothing that resets ``PATH``); a container
    engine makes the mount point itself. ``profile`` False: the image has it in place.
    """
    mounts = list(request.mounts)
    if profile and (not etc_from_host or Path(PROFILE_TARGET).is_file()):
        mounts.append(Mount(LOGIN_PROFILE, PROFILE_TARGET))
    return mounts


def check_request(request: SandboxRequest, needs_root: bool = True) -> None:
    """Refuse requests that cannot be mounted, naming the field to fix.

    ``needs_root``: a uid split needs hangar to be root (not so where a container engine
    switches uid).
    """
    if not request.argv:
        raise ValueError("SandboxRequest.argv is empty: give the command to run")
    if request.run_as is not None:
        if request.run_as.uid <= 0 or request.run_as.gid <= 0:
            raise ValueError(
                f"SandboxRequest.run_as {request.run_as}: uid and gid must be positive "
                "(an unprivileged user), not root"
            )
        if needs_root and os.geteuid() != 0:
            raise SandboxUnavailable(
                "SandboxRequest.run_as needs hangar to run as root to switch uid; "
                "leave run_as unset (no uid split) or run as root"
            )
    if not request.workdir.is_absolute() or not request.workdir.is_dir():
        raise ValueError(
            f"SandboxRequest.workdir {request.workdir}: must be an existing absolute directory"
        )
    for m in request.mounts:
        _check_mount(m)


def _check_mount(m: Mount) -> None:
    if not m.target.startswith("/") or ".." in Path(m.target).parts:
        raise ValueError(f"mount target {m.target!r}: must be an absolute path without '..'")
    if not m.source.exists():
        raise ValueError(f"mount source {m.source}: does not exist")


def limits_prefix(request: SandboxRequest) -> list[str]:
    """``prlimit`` with the request's memory limit, and its process limit under a uid split.

    Behind ``setpriv --pdeathsig KILL``: the launcher (and with it the namespace) dies when the
    thread that started it dies, so a SIGKILLed run worker leaves no sandbox behind
    (docs/operations.md, "Who owns the UI's processes").
    """
    setpriv = require_binary("setpriv", "util-linux")
    prlimit = require_binary("prlimit", "util-linux")
    limits = [f"--as={request.memory_mb * 1024 * 1024}"]
    if request.run_as is not None:
        limits.append(f"--nproc={request.run_as.max_processes}")
        limits.append(f"--fsize={request.run_as.max_file_mb * 1024 * 1024}")
    return [setpriv, "--pdeathsig", "KILL", prlimit, *limits, "--"]


def tool_version(argv: list[str]) -> str:
    """First line of ``<tool> --version``, or 'unknown' when it cannot be read."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.strip().splitlines()[0] if out.strip() else "unknown"


class Capture(threading.Thread):
    """Read a pipe to EOF, keeping the first ``limit`` bytes and passing every chunk to ``sink``."""

    def __init__(
        self, stream: object, limit: int, sink: Callable[[bytes], None] | None = None
    ) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.limit = limit
        self.sink = sink
        self.kept = bytearray()
        self.total = 0  # bytes read, kept or not

    def run(self) -> None:
        fd = self.stream.fileno()  # type: ignore[attr-defined]
        while chunk := os.read(fd, 65536):
            self.total += len(chunk)
            if self.sink is not None:
                self.sink(chunk)
            room = self.limit - len(self.kept)
            if room > 0:
                self.kept += chunk[:room]
        self.stream.close()  # type: ignore[attr-defined]


def _feed(stream: object, data: bytes) -> None:
    try:
        stream.write(data)  # type: ignore[attr-defined]
    except BrokenPipeError:
        pass  # the command exited without reading all of its input
    finally:
        try:
            stream.close()  # type: ignore[attr-defined]
        except BrokenPipeError:
            pass


def _group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is still in process group ``pgid``."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command name: state ppid pgrp ...
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _exited(pid: int, deadline: float, cancel: threading.Event | None = None) -> bool:
    """Wait until ``pid`` exits, ``deadline`` passes or ``cancel`` is set, without reaping it.

    Woken by the exit itself through a pidfd (readable once the process has exited, not
    reaping it); where there is none (Linux before 5.3), by polling with a growing pause. Both
    look at ``cancel`` at least every 50 ms.
    """
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except OSError:
        pidfd = None
    pause = 0.001
    try:
        while True:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
            left = deadline - time.monotonic()
            if left <= 0 or (cancel is not None and cancel.is_set()):
                return False
            if pidfd is not None:
                select.select([pidfd], [], [], min(left, 0.05))
            else:
                time.sleep(min(pause, left))
                pause = min(pause * 2, 0.05)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 10
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.01)


def run_launcher(
    argv: list[str],
    request: SandboxRequest,
    pass_fds: tuple[int, ...] = (),
    after_start: list[tuple[int, bytes]] | None = None,
) -> SandboxResult:
    """Start ``argv`` (a sandbox launcher) and supervise it under the request's limits.

    ``after_start`` are (fd, bytes) pairs written to pipe write ends once the
    launcher runs (e.g. setup data for the sandbox's init); each fd is closed
    after writing.
    """
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        env=request.env,
        stdin=subprocess.PIPE if request.stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        pass_fds=(*pass_fds, *request.pass_fds),
        close_fds=True,
    )
    out = Capture(proc.stdout, request.output_limit, request.on_stdout)
    err = Capture(proc.stderr, request.output_limit)
    out.start()
    err.start()
    feeders: list[threading.Thread] = []
    if request.stdin is not None:
        feeders.append(
            threading.Thread(target=_feed, args=(proc.stdin, request.stdin), daemon=True)
        )
    for fd, data in after_start or []:
        feeders.append(
            threading.Thread(target=_feed, args=(os.fdopen(fd, "wb"), data), daemon=True)
        )
    for t in feeders:
        t.start()
    try:
        stopped = not _exited(proc.pid, started + request.timeout_s, request.cancel)
    finally:
        # Also on a normal exit, to be sure the namespace init is gone. The
        # launcher is not reaped yet, so its pid (the group id) can't be reused.
        _kill_group(proc.pid)
        proc.wait()
    for t in (out, err, *feeders):
        t.join(timeout=10)
    cancelled = stopped and request.cancel is not None and request.cancel.is_set()
    return SandboxResult(
        exit_code=None if stopped else proc.returncode,
        timed_out=stopped and not cancelled,
        cancelled=cancelled,
        stdout=bytes(out.kept).decode("utf-8", errors="replace"),
        stderr=bytes(err.kept).decode("utf-8", errors="replace"),
        duration_s=time.monotonic() - started,
    )


def read_sandbox_file(path: Path, limit: int) -> str | None:
    """Up to ``limit`` bytes of a file a sandboxed command could write, read from the host.

    None unless ``path`` is a regular file: a symlink left by the command would
    otherwise be followed on the host, outside the sandbox.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return f.read(limit).decode("utf-8", errors="replace")
