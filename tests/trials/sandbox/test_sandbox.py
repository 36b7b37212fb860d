"""Both local sandbox backends, with real namespaces and real processes."""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from hangar_dagster.trials.sandbox import (
    Mount,
    Sandbox,
    SandboxRequest,
    SandboxUnavailable,
    get_sandbox,
)
from hangar_dagster.trials.sandbox._common import PACKAGE_DIR, runtime_dirs

pytestmark = pytest.mark.integration

ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


@pytest.fixture
def wd(tmp_path: Path) -> Path:
    d = tmp_path / "wd"
    d.mkdir()
    return d


def tmp_tops(paths: list[Path]) -> set[str]:
    """The first component under /tmp of each path that lies there."""
    return {p.relative_to("/tmp").parts[0] for p in paths if p.is_relative_to("/tmp")}


def sh(
    sandbox: Sandbox, wd: Path, script: str, mounts: list[Mount] | None = None
) -> tuple[int | None, str, str]:
    req = SandboxRequest(
        argv=["/bin/sh", "-c", script], workdir=wd, env=ENV, timeout_s=20, mounts=mounts or []
    )
    res = sandbox.run(req)
    return res.exit_code, res.stdout, res.stderr


def test_only_allowed_paths_are_visible(
    sandbox: Sandbox, wd: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()
    (secret_dir / "key.txt").write_text("TOPSECRET")
    home = tmp_path / "hangar-home"
    (home / "artifacts").mkdir(parents=True)
    (home / "artifacts" / "other.json").write_text("{}")
    monkeypatch.setenv("HANGAR_HOME", str(home))
    (wd / "mine.txt").write_text("visible")
    code, out, _ = sh(
        sandbox,
        wd,
        f"cat {secret_dir}/key.txt; ls {home}; ls {PACKAGE_DIR.parent / 'pyproject.toml'}; "
        f"ls {PACKAGE_DIR.parent / 'tests'}; ls /root; cat mine.txt",
    )
    assert "TOPSECRET" not in out
    assert "other.json" not in out
    assert "pyproject.toml" not in out
    assert out.strip() == "visible"  # the workdir is visible, and nothing else printed
    assert code == 0


def test_system_dirs_and_runtime_are_read_only(sandbox: Sandbox, wd: Path) -> None:
    code, out, _ = sh(
        sandbox,
        wd,
        f"for d in /usr /etc {PACKAGE_DIR} {sys.prefix} {sys.base_prefix}; do "
        "touch $d/x 2>/dev/null && echo $d-writable; done; "
        "( : >> /proc/sys/kernel/core_pattern ) 2>/dev/null && echo core_pattern-writable; "
        "test -L /bin && echo bin-link; test -d /bin/ && echo bin-dir; echo done",
    )
    assert "writable" not in out
    assert ("bin-link" in out) == Path("/bin").is_symlink()
    assert "bin-dir" in out and code == 0


def test_workdir_is_writable_and_cwd(sandbox: Sandbox, wd: Path) -> None:
    code, out, _ = sh(sandbox, wd, "pwd; echo hello > made.txt")
    assert code == 0
    assert out.strip() == str(wd)
    assert (wd / "made.txt").read_text() == "hello\n"


def test_tmp_is_private_and_writable(sandbox: Sandbox, wd: Path) -> None:
    code, out, _ = sh(sandbox, wd, "echo x > /tmp/scratch && ls -A /tmp")
    assert code == 0
    # Only the scratch file and the paths down to the workdir and the runtime (either may be
    # under /tmp: pytest's tmp_path is, and so is a checkout cloned there).
    listing = set(out.split())
    assert "scratch" in listing
    assert listing <= {"scratch", *tmp_tops([wd, *map(Path, runtime_dirs())])}
    assert not Path("/tmp/scratch").exists() or Path("/tmp/scratch").read_text() != "x\n"


def test_read_only_and_writable_mounts(sandbox: Sandbox, wd: Path, tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "data.txt").write_text("ro-data")
    rw = tmp_path / "rw"
    rw.mkdir()
    code, out, _ = sh(
        sandbox,
        wd,
        "cat /mnt-ro/data.txt; echo; "
        "echo changed > /mnt-ro/data.txt 2>/dev/null && echo ro-writable; "
        "echo out > /mnt-rw/result.txt && echo rw-ok",
        mounts=[Mount(ro, "/mnt-ro"), Mount(rw, "/mnt-rw", writable=True)],
    )
    assert "ro-data" in out and "rw-ok" in out
    assert "ro-writable" not in out
    assert (ro / "data.txt").read_text() == "ro-data"
    assert (rw / "result.txt").read_text() == "out\n"
    assert code == 0


def test_environment_is_exactly_the_request(
    sandbox: Sandbox, wd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HANGAR_TEST_LEAK", "leaked")
    env = {"PATH": "/usr/bin:/bin", "ONLY_THIS": "yes"}
    res = sandbox.run(SandboxRequest(argv=["/usr/bin/env"], workdir=wd, env=env, timeout_s=20))
    assert res.exit_code == 0
    # Both backends set PWD to the workdir (bwrap always does; the other follows for parity).
    assert dict(line.split("=", 1) for line in res.stdout.splitlines()) == {**env, "PWD": str(wd)}


@pytest.mark.parametrize("shell", ["bash -lc", "sh -lc", "bash -c"])
def test_a_login_shell_keeps_the_venv_on_path_codex_lost(
    sandbox: Sandbox, wd: Path, shell: str
) -> None:
    # Codex runs every command as `bash -lc`: the system's /etc/profile reset PATH, dropping
    # the venv hangar put first, and `python` was "command not found" (exit 127).
    venv_bin = str(Path(sys.prefix) / "bin")
    env = {"PATH": f"{venv_bin}:/usr/bin:/bin", "HOME": "/tmp", "KEEP_ME": "yes"}
    script = 'echo "$PATH"; echo "$KEEP_ME"; command -v python'
    res = sandbox.run(
        SandboxRequest(argv=[*shell.split(), script], workdir=wd, env=env, timeout_s=20)
    )
    assert res.exit_code == 0, res.stderr
    assert res.stdout.splitlines() == [env["PATH"], "yes", f"{venv_bin}/python"]


def _listener() -> socket.socket:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    return srv


CONNECT = (
    "import socket, sys\n"
    "socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3)\n"
    "print('connected')"
)


@pytest.mark.parametrize("network", [False, True])
def test_network_namespace(sandbox: Sandbox, wd: Path, network: bool) -> None:
    srv = _listener()
    try:
        port = srv.getsockname()[1]
        res = sandbox.run(
            SandboxRequest(
                argv=[sys.executable, "-c", CONNECT, str(port)],
                workdir=wd,
                env=ENV,
                timeout_s=20,
                network=network,
            )
        )
    finally:
        srv.close()
    # Without network the host's loopback listener is unreachable; with it, reachable.
    assert ("connected" in res.stdout) is network, res.stderr


def test_timeout_kills_the_sandbox(sandbox: Sandbox, wd: Path) -> None:
    start = time.monotonic()
    res = sandbox.run(SandboxRequest(argv=["/bin/sleep", "60"], workdir=wd, env=ENV, timeout_s=1))
    assert res.timed_out and res.exit_code is None
    assert time.monotonic() - start < 10


# A grandchild in its own session that outlives its parent and would write a marker later.
DAEMON = "(setsid /bin/sh -c 'sleep 1; echo alive > {marker}' </dev/null >/dev/null 2>&1 &)"


@pytest.mark.parametrize("how", ["exit", "timeout"])
def test_no_process_outlives_run(sandbox: Sandbox, wd: Path, how: str) -> None:
    marker = wd / "marker"
    script = DAEMON.format(marker=marker) + ("; exit 0" if how == "exit" else "; sleep 60")
    res = sandbox.run(
        SandboxRequest(
            argv=["/bin/sh", "-c", script],
            workdir=wd,
            env=ENV,
            timeout_s=0.5 if how == "timeout" else 20,
        )
    )
    assert res.timed_out is (how == "timeout")
    time.sleep(1.8)
    assert not marker.exists()


def test_daemon_marker_would_appear_if_it_survived(sandbox: Sandbox, wd: Path) -> None:
    """The control for the test above: the same daemon, waited for, does write its marker."""
    marker = wd / "marker"
    res = sandbox.run(
        SandboxRequest(
            argv=["/bin/sh", "-c", DAEMON.format(marker=marker) + "; sleep 1.5"],
            workdir=wd,
            env=ENV,
            timeout_s=20,
        )
    )
    assert res.exit_code == 0
    assert marker.read_text() == "alive\n"


def test_output_is_bounded_and_never_blocks(sandbox: Sandbox, wd: Path) -> None:
    res = sandbox.run(
        SandboxRequest(
            argv=[
                "/bin/sh",
                "-c",
                "head -c 3000000 /dev/zero | tr '\\0' a; "
                "head -c 3000000 /dev/zero | tr '\\0' b >&2; echo end",
            ],
            workdir=wd,
            env=ENV,
            timeout_s=20,
            output_limit=1000,
        )
    )
    assert res.exit_code == 0 and not res.timed_out
    assert res.stdout == "a" * 1000
    assert res.stderr == "b" * 1000


def test_stdin_is_passed(sandbox: Sandbox, wd: Path) -> None:
    res = sandbox.run(
        SandboxRequest(argv=["/bin/cat"], workdir=wd, env=ENV, timeout_s=20, stdin=b"from stdin")
    )
    assert res.stdout == "from stdin"


def test_memory_limit(sandbox: Sandbox, wd: Path) -> None:
    grab = "b = bytearray(400 * 1024 * 1024); print('allocated')"
    small = sandbox.run(
        SandboxRequest(
            argv=[sys.executable, "-c", grab], workdir=wd, env=ENV, timeout_s=20, memory_mb=200
        )
    )
    large = sandbox.run(
        SandboxRequest(
            argv=[sys.executable, "-c", grab], workdir=wd, env=ENV, timeout_s=20, memory_mb=2048
        )
    )
    assert small.exit_code != 0 and "MemoryError" in small.stderr
    assert large.exit_code == 0 and "allocated" in large.stdout


def test_python_and_hangar_import_inside(sandbox: Sandbox, wd: Path) -> None:
    res = sandbox.run(
        SandboxRequest(
            argv=[
                sys.executable,
                "-c",
                "import hangar_dagster.trials.sandbox, sys; print(sys.prefix)",
            ],
            workdir=wd,
            env=ENV,
            timeout_s=30,
        )
    )
    assert res.exit_code == 0, res.stderr
    assert res.stdout.strip() == sys.prefix


def test_exit_code_is_passed_through(sandbox: Sandbox, wd: Path) -> None:
    assert sh(sandbox, wd, "exit 7")[0] == 7


def test_describe_names_backend_and_version(sandbox: Sandbox) -> None:
    d = sandbox.describe()
    assert d["backend"] == sandbox.name
    assert d["version"] not in ("", "unknown")


@pytest.mark.parametrize(
    ("backend", "package"), [("bwrap", "bubblewrap"), ("unshare", "util-linux")]
)
def test_missing_binary_is_sandbox_unavailable(
    backend: str, package: str, wd: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(SandboxUnavailable, match=package):
        get_sandbox(backend).run(
            SandboxRequest(argv=["/bin/true"], workdir=wd, env=ENV, timeout_s=5)
        )


def test_bad_mount_names_the_field(wd: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mount source"):
        get_sandbox("bwrap").run(
            SandboxRequest(
                argv=["/bin/true"],
                workdir=wd,
                env=ENV,
                timeout_s=5,
                mounts=[Mount(tmp_path / "nope", "/x")],
            )
        )


def test_runtime_under_tmp_stays_visible_when_tmp_is_private(
    sandbox: Sandbox, wd: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a checkout (and so its .venv and package) under /tmp was hidden by the
    sandbox's private /tmp, so nothing could run when CI cloned the project there."""
    package = tmp_path / "checkout" / "hangar_dagster"
    package.mkdir(parents=True)
    (package / "marker.txt").write_text("visible\n")
    monkeypatch.setattr("hangar_dagster.trials.sandbox._common.PACKAGE_DIR", package)
    code, out, err = sh(sandbox, wd, f"cat {package}/marker.txt && ls /tmp")
    assert code == 0, err
    assert out.split()[0] == "visible"
    assert set(out.split()[1:]) == tmp_tops([wd, *map(Path, runtime_dirs())])


def test_cancel_stops_the_command_and_everything_it_started(sandbox: Sandbox, wd: Path) -> None:
    cancel = threading.Event()
    seen = bytearray()

    def on_stdout(chunk: bytes) -> None:
        seen.extend(chunk)
        if b"ready" in seen:
            cancel.set()  # as a budget watcher would, on what the command streamed

    req = SandboxRequest(
        argv=["/bin/sh", "-c", "(setsid sleep 300 &) ; echo ready; sleep 300"],
        workdir=wd,
        env=ENV,
        timeout_s=60,
        cancel=cancel,
        on_stdout=on_stdout,
    )
    started = time.monotonic()
    res = sandbox.run(req)
    assert res.cancelled and not res.timed_out and res.exit_code is None
    assert time.monotonic() - started < 30
    assert res.stdout.strip() == "ready" and bytes(seen).strip() == b"ready"


def test_an_unset_cancel_changes_nothing(sandbox: Sandbox, wd: Path) -> None:
    req = SandboxRequest(
        argv=["/bin/sh", "-c", "echo done"],
        workdir=wd,
        env=ENV,
        timeout_s=20,
        cancel=threading.Event(),
    )
    res = sandbox.run(req)
    assert (res.exit_code, res.cancelled, res.timed_out) == (0, False, False)


def test_loopback_works_inside_the_sandboxs_own_network(sandbox: Sandbox, wd: Path) -> None:
    # The model API forwarder listens on 127.0.0.1 inside the sandbox: lo must be up there.
    script = (
        "import socket\n"
        "srv = socket.create_server(('127.0.0.1', 0))\n"
        "cli = socket.create_connection(srv.getsockname(), timeout=5)\n"
        "conn, _ = srv.accept(); cli.sendall(b'ping'); print(conn.recv(4).decode())\n"
    )
    req = SandboxRequest(
        argv=[sys.executable, "-I", "-c", script], workdir=wd, env=ENV, timeout_s=30
    )
    res = sandbox.run(req)
    assert (res.exit_code, res.stdout.strip()) == (0, "ping"), res.stderr
