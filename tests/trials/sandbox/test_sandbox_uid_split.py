"""The uid split and inherited pipes, on every backend, with real namespaces and containers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hangar_dagster.trials.sandbox import RunAs, Sandbox, SandboxRequest, get_sandbox
from hangar_dagster.trials.sandbox.docker import DEFAULT_UID

pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("root")]

ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
UID = 2_000_000_123
STATUS = (
    "grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status"
)


@pytest.fixture
def wd(tmp_path: Path) -> Path:
    d = tmp_path / "wd"
    d.mkdir()
    os.chown(d, UID, UID)
    return d


def status(sandbox: Sandbox, wd: Path, run_as: RunAs | None) -> dict[str, str]:
    res = sandbox.run(
        SandboxRequest(argv=["/bin/sh", "-c", STATUS], workdir=wd, env=ENV, timeout_s=20,
                       run_as=run_as)
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr
    return {
        k: " ".join(v.split()) for k, v in (line.split(":", 1) for line in res.stdout.splitlines())
    }


def test_command_runs_unprivileged_without_capabilities(sandbox: Sandbox, wd: Path) -> None:
    st = status(sandbox, wd, RunAs(UID, UID))
    assert st["Uid"] == f"{UID} {UID} {UID} {UID}" and st["Gid"] == f"{UID} {UID} {UID} {UID}"
    assert st["Groups"] == ""
    for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(st[caps], 16) == 0, caps
    assert st["NoNewPrivs"] == "1"


def test_control_without_run_as_the_command_is_not_the_run_as_user(
    sandbox: Sandbox, wd: Path
) -> None:
    """The namespace backends run it as root (capabilities dropped); Docker never as root, but
    as its own unprivileged uid (DEFAULT_UID)."""
    st = status(sandbox, wd, None)
    assert st["Uid"].split()[0] == ("0" if sandbox.name != "docker" else str(DEFAULT_UID))


def test_unprivileged_command_can_write_only_what_it_owns(
    sandbox: Sandbox, wd: Path, tmp_path: Path
) -> None:
    (wd / "root-owned.txt").write_text("root")
    script = (
        "echo mine > mine.txt && echo wrote-mine; echo x > /tmp/t && echo wrote-tmp; "
        "echo evil > root-owned.txt 2>/dev/null && echo wrote-root; "
        "chmod 666 root-owned.txt 2>/dev/null && echo chmod-root; "
        f"{sys.executable} -c 'import hangar_dagster; print(\"python-ok\")'"
    )
    res = sandbox.run(
        SandboxRequest(argv=["/bin/sh", "-c", script], workdir=wd, env=ENV, timeout_s=30,
                       run_as=RunAs(UID, UID))
    )  # fmt: skip
    assert res.stdout.split() == ["wrote-mine", "wrote-tmp", "python-ok"], res.stderr
    assert (wd / "root-owned.txt").read_text() == "root"
    assert (wd / "mine.txt").stat().st_uid == UID


def test_pipe_write_end_reaches_the_unprivileged_command(sandbox: Sandbox, wd: Path) -> None:
    read_end, write_end = os.pipe()
    os.fchown(write_end, UID, UID)
    try:
        res = sandbox.run(
            SandboxRequest(
                argv=["/bin/sh", "-c", f"echo through-the-pipe > /proc/self/fd/{write_end}"],
                workdir=wd, env=ENV, timeout_s=20, run_as=RunAs(UID, UID), pass_fds=(write_end,),
            )
        )  # fmt: skip
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        assert f.read() == b"through-the-pipe\n"
    assert res.exit_code == 0


def test_control_a_descriptor_not_passed_is_not_there(sandbox: Sandbox, wd: Path) -> None:
    read_end, write_end = os.pipe()
    try:
        res = sandbox.run(
            SandboxRequest(
                argv=["/bin/sh", "-c", f"echo leak > /proc/self/fd/{write_end}"],
                workdir=wd, env=ENV, timeout_s=20, run_as=RunAs(UID, UID),
            )
        )  # fmt: skip
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        assert f.read() == b""
    assert res.exit_code != 0


# Starts up to 60 sleepers and reports how many it could start.
SPAWN = (
    "import os, time\n"
    "n = 0\n"
    "for _ in range(60):\n"
    "    try:\n"
    "        pid = os.fork()\n"
    "    except OSError:\n"
    "        break\n"
    "    if pid == 0:\n"
    "        time.sleep(30)\n"
    "        os._exit(0)\n"
    "    n += 1\n"
    "print('started', n)\n"
)


def test_process_limit_bounds_a_fork_loop(sandbox: Sandbox, wd: Path) -> None:
    res = sandbox.run(
        SandboxRequest(
            argv=[sys.executable, "-c", SPAWN], workdir=wd, env=ENV, timeout_s=30,
            run_as=RunAs(UID, UID, max_processes=10),
        )
    )  # fmt: skip
    started = int(res.stdout.split()[-1])
    assert 0 < started < 10, res.stdout + res.stderr


def test_run_as_root_is_refused(wd: Path) -> None:
    with pytest.raises(ValueError, match="run_as"):
        get_sandbox("bwrap").run(
            SandboxRequest(argv=["/bin/true"], workdir=wd, env=ENV, timeout_s=5,
                           run_as=RunAs(0, 0))
        )  # fmt: skip
