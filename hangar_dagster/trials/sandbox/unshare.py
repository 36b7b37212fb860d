"""The util-linux backend: ``unshare`` plus a small init that builds the mount tree.

For hosts without bubblewrap. ``unshare --mount --pid --net --ipc --uts
--fork --kill-child`` starts a Python init (``_INIT`` below, run with ``-I -S``
so nothing of the environment or site-packages loads) as pid 1 of the new pid
namespace. The init mounts a tmpfs root, binds into it the same paths as the
bwrap backend (system dirs, Python runtime and hangar's package read-only,
submounts included; the request's mounts; the workdir read-write), mounts
``/proc`` (kernel knobs read-only), a minimal ``/dev`` and a tmpfs ``/tmp``,
``pivot_root``s into it and unmounts the host's tree, drops every capability
(bounding set too) and sets no_new_privs, then forks the command in a new
session and waits for it. When the command exits the init exits with its
status, and the kernel kills whatever else is left in the namespace.
With ``run_as`` (the uid split) the forked child switches to the unprivileged
uid/gid (no groups) before exec; as in bwrap, ``/tmp`` is world-writable
(sticky).

The setup (mount list, argv, environment) reaches the init through a pipe, so
the environment's values never appear in argv.

Differences from bwrap: the init is a Python process, so with ``memory_mb``
below ~64 the init itself may not start (RLIMIT_AS covers it too); the init
knows the pivot_root syscall number only for x86_64 and aarch64; ``/dev``
has no ``pts``/``ptmx`` (no pseudo-terminals inside).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
from pathlib import Path

from hangar_dagster.trials.sandbox import Sandbox, SandboxRequest, SandboxResult, SandboxUnavailable
from hangar_dagster.trials.sandbox._common import (
    PROC_READ_ONLY,
    check_request,
    limits_prefix,
    require_binary,
    run_launcher,
    runtime_dirs,
    sandbox_mounts,
    system_entries,
    tool_version,
)

_INIT = r"""
import ctypes, fcntl, json, os, platform, re, socket, struct, sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MNT_DETACH = 32, 4096, 16384, 2
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
SIOCSIFFLAGS, IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x8914, 0x1, 0x8, 0x40
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
libc = ctypes.CDLL(None, use_errno=True)


# 125: the sandbox could not be set up (distinct from the command's own statuses).
def fail(what):
    err = ctypes.get_errno()
    os.write(2, f"hangar-unshare: {what}: {os.strerror(err)}\n".encode())
    os._exit(125)


def c(s):
    return s.encode() if s is not None else None


def mount(src, dst, fstype, flags, data=None):
    if libc.mount(c(src), c(dst), c(fstype), ctypes.c_ulong(flags), c(data)) != 0:
        fail(f"mount {src or fstype} on {dst}")


def mounts_at_or_under(path):
    unesc = lambda s: re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            point = unesc(parts[4])
            if point == path or point.startswith(path.rstrip("/") + "/"):
                out.append((point, parts[5].split(",")))
    return out


def bind(src, dst, writable):
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    elif not os.path.exists(dst):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "x").close()
    mount(src, dst, None, MS_BIND | MS_REC)
    if writable:
        return
    # A bind remount changes one mount only: make every submount read-only too.
    for point, opts in mounts_at_or_under(dst):
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
        mount(None, point, None, flags | (MS_NOEXEC if "noexec" in opts else 0))


def main():
    fd = int(sys.argv[1])
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    os.close(fd)
    setup = json.loads(data)
    if setup["loopback"]:
        # A new network namespace starts with lo down; bwrap brings it up, and so do we, so a
        # command (the model API forwarder) can listen on and reach 127.0.0.1 inside.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                flags = IFF_UP | IFF_LOOPBACK | IFF_RUNNING
                fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags))
            except OSError as e:
                os.write(2, f"hangar-unshare: cannot bring up lo: {e.strerror}\n".encode())
                os._exit(125)
    root = setup["root"]
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    for path, link in setup["system"]:
        if link is None:
            bind(path, root + path, False)
        else:
            os.symlink(link, root + path)
    # The private /tmp first: the runtime may live under /tmp (a checkout there) and must show.
    os.mkdir(root + "/tmp")
    mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for d in setup["runtime"]:
        bind(d, root + d, False)
    os.mkdir(root + "/proc")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for p in setup["proc_read_only"]:
        bind(root + p, root + p, False)
    dev = root + "/dev"
    os.mkdir(dev)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID, "mode=0755")
    for node in ("null", "zero", "full", "random", "urandom", "tty"):
        bind("/dev/" + node, dev + "/" + node, True)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, dev + "/" + name)
    os.mkdir(dev + "/shm")
    mount("tmpfs", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    workdir = setup["workdir"]
    bind(workdir, root + workdir, True)
    for src, target, writable in setup["mounts"]:
        bind(src, root + target, writable)

    number = PIVOT_ROOT.get(platform.machine())
    if number is None:
        os.write(2, f"hangar-unshare: no pivot_root for {platform.machine()}\n".encode())
        os._exit(125)
    os.chdir(root)
    # pivot_root(".", ".") stacks the old root on the new one; detaching it leaves only ours.
    if libc.syscall(number, b".", b".") != 0:
        fail("pivot_root")
    if libc.umount2(b".", MNT_DETACH) != 0:
        fail("umount old root")
    os.chdir(workdir)

    cap = 0
    while libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        fail("no_new_privs")

    argv, env, run_as = setup["argv"], setup["env"], setup["run_as"]
    child = os.fork()
    if child == 0:
        os.setsid()
        if run_as is not None:
            # Leaving uid 0 for good empties the permitted, effective and ambient sets;
            # the bounding set is already empty and no_new_privs set.
            uid, gid = run_as
            try:
                os.setgroups([])
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
            except OSError as e:
                os.write(2, f"hangar-unshare: cannot switch to uid {uid}: {e.strerror}\n".encode())
                os._exit(125)
        try:
            os.execvpe(argv[0], argv, env)
        except OSError as e:
            os.write(2, f"hangar-unshare: cannot run {argv[0]}: {e.strerror}\n".encode())
            os._exit(127)
    while True:
        pid, status = os.wait()
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)


main()
"""


def _namespace_args(network: bool) -> list[str]:
    args = [
        "--mount",
        "--pid",
        "--ipc",
        "--uts",
        "--fork",
        "--kill-child",
        "--propagation",
        "private",
    ]
    if not network:
        args.append("--net")
    return args


class UnshareSandbox(Sandbox):
    name = "unshare"

    def _binary(self) -> str:
        unshare = require_binary("unshare", "util-linux")
        _probe(unshare)
        return unshare

    def run(self, request: SandboxRequest) -> SandboxResult:
        check_request(request)
        return _launch(self._binary(), request)

    def describe(self) -> dict[str, str]:
        return {
            "backend": self.name,
            "version": tool_version([self._binary(), "--version"]),
            "isolation": "namespaces",
        }


def _launch(unshare: str, request: SandboxRequest) -> SandboxResult:
    root = tempfile.mkdtemp(prefix="hangar-unshare-root-")
    read_fd, write_fd = os.pipe()
    setup = {
        "root": root,
        "system": system_entries(),
        "runtime": runtime_dirs(),
        "proc_read_only": list(PROC_READ_ONLY),
        "workdir": str(request.workdir),
        "mounts": [[str(m.source), m.target, m.writable] for m in sandbox_mounts(request)],
        "argv": request.argv,
        "env": {**request.env, "PWD": str(request.workdir)},
        "run_as": None if request.run_as is None else [request.run_as.uid, request.run_as.gid],
        "loopback": not request.network,  # only the sandbox's own namespace; never the host's lo
    }
    argv = [
        *limits_prefix(request),
        unshare,
        *_namespace_args(request.network),
        "--",
        sys.executable,
        "-I",
        "-S",
        "-c",
        _INIT,
        str(read_fd),
    ]
    try:
        return run_launcher(
            argv, request, pass_fds=(read_fd,), after_start=[(write_fd, json.dumps(setup).encode())]
        )
    finally:
        os.close(read_fd)
        # The tmpfs root existed only in the sandbox's mount namespace: here it is empty.
        os.rmdir(root)


@functools.cache
def _probe(unshare: str) -> None:
    """Build one sandbox per process, so a host that can't fails as SandboxUnavailable."""
    with tempfile.TemporaryDirectory(prefix="hangar-unshare-probe-") as wd:
        req = SandboxRequest(argv=["/bin/true"], workdir=Path(wd), env={}, timeout_s=30)
        res = _launch(unshare, req)
    if res.exit_code != 0:
        why = res.stderr.strip() or f"exit {res.exit_code}"
        raise SandboxUnavailable(
            f"unshare cannot create namespaces and mounts here ({why}); it needs root "
            "(or CAP_SYS_ADMIN) and util-linux's unshare/prlimit"
        )
