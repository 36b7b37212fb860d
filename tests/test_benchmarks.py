"""Benchmarks run: each cheap one, at a tiny size, exits 0 and prints its table.

A benchmark is run by hand, so one that broke when the code under it changed went unseen
until its next run (start_check.py's stand-in experiment lacked the `budget` the start check
came to read). The figures are not checked here (docs/performance.md has them).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]

CASES = {
    "start_check": (
        ["--mode", "embedded", "--sizes", "100", "--repeat", "2", "--full-upto", "100"],
        ["blocker_ms", "blocker_ms_during_puts", "put_ms"],
    ),
    "store_scale": (
        ["--mode", "embedded", "--rows", "2000", "--repeat", "1", "--compact-files", "5"],
        ["SELECT * FROM experiment_index", "put, loaded store", "files after"],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_benchmark_runs_at_a_tiny_size(name: str) -> None:
    args, lines = CASES[name]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    missing = [line for line in lines if line not in done.stdout]
    assert not missing, f"{name} printed no {missing}:\n{done.stdout}"
