"""A run killed mid-trials loses no finished trial, leaves no half-written row, and resumes.

The attempts it cut off are recorded as infra_error / control_plane_restart and retried.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import duckdb
import pyarrow.parquet as pq
import pytest

from tests.conftest import cli_env, hangar

pytestmark = pytest.mark.slow


def trial_files(home: Path) -> list[Path]:
    return (
        sorted((home / "parquet" / "trials").rglob("*.parquet"))
        if (home / "parquet").exists()
        else []
    )


def test_sigkill_mid_run_then_resume(example_dir: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    exe = Path(sys.executable).with_name("hangar")
    proc = subprocess.Popen(
        [str(exe), "experiment", "run", str(example_dir / "experiment.yaml"), "--wait"],
        env=cli_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while len(trial_files(home)) < 4 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the CLI and its sandboxes, mid-trial
    proc.wait()
    stdout = proc.stdout.read() if proc.stdout else ""
    experiment_id = stdout.split("submitted ")[1].split()[0]

    finished = trial_files(home)
    assert 4 <= len(finished) < 18, "the kill must land while trials are still running"
    for f in finished:  # every stored row is whole
        assert pq.read_table(f).num_rows == 1
    assert not [p for p in (home / "parquet").rglob("*") if p.is_file() and p.suffix != ".parquet"]
    before = {f.name: f.stat().st_mtime_ns for f in finished}

    # What a person does when the worker is gone (resume refuses while Dagster says STARTED):
    # terminate the dead run. Its cut-off attempts are closed by the next trials run.
    with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
        for run in instance.get_runs():
            if not run.is_finished:
                instance.report_run_failed(run, "its process was killed (SIGKILL)")
    resumed = hangar("experiment", "resume", experiment_id, home=home)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr

    after = {f.name: f.stat().st_mtime_ns for f in trial_files(home)}
    assert {k: after[k] for k in before} == before, "finished trials were not touched"
    con = duckdb.connect(str(home / "hangar.duckdb"), read_only=True)
    try:
        rows = con.execute(
            "select trial_key, attempt, outcome_class, infra_reason, run_id, retry_of, cost_usd "
            "from trials where experiment_id = ? order by trial_key, attempt",
            [experiment_id],
        ).fetchall()
        index = con.execute(
            "select trial_key, attempt from experiment_index where experiment_id = ? "
            "and passed is not null",
            [experiment_id],
        ).fetchall()
    finally:
        con.close()
    # The attempts the kill cut off are recorded (not silently run again as attempt 1) ...
    cut = [r for r in rows if r[3] == "control_plane_restart"]
    assert 1 <= len(cut) <= 3, rows  # at most `parallel` (3) were in flight
    assert all(r[1] == 1 and r[2] == "infra_error" and r[6] is None for r in cut)
    # ... and their keys complete as attempt 2, retrying the dead run.
    retries = {r[0]: r for r in rows if r[1] == 2}
    assert sorted(retries) == sorted(r[0] for r in cut)
    assert all(retries[r[0]][5] == r[4] for r in cut)
    assert len(rows) == 18 + len(cut)
    assert {k for k, _ in index} == {r[0] for r in rows} and len(index) == 18
    assert all(a == (2 if k in retries else 1) for k, a in index)
