"""hangar's own liveness check of a stage run's process (queue/liveness.py), on real
processes: alive while it runs, gone after SIGKILL, gone when its pid is another process."""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path

import pytest

from hangar_dagster.queue.liveness import (
    read_run_process,
    record_file,
    record_run_process,
    worker_gone,
)
from hangar_dagster.settings import HangarPaths
from tests.conftest import recorded_worker

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
