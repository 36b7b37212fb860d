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
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
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
from hangar_dagster.trials.sandbox._container import (
    CONTROL,
    DEFAULT_UID,
    INIT_SOURCE,
    MEMORY_HEADROOM_MB,
    SELF_DEADLINE_S,
    command_user,
    hand_back,
    hand_to_command,
    stop_tails,
    tails,
    write_setup,
)

MANAGED_LABEL = "hangar.managed"
OWNER_LABEL = "hangar.owner"
# On an image that carries hangar's runtime (deploy/docker/Dockerfile): its sys.prefix.
RUNTIME_LABEL = "hangar.runtime"
BASE_IMAGE = "hangar-base:bookworm"  # environment/image.py makes it
# What the wrapper needs to switch user and clean up; it drops them all before exec.
_WRAPPER_CAPS = ["SETUID", "SETGID", "SETPCAP", "CHOWN", "KILL"]
_PIDS_LIMIT = 1024
__all__ = ["CONTROL", "DEFAULT_UID"]  # where they live now (_container); kept importable here


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


# Docker binds /etc/hostname (and resolv.conf, hosts) from the container's own directory on
# the engine's host: the one place a process sees its container's full id, cgroup v1 or v2.
_OWN_CONTAINER = re.compile(r"/containers/([0-9a-f]{64})/(?:hostname|hosts|resolv\.conf) ")


@functools.cache
def own_container() -> str | None:
    """The id of the container this process runs in, if it is one of our engine's, else None."""
    import docker.errors

    try:
        found = _OWN_CONTAINER.search(Path("/proc/self/mountinfo").read_text())
    except OSError:
        return None
    if found is None:
        return None
    try:
        client().api.inspect_container(found.group(1))
    except docker.errors.NotFound:  # a container of another engine (or none we can see)
        return None
    return found.group(1)


@functools.cache
def _owner() -> str:
    """Who a sandbox belongs to: this process, named so that another process can tell it gone.

    On the engine's host: ``host:pid:start``. Inside a container of the same engine (a run
    worker of the Docker deployment): ``container:<id>:pid:start``, since the pid and the
    hostname mean nothing outside it; the next run worker, another container, checks that
    container through the engine instead (docs/operations.md, "Beyond one machine: Docker").
    """
    me = f"{os.getpid()}:{_process_start(os.getpid())}"
    container = own_container()
    return f"container:{container}:{me}" if container else f"{socket.gethostname()}:{me}"


def _owner_gone(owner: str) -> bool:
    """Whether the process of an ``OWNER_LABEL`` value is known to be gone (else: alive or
    unknown, e.g. a process on another host: its containers are left alone)."""
    import docker.errors

    parts = owner.split(":")
    if len(parts) == 4 and parts[0] == "container":
        _, container, pid, start = parts
        if container == own_container():  # our own container: its pids are ours to check
            return pid.isdigit() and _process_start(int(pid)) != start
        try:
            state = client().api.inspect_container(container)["State"]
        except docker.errors.NotFound:
            return True  # removed: its run worker is gone
        return not state.get("Running", False)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    if own_container() is not None:
        return False  # a host process's, seen from a container: its pids are not ours
    return _process_start(int(parts[1])) != parts[2]


def cleanup_leftovers() -> int:
    """Remove hangar's containers whose owner process (or owner container) is gone; how many."""
    import docker.errors

    removed = 0
    for c in client().api.containers(all=True, filters={"label": f"{MANAGED_LABEL}=1"}):
        if not _owner_gone((c.get("Labels") or {}).get(OWNER_LABEL, "")):
            continue  # a live run's container, or one we cannot judge
        try:
            client().api.remove_container(c["Id"], force=True, v=True)
            removed += 1
        except docker.errors.NotFound:
            pass
    return removed


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
        uid, gid = command_user(request)
        owners = hand_to_command(request, uid)
        # Under TMPDIR: with the runtime in the image, TMPDIR is on the shared mount.
        control = Path(tempfile.mkdtemp(prefix="hangar-docker-"))
        try:
            check_shared([control], self.runtime)
            return self._run(api, image_id, request, uid, gid, control)
        finally:
            hand_back(owners, uid)
            shutil.rmtree(control, ignore_errors=True)

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
        memory = (request.memory_mb + MEMORY_HEADROOM_MB) * 1024 * 1024
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
            command=[sys.executable, "-I", "-S", "-c", INIT_SOURCE, f"{CONTROL}/setup.json"],
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
        write_setup(request, uid, gid, control)
        out, err, followers = tails(control, request)
        cid: str | None = None
        waited: dict[str, Any] = {}
        done = threading.Event()

        def wait() -> None:
            try:
                waited.update(api.wait(cid, timeout=request.timeout_s + 2 * SELF_DEADLINE_S))
            except Exception as exc:  # noqa: BLE001  any failure ends the wait; reported below
                waited["error"] = exc
            done.set()

        try:
            try:
                cid = self._create(api, image_id, request, control)
                api.start(cid)
            except docker.errors.APIError as exc:
                raise SandboxUnavailable(f"Docker could not start the container: {exc}") from None
            for t in followers:
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
            stop_tails(followers)
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
