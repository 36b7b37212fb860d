"""A run killed mid-trials loses no finished trial, leaves no half-written row, and resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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

    resumed = hangar("experiment", "resume", experiment_id, home=home)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr

    after = {f.name: f.stat().st_mtime_ns for f in trial_files(home)}
    assert {k: after[k] for k in before} == before, "finished trials were not touched"
    con = duckdb.connect(str(home / "hangar.duckdb"), read_only=True)
    try:
        counts = con.execute(
            "select count(*), count(distinct trial_key), max(attempt) from trials where experiment_id = ?",
            [experiment_id],
        ).fetchone()
        graded = con.execute(
            "select count(*) from experiment_index where experiment_id = ? and passed is not null",
            [experiment_id],
        ).fetchone()
    finally:
        con.close()
    assert counts == (18, 18, 1)
    assert graded == (18,)
