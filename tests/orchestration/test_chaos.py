"""The chaos tool (tests/chaos.py): its store checks catch what they look for, and a few seeded
rounds of kills and drains under `run --wait` leave a store that keeps every rule."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hangar_dagster.results.store import Store
from hangar_dagster.settings import paths
from tests import factories as f
from tests.chaos import check_store, parquet_rows
from tests.conftest import ROOT, cli_env

pytestmark = pytest.mark.slow

SEED = 14  # fixed, so a failure is replayed with `python -m tests.chaos --seed 14 ...`


@pytest.mark.unit
def test_the_store_checks_name_a_gap_a_second_counted_attempt_a_missing_grade_and_a_lost_trial(
    hangar_home: Path,
) -> None:
    store = Store(paths())
    store.put(f.trial("v", "t1", 1, 1, outcome_class="infra_error", infra_reason="clone"))
    store.put(f.trial("v", "t1", 1, 3))  # attempt 2 missing
    store.put(f.trial("v", "t2", 1, 1))
    store.put(f.trial("v", "t2", 1, 2))  # two counted attempts of one key
    store.put(f.grade("v", "t1", 1, 3))
    kept = parquet_rows(hangar_home, "trials") | {("v/t3/1", 1, "completed", None, "run-x")}
    problems = check_store(hangar_home, f.EXP, 2, kept)
    said = "\n".join(problems)
    assert "v/t1/1: attempt numbers with a gap or twice: [1, 3]" in said
    assert "v/t2/1: 2 counted attempts" in said
    assert "counted trials without a grade: ['v/t2/1']" in said
    assert "finished trials lost or changed: [('v/t3/1', 1" in said
    assert "Parquet and DuckDB" not in said  # they agree here
    store.put(f.grade("v", "t2", 1, 2))
    assert "without a grade" not in "\n".join(check_store(hangar_home, f.EXP, 2, set()))


def test_seeded_kills_and_drains_under_run_wait_keep_every_rule(tmp_path: Path) -> None:
    # Cheap on purpose (tier budget: docs/performance.md): two rounds of the CLI's modes, a
    # two-trial experiment of the scripted command agent, each kill aimed at a stage.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.chaos",
            "--rounds",
            "2",
            "--seed",
            str(SEED),
            "--modes",
            "worker,drain",
            "--timeout",
            "150",
            "--work",
            str(tmp_path / "chaos"),
        ],
        cwd=ROOT,
        env=cli_env(tmp_path / "unused-home"),
        capture_output=True,
        text=True,
        timeout=175,
    )
    out = done.stdout + done.stderr
    assert f"chaos: seed {SEED}, 2 rounds" in out
    assert done.returncode == 0, out
    assert "2 rounds, 0 broken" in out and "PROBLEMS" not in out
    assert out.count("(aimed at ") == 2, out  # one kill aimed at a stage per round
