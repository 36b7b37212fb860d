"""The Dagster home: a fresh one opened by several hangar processes at once.

The bug it pins: each process's first DagsterInstance created and stamped the SQLite
storages; two doing it at once broke the home ("alembic_version has more than one head", or a
table created twice), e.g. `hangar ui` and `hangar experiment run` started together on a new
machine (seen in CI through the chaos test's observer). ``ensure_dagster_home`` makes them
once, under a lock, before any instance is opened.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

# Each process waits for one instant, then prepares the home and reads its runs.
OPEN = """
import sys, time
from pathlib import Path
at = float(sys.argv[2])
import dagster as dg
from hangar_dagster.orchestration.instance import ensure_dagster_home
from hangar_dagster.settings import Settings
settings = Settings.from_env()
while time.time() < at:
    pass
ensure_dagster_home(settings)
with dg.DagsterInstance.get() as instance:
    print(len(instance.get_runs()))
"""


@pytest.mark.parametrize("home_n", range(2))
def test_processes_opening_a_fresh_home_at_once_all_get_a_working_instance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home_n: int
) -> None:
    home = tmp_path / f"home{home_n}"
    monkeypatch.setenv("HANGAR_HOME", str(home))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    at = time.time() + 4  # after every process has imported dagster
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN, str(home), str(at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
        assert out.strip() == "0"
