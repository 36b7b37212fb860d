"""`hangar ui` owns its processes: stopping it (SIGINT to it, SIGTERM or SIGKILL to its process
group) leaves none of the webserver, daemon, code servers, run workers and trial sandboxes
alive (checked in /proc), and a second `hangar ui` on the same HANGAR_HOME refuses with the pid
of the first."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hangar_dagster.cli.ui import webserver_url
from hangar_dagster.settings import Settings
from hangar_dagster.util.procs import PidLock, Proc, alive, all_procs, cmdline, descendants
from tests.conftest import (
    command_agent_spec,
    crashed_docker_run,
    free_port,
    hangar,
    start_ui,
    write_spec,
)

pytestmark = pytest.mark.slow


def mentions(home: Path) -> list[Proc]:
    """Live processes whose command line names the home (dagster dev's workspace, the code
    server, run workers)."""
    return [p for p in all_procs() if alive(p) and any(str(home) in a for a in cmdline(p.pid))]


def wait_until_gone(procs: list[Proc], seconds: float) -> list[Proc]:
    deadline = time.monotonic() + seconds
    while (left := [p for p in procs if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def kill_leftovers(ui: subprocess.Popen[bytes], procs: list[Proc]) -> None:
    for p in procs:
        if alive(p):
            os.kill(p.pid, signal.SIGKILL)
    try:
        os.killpg(ui.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    ui.wait()


def stop(ui: subprocess.Popen[bytes], how: str) -> None:
    if how == "SIGINT to hangar":
        ui.send_signal(signal.SIGINT)
    elif how == "SIGTERM to its group":
        os.killpg(ui.pid, signal.SIGTERM)
    else:
        assert how == "SIGKILL to its group"
        os.killpg(ui.pid, signal.SIGKILL)
    ui.wait(timeout=120)


@pytest.mark.parametrize(
    "how", ["SIGINT to hangar", "SIGTERM to its group", "SIGKILL to its group"]
)
def test_stopping_the_ui_stops_its_run_workers_and_sandboxes(
    how: str, example_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "owned-" + how.split()[0].lower()
    spec = command_agent_spec(
        example_dir, tmp_path, name, "sh $HANGAR_HARNESS_DIR/agent.sh", {"agent.sh": "sleep 600\n"}
    )
    spec["environment"]["resources"]["timeout_s"] = 900
    home, log = tmp_path / "home", tmp_path / "ui.log"
    submitted = hangar("experiment", "run", str(write_spec(example_dir, spec)), home=home)
    assert submitted.returncode == 0, submitted.stderr
    ui = start_ui(home, log)
    tree: list[Proc] = []
    try:
        # The daemon runs the setup stages, then the trial, whose sandbox runs `sleep 600`.
        deadline = time.monotonic() + 600
        while not any(cmdline(p.pid)[:2] == ["sleep", "600"] for p in descendants(ui.pid)):
            assert ui.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(2)
        tree = descendants(ui.pid)
        names = [" ".join(cmdline(p.pid))[:120] for p in tree]
        assert any("bwrap" in n for n in names), names  # the trial's sandbox
        assert any("dagster" in n and "api" in n for n in names), names  # its run worker
        assert any("dagster._daemon" in n for n in names), names

        second = hangar("ui", "--port", str(free_port()), home=home, timeout=60)
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"`hangar ui` (pid {ui.pid}) already runs" in " ".join(second.stderr.split())

        stop(ui, how)
        left = wait_until_gone(tree, 60)
        assert left == [], [(p.pid, cmdline(p.pid)) for p in left]
        assert mentions(home) == []
        monkeypatch.setenv("HANGAR_HOME", str(home))
        if how == "SIGKILL to its group":
            # Nobody could remove it; no `hangar ui` holds the lock, so the CLI ignores it.
            assert (home / "webserver.url").exists()
            assert PidLock(home / "ui.lock").holder() is None
            assert webserver_url(Settings.from_env()) is None
        else:
            assert ui.returncode == (130 if how == "SIGINT to hangar" else 143)
            assert not (home / "webserver.url").exists()
    finally:
        kill_leftovers(ui, tree)


def test_sigterm_to_the_ui_group_stops_the_webserver_daemon_and_code_server(
    tmp_path: Path,
) -> None:
    home, log = tmp_path / "home", tmp_path / "ui.log"
    ui = start_ui(home, log)
    tree: list[Proc] = []
    try:
        tree = descendants(ui.pid)
        assert len(tree) >= 3, tree  # dagster dev, its webserver and daemon (and code server)
        stop(ui, "SIGTERM to its group")
        assert wait_until_gone(tree, 60) == []
        assert mentions(home) == []
        assert not (home / "webserver.url").exists()
        assert not (home / "ui.lock").exists()
    finally:
        kill_leftovers(ui, tree)


@pytest.mark.needs_sandbox("docker")
def test_stopping_the_ui_removes_the_docker_sandboxes_of_its_killed_run_workers(
    tmp_path: Path,
) -> None:
    """A Docker sandbox is dockerd's child, not the UI's: the process sweep cannot reach it,
    and before this it ran on (here `sleep 120`) until the next trials run's cleanup."""
    from hangar_dagster.cli.ui import remove_orphan_containers
    from hangar_dagster.trials.sandbox.docker import client

    wd = tmp_path / "wd"
    wd.mkdir()
    left = crashed_docker_run(wd)  # its run worker was killed mid-command
    assert left in [c["Id"] for c in client().api.containers(all=True)]
    assert remove_orphan_containers() >= 1
    assert left not in [c["Id"] for c in client().api.containers(all=True)]
