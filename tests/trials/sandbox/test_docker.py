"""What only the Docker backend does: cgroup limits, the unprivileged default user, container
removal on every way out, leftovers of a crashed run, and pass_fds through the wrapper."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from hangar_dagster.settings import Settings
from hangar_dagster.trials.sandbox import Mount, RunAs, SandboxRequest, SandboxUnavailable
from hangar_dagster.trials.sandbox.docker import (
    DEFAULT_UID,
    MANAGED_LABEL,
    OWNER_LABEL,
    DockerSandbox,
    _owner,
    cleanup_leftovers,
    client,
)
from tests.conftest import crashed_docker_run

pytestmark = [pytest.mark.integration, pytest.mark.needs_sandbox("docker")]

ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


@pytest.fixture
def sandbox(docker_base_image: str) -> DockerSandbox:
    return DockerSandbox()


@pytest.fixture
def wd(tmp_path: Path) -> Path:
    d = tmp_path / "wd"
    d.mkdir()
    return d


def ours() -> list[str]:
    """Ids of every container (running or not) this test process owns."""
    found = client().api.containers(
        all=True, filters={"label": [f"{MANAGED_LABEL}=1", f"{OWNER_LABEL}={_owner()}"]}
    )
    return [c["Id"] for c in found]


def sh(sandbox: DockerSandbox, wd: Path, script: str, **kw: object) -> tuple[int | None, str]:
    res = sandbox.run(
        SandboxRequest(argv=["/bin/sh", "-c", script], workdir=wd, env=ENV, timeout_s=30, **kw)  # type: ignore[arg-type]
    )
    return res.exit_code, res.stdout + res.stderr


def test_cgroup_limits_follow_the_request(sandbox: DockerSandbox, wd: Path) -> None:
    code, out = sh(
        sandbox,
        wd,
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max "
        "/sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us",
        memory_mb=300,
        cpus=0.5,
    )
    assert code == 0, out
    memory, pids, quota, period = out.split()
    assert int(memory) == (300 + 128) * 1024 * 1024  # the command's limit and the headroom
    assert pids == "1024"
    assert int(quota) / int(period) == 0.5


def test_without_network_only_loopback_exists(sandbox: DockerSandbox, wd: Path) -> None:
    code, out = sh(sandbox, wd, "ls /sys/class/net")
    assert (code, out.split()) == (0, ["lo"])


def test_default_user_is_unprivileged_and_the_workdir_is_handed_back(
    sandbox: DockerSandbox, wd: Path
) -> None:
    (wd / "given.txt").write_text("x")
    code, out = sh(
        sandbox,
        wd,
        "id -u; grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status; "
        "echo more >> given.txt && mkdir made && echo y > made/new.txt && echo wrote",
    )
    assert code == 0, out
    lines = out.split("\n")
    assert lines[0] == str(DEFAULT_UID)
    assert "CapEff:\t0000000000000000" in out and "CapBnd:\t0000000000000000" in out
    assert "NoNewPrivs:\t1" in out and "wrote" in out
    # Everything the command made or changed is the workdir owner's again afterwards.
    for p in (wd, wd / "given.txt", wd / "made", wd / "made" / "new.txt"):
        assert p.stat().st_uid == os.geteuid(), p


def test_a_private_read_only_mount_is_readable_but_not_writable(
    sandbox: DockerSandbox, wd: Path, tmp_path: Path
) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "data.txt").write_text("secret-ok")
    (private / "data.txt").chmod(0o600)
    code, out = sh(
        sandbox,
        wd,
        "cat /mnt-p/data.txt; echo; echo x > /mnt-p/data.txt 2>/dev/null && echo writable",
        mounts=[Mount(private, "/mnt-p")],
    )
    assert out.split()[0] == "secret-ok" and "writable" not in out.split(), out
    assert (private / "data.txt").read_text() == "secret-ok"


def test_control_a_private_directory_not_mounted_stays_unreachable(
    sandbox: DockerSandbox, wd: Path
) -> None:
    """The wrapper's control directory is in the container, 0700 root: the command can't enter."""
    code, out = sh(sandbox, wd, "ls /run/hangar 2>&1; cat /run/hangar/setup.json 2>&1")
    assert "Permission denied" in out and '"argv"' not in out


@pytest.mark.parametrize("how", ["exit", "timeout", "cancel", "exception"])
def test_container_is_removed_however_the_run_ends(
    sandbox: DockerSandbox, wd: Path, how: str
) -> None:
    cancel = threading.Event()
    seen: list[bytes] = []

    class Exploding(threading.Event):
        def is_set(self) -> bool:
            if seen:
                raise RuntimeError("the caller's cancel check failed")
            return False

    def on_stdout(chunk: bytes) -> None:
        seen.append(chunk)
        if how == "cancel":
            cancel.set()

    script = "echo started; " + ("exit 3" if how == "exit" else "sleep 60")
    req = SandboxRequest(
        argv=["/bin/sh", "-c", script],
        workdir=wd,
        env=ENV,
        timeout_s=2 if how == "timeout" else 60,
        cancel=Exploding() if how == "exception" else cancel,
        on_stdout=on_stdout,
    )
    if how == "exception":
        with pytest.raises(RuntimeError, match="cancel check"):
            sandbox.run(req)
    else:
        res = sandbox.run(req)
        assert (res.exit_code, res.timed_out, res.cancelled) == {
            "exit": (3, False, False),
            "timeout": (None, True, False),
            "cancel": (None, False, True),
        }[how]
    assert ours() == []


def test_control_a_running_containers_is_listed(sandbox: DockerSandbox, wd: Path) -> None:
    """The control for the removal test: while a run is on, `ours()` does see its container;
    and cleanup_leftovers leaves a live run's container alone."""
    cancel = threading.Event()
    listed: list[list[str]] = []
    removed: list[int] = []

    def on_stdout(chunk: bytes) -> None:
        listed.append(ours())
        removed.append(cleanup_leftovers())
        listed.append(ours())
        cancel.set()

    sandbox.run(
        SandboxRequest(
            argv=["/bin/sh", "-c", "echo up; sleep 60"],
            workdir=wd,
            env=ENV,
            timeout_s=60,
            cancel=cancel,
            on_stdout=on_stdout,
        )
    )
    assert len(listed[0]) == 1 and listed[1] == listed[0]
    assert removed == [0]


def test_leftovers_of_a_crashed_run_are_removed(sandbox: DockerSandbox, wd: Path) -> None:
    left = crashed_docker_run(wd)  # the run crashed: nothing removed its container
    assert cleanup_leftovers() >= 1
    assert left not in [c["Id"] for c in client().api.containers(all=True)]


@pytest.mark.parametrize("backend", ["docker", "bwrap"])
def test_the_trials_stage_removes_leftovers_only_for_a_docker_experiment(
    sandbox: DockerSandbox, wd: Path, backend: str
) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "grading"))
    from grading_builders import experiment

    from hangar_dagster.trials.stage import _remove_leftover_containers

    left = crashed_docker_run(wd)
    task = {"repo": str(wd), "base_sha": "0" * 40, "hidden_files": {"t.py": ""}}
    exp = experiment({"t": task}, environment={"sandbox": backend})
    said: list[str] = []

    class Log:
        def info(self, msg: str) -> None:
            said.append(msg)

        def warning(self, msg: str) -> None:
            said.append(msg)

    try:
        _remove_leftover_containers(exp, Log(), Settings.from_env())  # type: ignore[arg-type]
        ids = [c["Id"] for c in client().api.containers(all=True)]
        # A bwrap experiment does not touch the engine; a docker one removes the leftover.
        assert (left in ids) is (backend == "bwrap"), said
    finally:
        cleanup_leftovers()


def test_passed_fd_carries_more_than_a_pipe_buffer_intact(sandbox: DockerSandbox, wd: Path) -> None:
    read_end, write_end = os.pipe()
    got = bytearray()
    reader = threading.Thread(
        target=lambda: got.extend(iter_read(read_end)),
        daemon=True,
    )
    reader.start()
    try:
        code, out = sh(
            sandbox,
            wd,
            f"head -c 1000000 /dev/urandom | od -An -tx1 | head -c 2000000 > /proc/self/fd/{write_end}; echo ok",
            pass_fds=(write_end,),
        )
    finally:
        os.close(write_end)
    reader.join(timeout=30)
    assert code == 0 and out.strip() == "ok", out
    assert len(got) == 2_000_000 and set(bytes(got)) <= set(b"0123456789abcdef \n")


def iter_read(fd: int) -> bytes:
    data = bytearray()
    while chunk := os.read(fd, 65536):
        data += chunk
    os.close(fd)
    return bytes(data)


def test_run_as_switches_to_that_uid_with_the_process_limit(
    sandbox: DockerSandbox, wd: Path
) -> None:
    uid = 2_000_000_321
    os.chown(wd, uid, uid)
    code, out = sh(
        sandbox,
        wd,
        "id -u; grep processes /proc/self/limits",
        run_as=RunAs(uid, uid, max_processes=77),
    )
    assert code == 0 and out.split()[:5] == [str(uid), "Max", "processes", "77", "77"], out


def test_an_image_not_on_the_engine_is_unavailable_naming_the_fix(wd: Path) -> None:
    missing = "sha256:" + "0" * 64
    with pytest.raises(SandboxUnavailable, match="docker pull"):
        DockerSandbox(image=missing).run(
            SandboxRequest(argv=["/bin/true"], workdir=wd, env=ENV, timeout_s=5)
        )


def test_describe_reports_the_engine_and_the_pinned_image(docker_base_image: str) -> None:
    d = DockerSandbox(image=docker_base_image).describe()
    assert d["backend"] == "docker" and d["version"].startswith("docker-engine ")
    assert d["image"] == docker_base_image


def test_the_same_run_twice_costs_well_under_a_second(sandbox: DockerSandbox, wd: Path) -> None:
    """Per-request overhead stays in the range benchmarks/sandbox_overhead.py measures."""
    sh(sandbox, wd, "true")
    started = time.monotonic()
    code, _ = sh(sandbox, wd, "true")
    assert code == 0 and time.monotonic() - started < 3


def test_drift_compares_the_image_the_containers_ran_with_the_pinned_one(
    docker_base_image: str, tmp_path: Path
) -> None:
    import io
    import tarfile

    from hangar_dagster.experiment.drift import check_drift, environment_observed, environment_pins
    from hangar_dagster.experiment.spec import Environment

    # A second, tiny image: what a trial would run if the image under the pin had changed.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("marker")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"other"))
    client().api.import_image_from_data(buf.getvalue(), repository="hangar-test-other", tag="x")
    other = str(client().images.get("hangar-test-other:x").id)
    try:
        pinned = environment_pins(Environment(sandbox="docker", image=docker_base_image))

        def observed(image: str) -> dict[str, object]:
            info = DockerSandbox(image=image).describe()
            return environment_observed(
                info, egress="allowlist", timeout_s=600, memory_mb=4096, build=[]
            )

        assert not check_drift({}, {}, pinned, observed(docker_base_image)).environment
        moved = check_drift({}, {}, pinned, observed(other)).environment
        assert moved == {"image": (docker_base_image, other)}
    finally:
        client().images.remove(other, force=True)


def test_an_unreachable_engine_is_unavailable_naming_the_fix(
    wd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{wd}/no-such-docker.sock")
    client.cache_clear()  # the engine is looked up once per process
    try:
        with pytest.raises(SandboxUnavailable, match="start dockerd"):
            DockerSandbox().run(
                SandboxRequest(argv=["/bin/true"], workdir=wd, env=ENV, timeout_s=5)
            )
    finally:
        monkeypatch.undo()
        client.cache_clear()
    assert client().ping()  # the control: the real engine answers again
