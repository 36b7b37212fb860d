"""hangar's own liveness check of a stage run's process (queue/liveness.py), on real
processes: alive while it runs, gone after SIGKILL, gone when its pid is another process."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import signal
from pathlib import Path

import pytest

from hangar_dagster.queue.liveness import (
    launcher_gone,
    read_run_process,
    record_file,
    record_run_process,
    worker_gone,
)
from hangar_dagster.results.records import utcnow
from hangar_dagster.settings import HangarPaths
from tests.conftest import recorded_worker, ui_lock_holder

pytestmark = pytest.mark.integration


def test_a_recorded_worker_is_alive_until_sigkill_then_gone(tmp_path: Path) -> None:
    paths = HangarPaths(tmp_path)
    worker = recorded_worker(tmp_path, "run-1")
    try:
        rec = read_run_process(paths, "run-1")
        assert rec is not None and rec.pid == worker.pid
        assert worker_gone(paths, "run-1") is None
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        why = worker_gone(paths, "run-1")
        assert why is not None and f"pid {worker.pid}" in why and why.endswith("is gone")
    finally:
        worker.kill()
        worker.wait()


def test_a_pid_now_held_by_another_process_counts_as_gone(tmp_path: Path) -> None:
    paths = HangarPaths(tmp_path)
    rec = record_run_process(paths, "run-2")  # this process: alive
    assert worker_gone(paths, "run-2") is None
    reused = dataclasses.replace(rec, start_ticks=rec.start_ticks - 1)
    record_file(paths, "run-2").write_text(json.dumps(dataclasses.asdict(reused)))
    why = worker_gone(paths, "run-2")
    assert why is not None and "another process now" in why


def test_nothing_recorded_or_another_host_cannot_be_told(tmp_path: Path) -> None:
    paths = HangarPaths(tmp_path)
    assert worker_gone(paths, "never-recorded") is None
    rec = record_run_process(paths, "run-3")
    elsewhere = dataclasses.replace(rec, host="some-other-host", pid=999_999_999)
    record_file(paths, "run-3").write_text(json.dumps(dataclasses.asdict(elsewhere)))
    assert worker_gone(paths, "run-3") is None


# --- a daemon-launched run whose launcher died with the whole `hangar ui` ----------------------
def test_a_run_starting_before_this_ui_started_lost_its_launcher(tmp_path: Path) -> None:
    """Regression (tests/chaos.py, round 7 of seed 1414): the whole `hangar ui` SIGKILLed while
    the daemon was launching a run left it STARTING, with no process record, until run
    monitoring's 300 s start timeout; the new UI's sensor and `resume` waited beside it."""
    paths = HangarPaths(tmp_path)
    before = utcnow() - dt.timedelta(seconds=5)  # STARTING under the UI that was killed
    ui = ui_lock_holder(tmp_path)
    try:
        why = launcher_gone(paths, before)
        assert why is not None and f"pid {ui.pid}" in why and "launched it is gone" in why
        # A run this UI's daemon launched is its own: waited for, however long it takes.
        assert launcher_gone(paths, utcnow()) is None
    finally:
        ui.kill()
        ui.wait()


def test_with_no_ui_on_the_home_no_launcher_of_a_starting_run_can_be_alive(tmp_path: Path) -> None:
    paths = HangarPaths(tmp_path)
    why = launcher_gone(paths, utcnow())
    assert why is not None and "no `hangar ui` runs on this home" in why
    # The lock file a killed UI left behind is not a UI.
    paths.ui_lock.write_text("999999999\n")
    assert launcher_gone(paths, utcnow()) == why
