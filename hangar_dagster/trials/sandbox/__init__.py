"""Sandboxes: where agent, verify and grader commands run.

One small interface, ``Sandbox``, and a registry of named backends chosen by
``environment.sandbox`` in the spec. Heavy or optional backends import lazily.
A sandbox shows a command only what it is given: system directories, the
Python runtime and hangar's own package read-only, the mounts in the request,
and a writable workdir. Nothing of the host's environment variables leaks in:
``env`` is the whole environment.
"""

from __future__ import annotations

import importlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


class SandboxUnavailable(RuntimeError):
    """The backend cannot create a sandbox here (missing binary, no namespaces, ...).

    A trial that meets it ends as ``infra_error / sandbox_create``.
    """


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str  # absolute path inside the sandbox
    writable: bool = False


@dataclass(frozen=True)
class RunAs:
    """Run the command as this unprivileged user: the grader's uid split.

    The sandbox stays privileged only long enough to switch: the command runs
    with uid and gid ``uid``/``gid`` (no supplementary groups), no capabilities
    (effective, permitted, inheritable, ambient and bounding sets empty) and
    no_new_privs, under an RLIMIT_NPROC of ``max_processes`` (which the kernel
    enforces only for a non-root uid, so it bounds a fork bomb here: pick a
    uid nothing else runs as, since the count is per uid host-wide) and an
    RLIMIT_FSIZE of ``max_file_mb`` (no single file it writes grows past it).
    Needs the caller to be root.
    """

    uid: int
    gid: int
    max_processes: int = 256
    max_file_mb: int = 1024


@dataclass(frozen=True)
class SandboxRequest:
    argv: list[str]
    workdir: Path  # host directory, mounted read-write at the same path, and the cwd
    env: dict[str, str]  # the complete environment inside the sandbox
    timeout_s: float
    memory_mb: int = 4096
    mounts: list[Mount] = field(default_factory=list)
    network: bool = False  # False: own network namespace with only loopback
    stdin: bytes | None = None
    output_limit: int = 1_000_000  # bytes kept of stdout and of stderr each
    run_as: RunAs | None = None  # None: the command runs as the caller's uid, capabilities dropped
    # Host file descriptors the command inherits under the same numbers (e.g. pipe write ends).
    pass_fds: tuple[int, ...] = ()
    # Set from another thread to stop the command early (drain, trial budget): the sandbox
    # kills everything it started and returns with ``cancelled`` true.
    cancel: threading.Event | None = field(default=None, compare=False)
    # Called from a reader thread with each chunk of stdout as it arrives (live traces).
    on_stdout: Callable[[bytes], None] | None = field(default=None, compare=False)
    # Container backends: the image to run in (a digest: the pinned environment.image); None:
    # the backend's own (get_sandbox's image). The namespace backends ignore it.
    image: str | None = None
    # Container backends: labels on the container (experiment, trial); others ignore them.
    labels: dict[str, str] = field(default_factory=dict, compare=False)
    cpus: float | None = None  # CPU limit where the backend has one (Docker); None: none


@dataclass(frozen=True)
class K8sPlacement:
    """Where the Kubernetes backend puts its pods, and how they see hangar's files.

    ``shared_claim``: the ReadWriteMany PersistentVolumeClaim that holds ``HANGAR_HOME`` and
    ``TMPDIR``, mounted in hangar's own pod at ``shared_path``; every path a sandbox sees is a
    ``subPath`` of it. ``namespace``: the pods' (empty: the service account's namespace, else
    ``default``). ``pod_name``: hangar's own pod (empty: the hostname, which is the pod's name
    in Kubernetes), whose labels and IP the bridged sockets use (docs/operations.md).
    """

    namespace: str = ""
    shared_claim: str = ""
    shared_path: Path | None = None
    pod_name: str = ""


@dataclass(frozen=True)
class SandboxRuntime:
    """Where a container sandbox gets the Python runtime and hangar's package.

    ``in_image`` false (``HANGAR_SANDBOX_RUNTIME=host``, the default): bound from this process's
    own paths, which the engine must see as they are (hangar runs on the engine's host). True
    (``image``): hangar runs in a container of the project image and the sandbox image carries
    the same runtime at the same paths (the image's ``hangar.runtime`` label names the prefix),
    so nothing of it is bound; the engine resolves every bind source on its own host, so each
    must lie under one of ``shared`` (mounted at the same path in hangar's container and on the
    engine's host: ``HANGAR_HOME`` and ``TMPDIR``). ``image``: the sandbox image when neither
    the request nor the spec names one (``HANGAR_SANDBOX_IMAGE``).
    """

    in_image: bool = False
    image: str | None = None
    shared: tuple[Path, ...] = ()
    k8s: K8sPlacement = field(default_factory=K8sPlacement)


@dataclass(frozen=True)
class SandboxResult:
    exit_code: int | None  # None when killed for the time limit
    timed_out: bool
    stdout: str
    stderr: str
    duration_s: float
    cancelled: bool = False  # stopped through ``request.cancel`` (exit_code is then None)


class Sandbox(ABC):
    name: str

    def __init__(
        self,
        image: str | None = None,
        labels: dict[str, str] | None = None,
        runtime: SandboxRuntime | None = None,
    ) -> None:
        """``image``/``labels``/``runtime``: for container backends (the namespace ones ignore
        them; their runtime is always the host's)."""
        self.image = image
        self.labels = dict(labels or {})
        self.runtime = runtime or SandboxRuntime()

    @abstractmethod
    def run(self, request: SandboxRequest) -> SandboxResult:
        """Run ``request.argv``; every process it started is gone when this returns."""

    def describe(self) -> dict[str, str]:
        """What the environment digest covers of this backend (name, version)."""
        return {"backend": self.name}


_BACKENDS = {
    "bwrap": "hangar_dagster.trials.sandbox.bwrap:BwrapSandbox",
    "unshare": "hangar_dagster.trials.sandbox.unshare:UnshareSandbox",
    "docker": "hangar_dagster.trials.sandbox.docker:DockerSandbox",
    "k8s": "hangar_dagster.trials.sandbox.k8s:K8sSandbox",
}


def get_sandbox(
    name: str,
    image: str | None = None,
    labels: dict[str, str] | None = None,
    runtime: SandboxRuntime | None = None,
) -> Sandbox:
    """The backend ``name``; ``image``, ``labels`` and ``runtime`` (``Settings.sandbox_runtime``)
    reach container backends."""
    try:
        target = _BACKENDS[name]
    except KeyError:
        raise SandboxUnavailable(
            f"unknown sandbox backend {name!r}; known: {', '.join(sorted(_BACKENDS))}"
        ) from None
    module, cls = target.split(":")
    backend: type[Sandbox] = getattr(importlib.import_module(module), cls)
    return backend(image=image, labels=labels, runtime=runtime)
