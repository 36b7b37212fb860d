"""What the container backends (Docker, Kubernetes) share: the wrapper's control directory, the
command's uid, handing the workdir to it, and following the files the wrapper writes.

Both run ``_docker_init`` (standard library only) as the container's pid 1, given a control
directory mounted at ``CONTROL``: ``setup.json`` (argv, env, workdir, uid/gid, limits, the fds
to pass, the unix sockets to bridge) written here, and ``out``, ``err`` and ``fd-N`` that the
wrapper appends the command's output to and this side follows as they grow (``Tail``).
"""

from __future__ import annotations

import json
import os
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from hangar_dagster.trials.sandbox import Mount, SandboxRequest, SandboxUnavailable

CONTROL = "/run/hangar"  # the control directory inside the container
# The unprivileged uid a command without run_as runs as when hangar is root: outside the
# grader's range (grading/grader.py) and any account's.
DEFAULT_UID = 1_400_000_000
# cgroup memory above the command's RLIMIT_AS, for the wrapper and the page cache.
MEMORY_HEADROOM_MB = 128
# The wrapper ends the container itself this long after the time limit (host gone).
SELF_DEADLINE_S = 60
INIT_SOURCE = (Path(__file__).with_name("_docker_init.py")).read_text()
OUTPUT_FILES = ("out", "err")
_ACL_XATTR = "system.posix_acl_access"


def command_user(request: SandboxRequest) -> tuple[int, int]:
    """The (uid, gid) the command runs as: ``run_as``; else ``DEFAULT_UID`` when hangar is root;
    else hangar's own. Never root."""
    if request.run_as is not None:
        return request.run_as.uid, request.run_as.gid
    if os.geteuid() == 0:
        return DEFAULT_UID, DEFAULT_UID
    return os.geteuid(), os.getegid()


# --- handing the workdir to the unprivileged uid --------------------------------------------


def _walk(root: Path) -> Iterator[str]:
    yield str(root)
    if root.is_dir() and not root.is_symlink():
        for dirpath, dirnames, filenames in os.walk(root):
            for name in [*dirnames, *filenames]:
                yield os.path.join(dirpath, name)


def hand_over(roots: Sequence[Path], uid: int) -> list[tuple[Path, int, int]]:
    owners = []
    for root in roots:
        st = root.lstat()
        owners.append((root, st.st_uid, st.st_gid))
        for path in _walk(root):
            os.lchown(path, uid, uid)
    return owners


def hand_back(owners: list[tuple[Path, int, int]], uid: int) -> None:
    for root, owner_uid, owner_gid in owners:
        for path in _walk(root):
            try:
                if os.lstat(path).st_uid == uid:
                    os.lchown(path, owner_uid, owner_gid)
            except FileNotFoundError:
                pass


def _acl_blob(mode: int, uid: int, perm: int) -> bytes:
    """A POSIX access ACL (the kernel's xattr format) of ``mode`` plus user ``uid``: ``perm``."""
    none = 0xFFFFFFFF
    entries = [
        (0x01, (mode >> 6) & 7, none),  # owner
        (0x02, perm, uid),  # the named user
        (0x04, (mode >> 3) & 7, none),  # owning group
        (0x10, perm | ((mode >> 3) & 7), none),  # mask
        (0x20, mode & 7, none),  # others
    ]
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def grant_read(root: Path, uid: int) -> None:
    """Let ``uid`` read (and traverse; connect to a socket) what others may not under ``root``."""
    for path in _walk(root):
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) or st.st_uid == uid:
            continue
        need = 5 if stat.S_ISDIR(st.st_mode) else (6 if stat.S_ISSOCK(st.st_mode) else 4)
        if st.st_mode & need == need:
            continue
        perm = need | (st.st_mode >> 6 & 1 if not stat.S_ISDIR(st.st_mode) else 0)
        try:
            os.setxattr(path, _ACL_XATTR, _acl_blob(st.st_mode, uid, perm), follow_symlinks=False)
        except OSError as err:
            raise SandboxUnavailable(
                f"mount source {path}: cannot give the container's uid {uid} read access "
                f"({err.strerror}); make it readable by others, or use a filesystem with ACLs"
            ) from None


def hand_to_command(
    request: SandboxRequest, uid: int, mounts: Sequence[Mount] | None = None
) -> list[tuple[Path, int, int]]:
    """As root without ``run_as``: the workdir and writable mounts (``mounts``, default the
    request's) become ``uid``'s for the run (``hand_back`` returns them) and the read-only
    mounts readable by it."""
    if request.run_as is not None or os.geteuid() != 0:
        return []
    mounts = request.mounts if mounts is None else mounts
    writable = [request.workdir, *(m.source for m in mounts if m.writable)]
    owners = hand_over(writable, uid)
    for m in mounts:
        if not m.writable:
            grant_read(m.source, uid)
    return owners


# --- the control directory ------------------------------------------------------------------


def write_setup(
    request: SandboxRequest,
    uid: int,
    gid: int,
    control: Path,
    bridges: Sequence[tuple[str, str, int]] = (),
) -> None:
    """The wrapper's ``setup.json`` and the empty files it appends to.

    ``bridges``: (socket path in the container, host, port): the wrapper listens on each unix
    socket and relays every connection to that TCP address (Kubernetes: the run worker's side
    of a socket the request mounts; docs/operations.md).
    """
    stdin = None
    if request.stdin is not None:
        (control / "stdin").write_bytes(request.stdin)
        stdin = f"{CONTROL}/stdin"
    fds = []
    for n in request.pass_fds:
        st = os.fstat(n)
        # Under a uid split the pipe is owned as the caller made it; else it is the
        # command's, as the caller's own descriptor is its own under the other backends.
        owner = (st.st_uid, st.st_gid) if request.run_as is not None else (uid, gid)
        fds.append([n, *owner, stat.S_IMODE(st.st_mode)])
    for name in (*OUTPUT_FILES, *(f"fd-{n}" for n in request.pass_fds)):
        (control / name).touch(mode=0o600)
    run_as = request.run_as
    setup = {
        "argv": request.argv,
        "env": {**request.env, "PWD": str(request.workdir)},
        "workdir": str(request.workdir),
        "uid": uid,
        "gid": gid,
        "memory_bytes": request.memory_mb * 1024 * 1024,
        "nproc": run_as.max_processes if run_as else None,
        "fsize": run_as.max_file_mb * 1024 * 1024 if run_as else None,
        "pass_fds": fds,
        "stdin": stdin,
        "output_limit": max(request.output_limit, 16 * 1024 * 1024),
        "deadline_s": max(1, int(request.timeout_s) + SELF_DEADLINE_S),
        "bridges": [list(b) for b in bridges],
    }
    fd = os.open(control / "setup.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(setup, f)


class Tail(threading.Thread):
    """Follow a file the wrapper appends to, passing each chunk to ``sink`` until stopped.

    The file is opened here, before the container starts, and only read through that
    descriptor: a command that replaces the name (a symlink to a file of hangar's) changes
    nothing of what is read.
    """

    def __init__(self, path: Path, sink: Callable[[bytes], None]) -> None:
        super().__init__(daemon=True)
        self.path, self.sink = path, sink
        self.stop = threading.Event()
        self.file = path.open("rb")
        st = os.fstat(self.file.fileno())
        self.identity = (st.st_dev, st.st_ino)
        self.consumed = 0

    def run(self) -> None:
        with self.file as f:
            pause = 0.002
            while True:
                stopping = self.stop.is_set()
                chunk = f.read(65536)
                if chunk:
                    self.consumed += len(chunk)
                    self.sink(chunk)
                    pause = 0.002
                    continue
                if stopping:
                    return
                time.sleep(pause)
                pause = min(pause * 2, 0.02)


class Kept:
    def __init__(self, limit: int, also: Callable[[bytes], None] | None = None) -> None:
        self.limit, self.also = limit, also
        self.data = bytearray()

    def __call__(self, chunk: bytes) -> None:
        if self.also is not None:
            self.also(chunk)
        room = self.limit - len(self.data)
        if room > 0:
            self.data += chunk[:room]


def write_all(fd: int) -> Callable[[bytes], None]:
    def sink(chunk: bytes) -> None:
        view = memoryview(chunk)
        while view:
            try:
                view = view[os.write(fd, view) :]
            except BrokenPipeError:
                return  # the reader went away: what is left has nowhere to go

    return sink


def tails(control: Path, request: SandboxRequest) -> tuple[Kept, Kept, list[Tail]]:
    """The followers of the wrapper's files (not started) and what keeps stdout and stderr."""
    out = Kept(request.output_limit, request.on_stdout)
    err = Kept(request.output_limit)
    followers = [Tail(control / "out", out), Tail(control / "err", err)]
    followers += [Tail(control / f"fd-{n}", write_all(n)) for n in request.pass_fds]
    return out, err, followers


def stop_tails(followers: Sequence[Tail], reopen: bool = False) -> None:
    """Stop following once each file is read to its end.

    ``reopen``: then read each file once more through a fresh descriptor, from where its
    follower stopped. On a network filesystem (the Kubernetes backend's shared volume) a
    descriptor opened before another node wrote may not see the last writes; a fresh open does
    (close-to-open consistency). Only the same file is read (device and inode checked, no
    symlink followed).
    """
    for t in followers:
        t.stop.set()
    for t in followers:
        if t.is_alive():
            t.join(timeout=30)
        else:
            t.file.close()
    if not reopen:
        return
    for t in followers:
        try:
            fd = os.open(t.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != t.identity or st.st_size <= t.consumed:
                continue
            f.seek(t.consumed)
            while chunk := f.read(65536):
                t.consumed += len(chunk)
                t.sink(chunk)
