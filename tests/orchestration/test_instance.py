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
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

# Each process imports, says it is ready, waits until all are, then prepares the home and
# reads its runs: a barrier, not a fixed instant (imports under load outlast any fixed wait).
OPEN = """
import sys, time
from pathlib import Path
import dagster as dg
from hangar_dagster.orchestration.instance import ensure_dagster_home
from hangar_dagster.settings import Settings
settings = Settings.from_env()
gate, me, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
(gate / f"ready-{me}").touch()
while len(list(gate.glob("ready-*"))) < n:
    time.sleep(0.001)
ensure_dagster_home(settings)
with dg.DagsterInstance.get() as instance:
    print(len(instance.get_runs()))
"""
PROCESSES = 3


@pytest.mark.parametrize("home_n", range(2))
def test_processes_opening_a_fresh_home_at_once_all_get_a_working_instance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home_n: int
) -> None:
    home = tmp_path / f"home{home_n}"
    monkeypatch.setenv("HANGAR_HOME", str(home))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    gate = tmp_path / f"gate{home_n}"
    gate.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN, str(gate), str(n), str(PROCESSES)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(PROCESSES)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
        assert out.strip() == "0"


def test_a_home_kept_in_postgres_is_not_opened_to_prepare_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server's storage makes its own tables; the CLI must not need it reachable to prepare
    the home (the Docker deployment's dagster.yaml, its Postgres nowhere)."""
    from hangar_dagster.orchestration.instance import STORAGES_MADE, ensure_dagster_home
    from hangar_dagster.settings import Settings

    home = tmp_path / "dagster"
    home.mkdir()
    deployed = Path(__file__).parents[2] / "deploy" / "docker" / "dagster.yaml"
    (home / "dagster.yaml").write_text(deployed.read_text())
    monkeypatch.setenv("HANGAR_HOME", str(tmp_path / "hangar"))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("HANGAR_PG_URL", "postgresql+psycopg2://nobody@127.0.0.1:1/none")
    assert ensure_dagster_home(Settings.from_env()) == home
    assert not (home / STORAGES_MADE).exists() and not (home / "history").exists()
