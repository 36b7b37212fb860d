"""The tally (results/tally.py) in the embedded store: what the start check reads agrees with the
full recomputation over the stored rows, after crashes at each step of a put, a deleted or
outdated tally file, and without DuckDB."""

from __future__ import annotations

import datetime as dt
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import factories as f
import pytest
from tally_check import assert_agrees, assert_live_tokens_count_once, mixed_attempts, tallied

from hangar_dagster.queue.retries import BREAKER_NEUTRAL, CAP_EXEMPT, NEVER_RETRIED
from hangar_dagster.results import tally
from hangar_dagster.results.store import EmbeddedStore, Store
from hangar_dagster.settings import HangarPaths, paths

pytestmark = pytest.mark.unit

OTHER = "exp-0002"


@pytest.fixture(scope="module")
def mixed_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home holding two experiments' mixed attempts, stored once; tests copy it."""
    home = tmp_path_factory.mktemp("mixed") / "hangar"
    store = Store(HangarPaths(home))
    store.put(f.experiment())
    store.put(f.experiment(experiment_id=OTHER, author="bo"))
    for t in mixed_attempts(f.EXP, 14, seed=1) + mixed_attempts(OTHER, 6, seed=2):
        store.put(t)
    # a streak at the end: systemic failures with a neutral one between (the breaker steps over)
    late = f.T0.replace(month=5, day=20)
    for i, reason in enumerate(("provider_5xx", "power_down", "rate_limit")):
        at = late + dt.timedelta(seconds=i)
        store.put(
            f.attempt_of(
                f.EXP,
                f"v0/late{i}/1",
                1,
                outcome_class="infra_error",
                infra_reason=reason,
                finished_at=at,
                started_at=at - dt.timedelta(seconds=9),
            )
        )
    return home


def _mixed(mixed_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    shutil.copytree(mixed_home, tmp_path / "hangar")
    return f.make_store(tmp_path, monkeypatch)


def test_the_tally_agrees_with_the_full_recomputation(
    mixed_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _mixed(mixed_home, tmp_path, monkeypatch)
    assert_agrees(store, [f.EXP, OTHER])
    # the mix reaches both rules' stops, so agreeing is not agreeing on "nothing"
    note, capped, open_keys = tallied(store, f.EXP, 40, per_key=3, streak=2)
    assert note is not None and "v0/late0/1" in note and "v0/late1/1" not in note
    assert capped is not None and len(open_keys) >= 2
    # a trial of an experiment with no stored record counts for nobody, as in budget_ledger
    store.put(f.attempt_of("exp-none", "base/t1/1", 1, cost_usd=3.0))
    assert_agrees(store, [f.EXP, OTHER, "exp-none"])
    # ... until its record is stored; an author the tally lost is taken from the record
    store.put(f.experiment(experiment_id="exp-none", author="cy"))
    con = sqlite3.connect(store.paths.tally)
    con.execute("DELETE FROM tally_experiments WHERE experiment_id = 'exp-none'")
    con.commit()
    con.close()
    assert store.spent_by_author("2025-03")["cy"] == 3.0
    assert_agrees(store, [f.EXP, OTHER, "exp-none"])
    # attempts stored out of order: a late lower attempt never reopens (or closes) its key
    for key, first, second in (
        ("v0/late-a/1", "completed", "infra_error"),
        ("v0/late-b/1", "infra_error", "completed"),
    ):
        for n, outcome in ((2, second), (1, first)):
            infra = {"infra_reason": "preempted"} if outcome == "infra_error" else {}
            store.put(f.attempt_of(f.EXP, key, n, outcome_class=outcome, **infra))
    open_keys = {a.trial_key for a in store.open_infra(f.EXP, 3)}
    assert "v0/late-a/1" in open_keys and "v0/late-b/1" not in open_keys
    assert_agrees(store, [f.EXP, OTHER, "exp-none"])


def test_a_deleted_or_outdated_tally_is_rebuilt_from_the_rows(
    mixed_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _mixed(mixed_home, tmp_path, monkeypatch)
    for leftover in store.paths.home.glob("tally.sqlite*"):
        leftover.unlink()
    assert_agrees(Store(store.paths), [f.EXP, OTHER])
    con = sqlite3.connect(store.paths.tally)
    con.execute("UPDATE tally_meta SET v = 'old' WHERE k = 'version'")
    con.execute("DELETE FROM tally_spend")  # what an old version would not have
    con.commit()
    con.close()
    assert_agrees(Store(store.paths), [f.EXP, OTHER])
    before = store.start_state(f.EXP, 2), store.open_infra(f.EXP, 2)
    store.rebuild_tally()
    assert (store.start_state(f.EXP, 2), store.open_infra(f.EXP, 2)) == before


_DIES = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, sys.argv[2])
    import factories as f
    from pathlib import Path
    from hangar_dagster.results.store import EmbeddedStore, Store
    from hangar_dagster.settings import HangarPaths
    if sys.argv[3] == "before-tally":  # the Parquet file is linked, the tally not yet told
        EmbeddedStore._tally_rows = lambda *a: os._exit(9)
    else:  # the tally has it, DuckDB not yet
        EmbeddedStore._insert = staticmethod(lambda *a: os._exit(9))
    Store(HangarPaths(Path(sys.argv[1]))).put(
        f.attempt_of(f.EXP, "skill/t9/1", 1, cost_usd=0.75, outcome_class="infra_error",
                     infra_reason="preempted"))
""")


@pytest.mark.parametrize("where", ["before-tally", "before-duckdb"])
def test_a_crash_inside_a_put_leaves_the_tally_agreeing(
    mixed_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    store = _mixed(mixed_home, tmp_path, monkeypatch)
    died = subprocess.run(
        [sys.executable, "-c", _DIES, str(store.paths.home), str(Path(__file__).parents[1]), where],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert died.returncode == 9, died.stderr
    assert len(list(store.paths.pending.iterdir())) == 1, "its journal marker stays"
    # the start check alone (no DuckDB read yet) already counts the crashed attempt, once
    fresh = Store(store.paths)
    assert fresh.next_attempt(f.EXP, "skill/t9/1") == 2
    assert "skill/t9/1" in {a.trial_key for a in fresh.open_infra(f.EXP, 2)}
    assert_agrees(fresh, [f.EXP, OTHER])  # its reads bring the row into DuckDB too
    assert list(store.paths.pending.iterdir()) == []


def test_the_start_check_reads_neither_duckdb_nor_full_rows(
    mixed_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _mixed(mixed_home, tmp_path, monkeypatch)
    store.next_attempt(f.EXP, "x/y/1")  # the tally exists (built or kept current)

    def no_duckdb(*a: object, **kw: object) -> None:
        raise AssertionError("the start check opened DuckDB")

    monkeypatch.setattr(EmbeddedStore, "_db", no_duckdb)
    state = store.start_state(f.EXP, 3)
    assert state.streak and state.open_counted and state.counted_retries >= 0
    assert store.open_infra(f.EXP, 3)
    assert store.spent_by_author("2025-03")
    assert store.tokens_since(f.T0.replace(year=2000)) > 0
    assert store.next_attempt(f.EXP, "v0/t0/1") >= 2


def test_running_trials_tokens_count_toward_the_throttle_once(hangar_home: Path) -> None:
    assert_live_tokens_count_once(Store(paths()))


def test_the_tally_names_the_same_reasons_as_the_retry_rules() -> None:
    assert set(tally.CAP_EXEMPT_REASONS) == CAP_EXEMPT
    assert set(tally.NEVER_RETRIED_REASONS) == NEVER_RETRIED
    assert set(tally.BREAKER_NEUTRAL_REASONS) == BREAKER_NEUTRAL
