"""The bubblewrap backend: the default local sandbox.

``bwrap`` builds a fresh root (a tmpfs) holding only the system directories,
the Python runtime and hangar's package (read-only), the request's mounts,
the workdir (read-write, at its host path), a private ``/tmp``, ``/proc`` and
a minimal ``/dev``. It runs the command in new pid, network (unless
``network=True``), ipc and uts namespaces, in a new session, with every
capability dropped (so a root command cannot remount the read-only binds),
and dies with its parent. Limits are enforced by ``_common.run_launcher``.

With ``run_as`` (the uid split) bwrap keeps only CAP_SETUID, CAP_SETGID,
CAP_SETPCAP and CAP_DAC_READ_SEARCH (to enter the workdir), and the command is started through util-linux ``setpriv``, which
switches to the unprivileged uid/gid, clears the groups, the inheritable and
bounding sets and sets no_new_privs; the uid change itself empties the
permitted and effective sets. ``/tmp`` is world-writable (sticky) so the
unprivileged command has a scratch directory.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import PurePosixPath

from hangar_dagster.trials.sandbox import (
    RunAs,
    Sandbox,
    SandboxRequest,
    SandboxResult,
    SandboxUnavailable,
)
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

# What the uid switch needs (and DAC_READ_SEARCH: bwrap's chdir into a workdir the command's
# uid owns); setpriv drops them all, bounding set included, before the command runs.
_SWITCH_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_DAC_READ_SEARCH")


def _namespace_args(network: bool, run_as: RunAs | None = None) -> list[str]:
    args = [
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
    ]
    if run_as is not None:
        for cap in _SWITCH_CAPS:
            args += ["--cap-add", cap]
    if not network:
        args.append("--unshare-net")
    return args


def _switch_user(run_as: RunAs | None) -> list[str]:
    if run_as is None:
        return []
    return [
        require_binary("setpriv", "util-linux"),
        f"--reuid={run_as.uid}",
        f"--regid={run_as.gid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


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
    args = [*_system_args(), "--perms", "01777", "--tmpfs", "/tmp"]
    system = [PurePosixPath(path) for path, _ in system_entries()]
    made = {PurePosixPath("/"), PurePosixPath("/tmp")}

    def bind(flag: str, source: str, target: str) -> None:
        # bwrap makes missing parents 0700, which an unprivileged command cannot cross:
        # make them 0755 (they are empty directories on the sandbox's own root).
        for parent in reversed(PurePosixPath(target).parents):
            if parent not in made and not any(parent.is_relative_to(d) for d in system):
                args.extend(["--perms", "0755", "--dir", str(parent)])
                made.add(parent)
        args.extend([flag, source, target])

    for d in runtime_dirs():
        bind("--ro-bind", d, d)
    # The workdir before the mounts, so a mount may sit inside it.
    wd = str(request.workdir)
    bind("--bind", wd, wd)
    for m in sandbox_mounts(request):
        bind("--bind" if m.writable else "--ro-bind", str(m.source), m.target)
    return [*args, "--chdir", wd]


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
            *limits_prefix(request),
            bwrap,
            *_namespace_args(request.network, request.run_as),
            *_mount_args(request),
            "--",
            *_switch_user(request.run_as),
            *request.argv,
        ]
        return run_launcher(argv, request)

    def describe(self) -> dict[str, str]:
        return {
            "backend": self.name,
            "version": tool_version([self._binary(), "--version"]),
            "isolation": "namespaces",
        }
