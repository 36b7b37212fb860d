"""The container backends' wrapper: pid 1 of every hangar container (Docker) and pod (Kubernetes).

Run as ``python -I -S -c <this file's text> <setup.json>`` (standard library
only: nothing of site-packages or the environment loads). Under Docker it starts as root
inside the container with only CAP_SETUID, CAP_SETGID, CAP_SETPCAP, CAP_CHOWN
and CAP_KILL; under Kubernetes it starts as the command's own unprivileged uid with no
capability at all (the pod's securityContext switched it), and the uid switch below is
skipped. It:

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
   Before that, each ``bridges`` entry (Kubernetes) becomes a unix socket the command can
   connect to, every connection relayed to a TCP address (the run worker's side of a proxy
   socket the request mounts: pods on other nodes cannot share a unix socket);
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
import socket
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
    if os.geteuid() == 0 or os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
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


# The relay is trials/forwarder.py's, the other way round (unix socket in, TCP out): both run
# as standalone standard-library scripts inside sandboxes, so neither can import the other.
def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _relay(client: socket.socket, host: str, port: int) -> None:
    try:
        upstream = socket.create_connection((host, port), timeout=30)
    except OSError:
        client.close()
        return
    upstream.settimeout(None)
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def bridge(path: str, host: str, port: int) -> None:
    """Listen on the unix socket ``path``; relay each connection to ``host:port``."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o666)
    listener.listen(64)

    def serve() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=_relay, args=(client, host, port), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()


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
        if (os.fstat(w).st_uid, os.fstat(w).st_gid) != (uid, gid):
            os.fchown(w, uid, gid)
        copies.append(Copy(r, os.path.join(control, f"fd-{number}"), FD_CAP))
        fds[number] = w
    for path, host, port in setup.get("bridges") or []:
        try:
            bridge(path, host, port)
        except OSError as e:
            fail(f"cannot listen on {path}: {e}")
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
