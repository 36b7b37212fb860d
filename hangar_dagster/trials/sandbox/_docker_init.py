"""The Docker backend's in-container wrapper: pid 1 of every hangar container.

Run as ``python -I -S -c <this file's text> <setup.json>`` (standard library
only: nothing of site-packages or the environment loads). It starts as root
inside the container with only CAP_SETUID, CAP_SETGID, CAP_SETPCAP, CAP_CHOWN
and CAP_KILL, and:

1. reads the setup (argv, env, workdir, uid/gid, limits, the fds to pass) from
   the control directory, a 0700 root-owned host directory mounted at
   ``/run/hangar`` that the command, once unprivileged, cannot enter;
2. makes a pipe for stdout, stderr and each requested fd number (the write end
   owned like the host's descriptor, so ``/proc/self/fd/N`` reopens it);
3. forks the command: the pipes are put at their numbers and every other
   descriptor closed, then the bounding set is emptied, the groups cleared,
   the uid/gid switched and the remaining capability sets zeroed (no_new_privs
   is already set by Docker's ``no-new-privileges``), under RLIMIT_AS (and
   RLIMIT_NPROC/RLIMIT_FSIZE for a uid split);
4. copies what arrives on the pipes into files in the control directory (the
   host backend tails them into the host's pipes and output), stdout and
   stderr cut at their limit and the rest read and dropped;
5. when the command exits, kills everything else in the container (as the
   namespace backends' init does), drains the pipes and exits with the
   command's status (128 + signal when killed by one). 125: the wrapper could
   not set up the command.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
import threading

PR_CAPBSET_DROP = 24
CAP_VERSION_3 = 0x20080522
# Past this a passed-fd stream is dropped: the host's readers keep far less.
FD_CAP = 64 * 1024 * 1024


def fail(what: str) -> None:
    os.write(2, f"hangar-docker-init: {what}\n".encode())
    os._exit(125)


class Copy(threading.Thread):
    """Pipe read end -> file, keeping the first ``limit`` bytes and draining the rest."""

    def __init__(self, read_fd: int, path: str, limit: int) -> None:
        super().__init__(daemon=True)
        self.read_fd, self.limit = read_fd, limit
        self.out = os.open(path, os.O_WRONLY | os.O_APPEND)

    def run(self) -> None:
        kept = 0
        while chunk := os.read(self.read_fd, 65536):
            room = self.limit - kept
            if room > 0:
                os.write(self.out, chunk[:room])
                kept += min(room, len(chunk))
        os.close(self.out)


def drop_to(uid: int, gid: int, libc: ctypes.CDLL) -> None:
    cap = 0
    while libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    # Leaving uid 0 empties the permitted and effective sets; zero the inheritable one too.
    header = (ctypes.c_uint32 * 2)(CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc.capset(header, data) != 0:
        fail("capset")


def child(setup: dict, fds: dict[int, int], libc: ctypes.CDLL) -> None:  # type: ignore[type-arg]
    try:
        stdin = os.open(setup["stdin"] or "/dev/null", os.O_RDONLY)
        wanted = {0: stdin, **fds}
        # Move every source above every target first, so no dup2 overwrites a source.
        top = max([*wanted, 2]) + 1
        moved = {t: fcntl_dup(s, top) for t, s in wanted.items()}
        for target, source in moved.items():
            os.dup2(source, target)
        keep = set(wanted)
        for fd in map(int, os.listdir("/proc/self/fd")):
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        os.setsid()
        # Python ignores these at start, and an exec keeps ignored signals: give them back.
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGALRM):
            signal.signal(sig, signal.SIG_DFL)
        signal.alarm(0)
        as_bytes = setup["memory_bytes"]
        resource.setrlimit(resource.RLIMIT_AS, (as_bytes, as_bytes))
        if setup["nproc"] is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (setup["nproc"], setup["nproc"]))
            resource.setrlimit(resource.RLIMIT_FSIZE, (setup["fsize"], setup["fsize"]))
        drop_to(setup["uid"], setup["gid"], libc)
        os.chdir(setup["workdir"])
    except OSError as e:
        fail(f"cannot set up the command as uid {setup['uid']}: {e}")
    try:
        os.execvpe(setup["argv"][0], setup["argv"], setup["env"])
    except OSError as e:
        os.write(2, f"hangar-docker-init: cannot run {setup['argv'][0]}: {e.strerror}\n".encode())
        os._exit(127)


def fcntl_dup(fd: int, low: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD, low)


def main() -> None:
    control = os.path.dirname(sys.argv[1])
    # The wrapper's own complaints (a traceback included) are the command's stderr.
    err = os.open(os.path.join(control, "err"), os.O_WRONLY | os.O_APPEND)
    os.dup2(err, 2)
    os.close(err)
    with open(sys.argv[1]) as f:
        setup = json.load(f)
    libc = ctypes.CDLL(None, use_errno=True)
    copies: list[Copy] = []
    fds: dict[int, int] = {}
    for name, target, limit in (
        ("out", 1, setup["output_limit"]),
        ("err", 2, setup["output_limit"]),
    ):
        r, w = os.pipe()
        copies.append(Copy(r, os.path.join(control, name), limit))
        fds[target] = w
    for number, uid, gid, mode in setup["pass_fds"]:
        r, w = os.pipe()
        os.fchmod(w, mode)  # while still its owner: no CAP_FOWNER needed
        os.fchown(w, uid, gid)
        copies.append(Copy(r, os.path.join(control, f"fd-{number}"), FD_CAP))
        fds[number] = w
    # Past the host's limit (host gone, say) the container ends itself.
    signal.signal(signal.SIGALRM, lambda *_: os._exit(124))
    signal.alarm(int(setup["deadline_s"]))
    pid = os.fork()
    if pid == 0:
        child(setup, fds, libc)
    for w in fds.values():
        os.close(w)
    for c in copies:
        c.start()
    while True:
        done, status = os.wait()
        if done == pid:
            break
    # Whatever the command left behind goes with it, so the pipes reach EOF.
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        while True:
            os.wait()
    except ChildProcessError:
        pass
    for c in copies:
        c.join()
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
