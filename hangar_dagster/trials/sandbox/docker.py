"""The Docker backend: one container per request, through the Docker Engine API.

Chosen by ``environment.sandbox: docker``; the image is the request's
``image`` (callers pass the pinned ``environment.image``), else the backend's,
else ``HANGAR_SANDBOX_IMAGE``, else the base image ``hangar-base:bookworm`` that
``hangar image build`` makes.
The container gets what a namespace sandbox gets: the host's Python runtime
and hangar's package (``_common.runtime_dirs()``) and the request's mounts
bound read-only at their host paths (the image is Debian bookworm like the
host, so the host's interpreter runs there), the workdir bound read-write at
its path, a tmpfs ``/tmp``, a read-only root filesystem, ``network_mode:
none`` (loopback only; ``host`` for ``network=True``), every capability
dropped but the four the wrapper needs to switch user, ``no-new-privileges``,
and pids/memory/CPU limits. Every container carries ``hangar.managed=1``, its
owner process and any labels the caller gives (experiment, trial), and is
removed when ``run`` returns, whatever happened; ``cleanup_leftovers`` removes
those whose owner process is gone (a crashed run).

With ``HANGAR_SANDBOX_RUNTIME=image`` (``SandboxRuntime.in_image``: hangar itself runs in a
container of the project image, deploy/docker, talking to the host's engine) the runtime is
not bound: the engine would look for ``/opt/hangar`` on its own host. The sandbox image must
then carry it at the same paths (its ``hangar.runtime`` label equals this ``sys.prefix``; it
also holds the login profile at ``/etc/profile``), and every bind source (control dir,
workdir, mounts) must lie under a directory shared at the same path with the engine's host
(``HANGAR_HOME``, ``TMPDIR``), else the run is refused naming the path.

Pid 1 is ``_docker_init`` (hangar's own code, standard library only): it runs
the command as an unprivileged user, the request's ``run_as`` or, without
one, the caller's uid (or ``DEFAULT_UID`` when hangar runs as root), never
root. Host descriptors cannot cross into a container, so ``pass_fds`` are
made inside: the wrapper creates pipes at those numbers, copies what the
command writes into files in a 0700 root-owned control directory mounted from
the host, and this backend copies the files, as they grow, into the host's
descriptors; stdout, stderr and stdin go the same way. Docker's own logging
is off (nothing of the output lands in the engine's log files).

When hangar runs as root and there is no ``run_as``, the workdir and the
writable mounts are handed to ``DEFAULT_UID`` for the run (chowned, and the
files owned by it handed back to the original owner afterwards), and the
read-only mounts are given a POSIX ACL entry for it where their mode would
keep it out (a 0700 socket directory, say); the uid is used by nothing but
these containers, which see only what they mount.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hangar_dagster.trials.sandbox import (
    Sandbox,
    SandboxRequest,
    SandboxResult,
    SandboxRuntime,
    SandboxUnavailable,
)
from hangar_dagster.trials.sandbox._common import check_request, runtime_dirs, sandbox_mounts

MANAGED_LABEL = "hangar.managed"
OWNER_LABEL = "hangar.owner"
# On an image that carries hangar's runtime (deploy/docker/Dockerfile): its sys.prefix.
RUNTIME_LABEL = "hangar.runtime"
BASE_IMAGE = "hangar-base:bookworm"  # environment/image.py makes it
CONTROL = "/run/hangar"  # the control directory inside the container
# The unprivileged uid a command without run_as runs as when hangar is root: outside the
# grader's range (grading/grader.py) and any account's.
DEFAULT_UID = 1_400_000_000
# What the wrapper needs to switch user and clean up; it drops them all before exec.
_WRAPPER_CAPS = ["SETUID", "SETGID", "SETPCAP", "CHOWN", "KILL"]
# cgroup memory above the command's RLIMIT_AS, for the wrapper and the page cache.
_MEMORY_HEADROOM_MB = 128
_PIDS_LIMIT = 1024
# The wrapper ends the container itself this long after the time limit (host gone).
_SELF_DEADLINE_S = 60
_INIT_SOURCE = (Path(__file__).with_name("_docker_init.py")).read_text()
_ACL_XATTR = "system.posix_acl_access"


@functools.cache
def client() -> Any:
    """The Docker engine (DOCKER_HOST or the local socket), or SandboxUnavailable saying why."""
    import docker
    import docker.errors

    try:
        c = docker.from_env(timeout=120)
        c.ping()
    except docker.errors.DockerException as err:
        raise SandboxUnavailable(
            f"the Docker engine is not reachable ({err}); start dockerd (scripts/bootstrap "
            "does, as root) or choose environment.sandbox: bwrap"
        ) from None
    return c


def engine_version() -> str:
    return str(client().version().get("Version", "unknown"))


@functools.cache
def _resolve(ref: str) -> tuple[str, tuple[str, ...]]:
    """(image id, repo digests) of ``ref`` on the engine, or SandboxUnavailable naming the fix."""
    import docker.errors

    try:
        image = client().images.get(ref)
    except docker.errors.ImageNotFound:
        hint = "`hangar image build`" if ref == BASE_IMAGE else f"`docker pull {ref}`"
        raise SandboxUnavailable(
            f"image {ref} is not on this Docker engine: run {hint} (see docs/operations.md)"
        ) from None
    return str(image.id), tuple(image.attrs.get("RepoDigests") or ())


@functools.cache
def _labels(ref: str) -> dict[str, str]:
    return dict((client().images.get(ref).attrs.get("Config") or {}).get("Labels") or {})


def check_runtime_image(ref: str, runtime: SandboxRuntime) -> None:
    """With the runtime in the image: the image says it carries this process's, at its path."""
    if not runtime.in_image:
        return
    _resolve(ref)
    found = _labels(ref).get(RUNTIME_LABEL)
    if found != sys.prefix:
        raise SandboxUnavailable(
            f"image {ref} does not carry hangar's runtime at {sys.prefix} (label "
            f"{RUNTIME_LABEL}={found!r}), and HANGAR_SANDBOX_RUNTIME=image binds none: pin "
            "environment.image (or HANGAR_SANDBOX_IMAGE) to the project image hangar runs in "
            "(deploy/docker), or set HANGAR_SANDBOX_RUNTIME=host where hangar runs on the "
            "engine's host"
        )


def check_shared(sources: list[Path], runtime: SandboxRuntime) -> None:
    """With the runtime in the image: every bind source is under a shared directory."""
    if not runtime.in_image:
        return
    for source in sources:
        resolved = source.resolve()
        if not any(resolved.is_relative_to(root) for root in runtime.shared):
            roots = ", ".join(str(r) for r in runtime.shared) or "none"
            raise SandboxUnavailable(
                f"bind source {source} is outside the directories shared with the Docker "
                f"engine's host at the same path ({roots}): the engine would bind its own "
                "host's path. Keep HANGAR_HOME and TMPDIR under the shared mount "
                "(HANGAR_SHARED, deploy/docker) and the mounts under them"
            )


def image_reference(ref: str) -> str:
    """How ``ref`` is recorded: itself when it is a digest of the image the engine has, else
    the id of what the engine has under that name (what a container of it really runs)."""
    image_id, repo_digests = _resolve(ref)
    if ref == image_id or ref in repo_digests:
        return ref
    return image_id


def _process_start(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


@functools.cache
def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{_process_start(os.getpid())}"


def cleanup_leftovers() -> int:
    """Remove hangar's containers whose owner process (on this host) is gone; how many."""
    import docker.errors

    host = socket.gethostname()
    removed = 0
    for c in client().api.containers(all=True, filters={"label": f"{MANAGED_LABEL}=1"}):
        owner = (c.get("Labels") or {}).get(OWNER_LABEL, "")
        parts = owner.split(":")
        if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
            continue
        if _process_start(int(parts[1])) == parts[2]:
            continue  # a live run's container
        try:
            client().api.remove_container(c["Id"], force=True, v=True)
            removed += 1
        except docker.errors.NotFound:
            pass
    return removed


# --- handing the workdir to the unprivileged uid --------------------------------------------


def _walk(root: Path) -> Iterator[str]:
    yield str(root)
    if root.is_dir() and not root.is_symlink():
        for dirpath, dirnames, filenames in os.walk(root):
            for name in [*dirnames, *filenames]:
                yield os.path.join(dirpath, name)


def _hand_over(roots: list[Path], uid: int) -> list[tuple[Path, int, int]]:
    owners = []
    for root in roots:
        st = root.lstat()
        owners.append((root, st.st_uid, st.st_gid))
        for path in _walk(root):
            os.lchown(path, uid, uid)
    return owners


def _hand_back(owners: list[tuple[Path, int, int]], uid: int) -> None:
    for root, owner_uid, owner_gid in owners:
        for path in _walk(root):
            try:
                if os.lstat(path).st_uid == uid:
                    os.lchown(path, owner_uid, owner_gid)
            except FileNotFoundError:
                pass


def _acl_blob(mode: int, uid: int, perm: int) -> bytes:
    """A POSIX access ACL (the kernel's xattr format) of ``mode`` plus user ``uid``: ``perm``."""
    import struct

    none = 0xFFFFFFFF
    entries = [
        (0x01, (mode >> 6) & 7, none),  # owner
        (0x02, perm, uid),  # the named user
        (0x04, (mode >> 3) & 7, none),  # owning group
        (0x10, perm | ((mode >> 3) & 7), none),  # mask
        (0x20, mode & 7, none),  # others
    ]
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def _grant_read(root: Path, uid: int) -> None:
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


# --- the run -------------------------------------------------------------------------------


class _Tail(threading.Thread):
    """Follow a file the wrapper appends to, passing each chunk to ``sink`` until stopped."""

    def __init__(self, path: Path, sink: Callable[[bytes], None]) -> None:
        super().__init__(daemon=True)
        self.path, self.sink = path, sink
        self.stop = threading.Event()

    def run(self) -> None:
        with self.path.open("rb") as f:
            pause = 0.002
            while True:
                stopping = self.stop.is_set()
                chunk = f.read(65536)
                if chunk:
                    self.sink(chunk)
                    pause = 0.002
                    continue
                if stopping:
                    return
                time.sleep(pause)
                pause = min(pause * 2, 0.02)


class _Kept:
    def __init__(self, limit: int, also: Callable[[bytes], None] | None = None) -> None:
        self.limit, self.also = limit, also
        self.data = bytearray()

    def __call__(self, chunk: bytes) -> None:
        if self.also is not None:
            self.also(chunk)
        room = self.limit - len(self.data)
        if room > 0:
            self.data += chunk[:room]


def _write_all(fd: int) -> Callable[[bytes], None]:
    def sink(chunk: bytes) -> None:
        view = memoryview(chunk)
        while view:
            try:
                view = view[os.write(fd, view) :]
            except BrokenPipeError:
                return  # the reader went away: what is left has nowhere to go

    return sink


# exec: as under the namespace backends (a script in /tmp runs).
_TMPFS = {"/tmp": "rw,exec,nosuid,nodev,mode=1777"}


class DockerSandbox(Sandbox):
    name = "docker"

    def _image_ref(self, request: SandboxRequest) -> str:
        return request.image or self.image or self.runtime.image or BASE_IMAGE

    def run(self, request: SandboxRequest) -> SandboxResult:
        check_request(request, needs_root=False)
        api = client().api
        ref = self._image_ref(request)
        image_id, _ = _resolve(ref)
        check_runtime_image(ref, self.runtime)
        check_shared([request.workdir, *(m.source for m in request.mounts)], self.runtime)
        if request.run_as is not None:
            uid, gid = request.run_as.uid, request.run_as.gid
        elif os.geteuid() == 0:
            uid = gid = DEFAULT_UID
        else:
            uid, gid = os.geteuid(), os.getegid()
        owners: list[tuple[Path, int, int]] = []
        if request.run_as is None and os.geteuid() == 0:
            writable = [request.workdir, *(m.source for m in request.mounts if m.writable)]
            owners = _hand_over(writable, uid)
            for m in request.mounts:
                if not m.writable:
                    _grant_read(m.source, uid)
        # Under TMPDIR: with the runtime in the image, TMPDIR is on the shared mount.
        control = Path(tempfile.mkdtemp(prefix="hangar-docker-"))
        try:
            check_shared([control], self.runtime)
            return self._run(api, image_id, request, uid, gid, control)
        finally:
            _hand_back(owners, uid)
            shutil.rmtree(control, ignore_errors=True)

    def _setup(self, request: SandboxRequest, uid: int, gid: int, control: Path) -> None:
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
        for name in ("out", "err", *(f"fd-{n}" for n in request.pass_fds)):
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
            "deadline_s": max(1, int(request.timeout_s) + _SELF_DEADLINE_S),
        }
        fd = os.open(control / "setup.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(setup, f)

    def _create(self, api: Any, image_id: str, request: SandboxRequest, control: Path) -> str:
        from docker.types import LogConfig, Mount

        mounts = [Mount(CONTROL, str(control), type="bind", read_only=False)]
        in_image = self.runtime.in_image
        for d in [] if in_image else runtime_dirs():
            mounts.append(Mount(d, d, type="bind", read_only=True))
        wd = str(request.workdir)
        mounts.append(Mount(wd, wd, type="bind", read_only=False))
        # In the image the login profile is its /etc/profile already (deploy/docker/Dockerfile).
        for m in sandbox_mounts(request, etc_from_host=False, profile=not in_image):
            mounts.append(Mount(m.target, str(m.source), type="bind", read_only=not m.writable))
        memory = (request.memory_mb + _MEMORY_HEADROOM_MB) * 1024 * 1024
        host_config = api.create_host_config(
            mounts=mounts,
            tmpfs=_TMPFS,
            read_only=True,
            network_mode="host" if request.network else "none",
            cap_drop=["ALL"],
            cap_add=_WRAPPER_CAPS,
            security_opt=["no-new-privileges"],
            mem_limit=memory,
            memswap_limit=memory,
            pids_limit=_PIDS_LIMIT,
            nano_cpus=int(request.cpus * 1e9) if request.cpus else None,
            log_config=LogConfig(type="none"),
            ipc_mode="private",
        )
        labels = {
            **self.labels,
            **request.labels,
            MANAGED_LABEL: "1",
            OWNER_LABEL: _owner(),
        }
        created = api.create_container(
            image=image_id,
            command=[sys.executable, "-I", "-S", "-c", _INIT_SOURCE, f"{CONTROL}/setup.json"],
            entrypoint=[],
            user="0:0",
            working_dir="/",
            labels=labels,
            host_config=host_config,
            network_disabled=False,
        )
        return str(created["Id"])

    def _run(
        self,
        api: Any,
        image_id: str,
        request: SandboxRequest,
        uid: int,
        gid: int,
        control: Path,
    ) -> SandboxResult:
        import docker.errors

        started = time.monotonic()
        self._setup(request, uid, gid, control)
        out = _Kept(request.output_limit, request.on_stdout)
        err = _Kept(request.output_limit)
        tails = [_Tail(control / "out", out), _Tail(control / "err", err)]
        tails += [_Tail(control / f"fd-{n}", _write_all(n)) for n in request.pass_fds]
        cid: str | None = None
        waited: dict[str, Any] = {}
        done = threading.Event()

        def wait() -> None:
            try:
                waited.update(api.wait(cid, timeout=request.timeout_s + 2 * _SELF_DEADLINE_S))
            except Exception as exc:  # noqa: BLE001  any failure ends the wait; reported below
                waited["error"] = exc
            done.set()

        try:
            try:
                cid = self._create(api, image_id, request, control)
                api.start(cid)
            except docker.errors.APIError as exc:
                raise SandboxUnavailable(f"Docker could not start the container: {exc}") from None
            for t in tails:
                t.start()
            waiter = threading.Thread(target=wait, daemon=True)
            waiter.start()
            deadline = started + request.timeout_s
            stopped = False
            while not done.wait(min(0.02, max(0.0, deadline - time.monotonic()))):
                if time.monotonic() >= deadline or (request.cancel and request.cancel.is_set()):
                    stopped = True
                    try:
                        api.kill(cid)
                    except docker.errors.APIError:
                        pass  # it exited meanwhile
                    done.wait(30)
                    break
        finally:
            if cid is not None:
                try:
                    api.remove_container(cid, force=True, v=True)
                except docker.errors.NotFound:
                    pass
            for t in tails:
                t.stop.set()
            for t in tails:
                if t.is_alive():
                    t.join(timeout=30)
        if "error" in waited and not stopped:
            raise SandboxUnavailable(f"lost the container while waiting: {waited['error']}")
        cancelled = stopped and request.cancel is not None and request.cancel.is_set()
        code = waited.get("StatusCode")
        return SandboxResult(
            exit_code=None if stopped else (int(code) if code is not None else None),
            timed_out=stopped and not cancelled,
            cancelled=cancelled,
            stdout=bytes(out.data).decode("utf-8", errors="replace"),
            stderr=bytes(err.data).decode("utf-8", errors="replace"),
            duration_s=time.monotonic() - started,
        )

    def describe(self) -> dict[str, str]:
        info = {
            "backend": self.name,
            "version": f"docker-engine {engine_version()}",
            # Namespaces, as the local backends: what environment.isolation names.
            "isolation": "namespaces",
        }
        if self.image is not None:
            # What the containers run: the drift check compares it with the pinned image.
            info["image"] = image_reference(self.image)
        return info
