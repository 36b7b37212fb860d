"""The bubblewrap backend: the default local sandbox.

``bwrap`` builds a fresh root (a tmpfs) holding only the system directories,
the Python runtime and hangar's package (read-only), the request's mounts,
the workdir (read-write, at its host path), a private ``/tmp``, ``/proc`` and
a minimal ``/dev``. It runs the command in new pid, network (unless
``network=True``), ipc and uts namespaces, in a new session, with every
capability dropped (so a root command cannot remount the read-only binds),
and dies with its parent. Limits are enforced by ``_common.run_launcher``.
"""

from __future__ import annotations

import functools
import subprocess

from hangar_dagster.sandbox import Sandbox, SandboxRequest, SandboxResult, SandboxUnavailable
from hangar_dagster.sandbox._common import (
    PROC_READ_ONLY,
    check_request,
    memory_prefix,
    require_binary,
    run_launcher,
    runtime_dirs,
    system_entries,
    tool_version,
)


def _namespace_args(network: bool) -> list[str]:
    args = [
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
    ]
    if not network:
        args.append("--unshare-net")
    return args


def _system_args() -> list[str]:
    args: list[str] = []
    for path, link in system_entries():
        args += ["--symlink", link, path] if link is not None else ["--ro-bind", path, path]
    args += ["--proc", "/proc"]
    for p in PROC_READ_ONLY:
        args += ["--ro-bind", p, p]
    return args + ["--dev", "/dev"]


def _mount_args(request: SandboxRequest) -> list[str]:
    # The private /tmp first: the runtime may live under /tmp (a checkout there) and must show.
    args = [*_system_args(), "--tmpfs", "/tmp"]
    for d in runtime_dirs():
        args += ["--ro-bind", d, d]
    # The workdir before the mounts, so a mount may sit inside it.
    wd = str(request.workdir)
    args += ["--bind", wd, wd]
    for m in request.mounts:
        args += ["--bind" if m.writable else "--ro-bind", str(m.source), m.target]
    args += ["--chdir", wd]
    return args


@functools.cache
def _probe(bwrap: str) -> None:
    """Create the namespaces once per process, so a host that can't fails as SandboxUnavailable."""
    argv = [bwrap, *_namespace_args(network=False), *_system_args(), "--", "/bin/true"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={})
    if proc.returncode != 0:
        why = proc.stderr.strip() or f"exit {proc.returncode}"
        raise SandboxUnavailable(
            f"bubblewrap cannot create namespaces here ({why}); run as root or enable "
            "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1)"
        )


class BwrapSandbox(Sandbox):
    name = "bwrap"

    def _binary(self) -> str:
        bwrap = require_binary("bwrap", "bubblewrap")
        _probe(bwrap)
        return bwrap

    def run(self, request: SandboxRequest) -> SandboxResult:
        check_request(request)
        bwrap = self._binary()
        argv = [
            *memory_prefix(request.memory_mb),
            bwrap,
            *_namespace_args(request.network),
            *_mount_args(request),
            "--",
            *request.argv,
        ]
        return run_launcher(argv, request)

    def describe(self) -> dict[str, str]:
        return {"backend": self.name, "version": tool_version([self._binary(), "--version"])}
