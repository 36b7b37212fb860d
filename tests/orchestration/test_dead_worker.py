"""A real run worker SIGKILLed mid-trial: under a live UI the run is marked failed and the driver
sensor starts the stage again (the cut-off attempt closed as control_plane_restart, its retry
completes); with the whole UI killed, `hangar experiment resume` ends the run left STARTED and
completes the experiment without the UI."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import dagster as dg
import pytest

from hangar_dagster.orchestration.stages import TAG_EXPERIMENT, TAG_STAGE
from hangar_dagster.queue.liveness import read_run_process
from hangar_dagster.settings import HangarPaths
from hangar_dagster.util.procs import alive, descendants
from tests.conftest import (
    SLEEP_THEN_FIX,
    attempts,
    command_agent_spec,
    hangar,
    start_ui,
    stop_ui,
    write_spec,
)

pytestmark = pytest.mark.slow

SLOW_S = 900


def trials_runs(home: Path, experiment_id: str) -> list[dg.DagsterRun]:
    with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
        return list(
            instance.get_runs(
                dg.RunsFilter(tags={TAG_EXPERIMENT: experiment_id, TAG_STAGE: "trials"})
            )
        )


def sleeping_trial(ui: subprocess.Popen[bytes]) -> bool:
    for p in descendants(ui.pid):
        try:
            if Path(f"/proc/{p.pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", b"600"]:
                return True
        except OSError:
            continue
    return False


def submit_and_wait_for_the_sleeping_trial(
    example_dir: Path, tmp_path: Path, name: str
) -> tuple[Path, Path, str, subprocess.Popen[bytes], dg.DagsterRun]:
    spec = command_agent_spec(
        example_dir, tmp_path, name, "sh $HANGAR_HARNESS_DIR/agent.sh", {"agent.sh": SLEEP_THEN_FIX}
    )
    spec.update(parallel=1)
    spec["environment"]["resources"]["timeout_s"] = 900
    home, log = tmp_path / "home", tmp_path / "ui.log"
    submitted = hangar("experiment", "run", str(write_spec(example_dir, spec)), home=home)
    assert submitted.returncode == 0, submitted.stderr
    experiment_id = submitted.stdout.split("submitted ")[1].split()[0]
    ui = start_ui(home, log, seconds=SLOW_S)
    deadline = time.monotonic() + SLOW_S
    while not sleeping_trial(ui):
        assert ui.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
        time.sleep(2)
    [run] = trials_runs(home, experiment_id)
    return home, log, experiment_id, ui, run


def test_a_killed_run_worker_is_detected_and_its_stage_retried_by_the_sensor(
    example_dir: Path, tmp_path: Path
) -> None:
    home, log, experiment_id, ui, first = submit_and_wait_for_the_sleeping_trial(
        example_dir, tmp_path, "killed-worker"
    )
    try:
        worker = read_run_process(HangarPaths(home), first.run_id)
        assert worker is not None, "the trials run recorded no process"
        sandbox = [p for p in descendants(worker.pid)]
        assert sandbox, "the run worker has no sandbox below it"
        os.kill(worker.pid, signal.SIGKILL)
        deadline = time.monotonic() + SLOW_S
        while len(rows := attempts(home)) < 2 or rows[-1][1] != "completed":
            assert ui.poll() is None and time.monotonic() < deadline, (
                f"{attempts(home)}\n{log.read_text()[-4000:]}"
            )
            time.sleep(2)
        assert [p for p in sandbox if alive(p)] == [], "the sandbox outlived its worker"
        runs = {r.run_id: r for r in trials_runs(home, experiment_id)}
        assert runs[first.run_id].status == dg.DagsterRunStatus.FAILURE
        cut, retried = rows
        assert cut[:4] == (1, "infra_error", "control_plane_restart", first.run_id)
        assert retried[:3] == (2, "completed", None) and retried[4] == first.run_id
        assert runs[retried[3]].tags.get("dagster/sensor_name") == "experiment_driver"
    finally:
        stop_ui(ui)


def test_resume_after_the_whole_ui_was_killed_mid_trial_completes_without_the_ui(
    example_dir: Path, tmp_path: Path
) -> None:
    home, _log, experiment_id, ui, first = submit_and_wait_for_the_sleeping_trial(
        example_dir, tmp_path, "killed-ui"
    )
    os.killpg(ui.pid, signal.SIGKILL)  # webserver, daemon, code server and run worker at once
    ui.wait()
    [left] = trials_runs(home, experiment_id)
    assert left.status == dg.DagsterRunStatus.STARTED  # nobody was left to end it

    resumed = hangar("experiment", "resume", experiment_id, home=home, timeout=SLOW_S)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    said = " ".join(resumed.stderr.split())
    assert f"its trials run {first.run_id} was STARTED, but its process" in said
    cut, retried = attempts(home)
    assert cut[:4] == (1, "infra_error", "control_plane_restart", first.run_id)
    assert retried[:3] == (2, "completed", None) and retried[4] == first.run_id
