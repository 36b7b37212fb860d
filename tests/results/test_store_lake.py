"""The DuckLake store (HANGAR_STORE=ducklake): the same records, tables and views as the embedded
default, many writer processes at once, analysts reading a consistent snapshot meanwhile, and
Parquet files any hive reader opens."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import factories as f
import pyarrow.dataset as ds
import pytest

from hangar_dagster.results.lake import LakeStore, attach_sql
from hangar_dagster.results.store import DuplicateRecordError, Store
from hangar_dagster.settings import paths

pytestmark = pytest.mark.integration


def test_the_setting_picks_the_lake_and_round_trips_every_record(lake_env: dict[str, str]) -> None:
    store = Store(paths())
    assert isinstance(store, LakeStore)
    exp, pin, check = f.experiment(), f.pin_set(), f.base_check()
    trial, grade, note = f.trial(), f.grade(), f.note()
    for rec in (exp, pin, f.experiment_pin(), check, trial, grade, note):
        store.put(rec)
    assert store.experiment(f.EXP) == exp
    assert store.pins(f.EXP) == {"base": pin}
    assert store.base_checks(f.EXP) == {"t1": check}
    assert store.trials(f.EXP) == [trial]
    assert store.grades(f.EXP) == [grade]
    # A run's own keys only (a relaunch reads what it runs).
    assert store.trials(f.EXP, keys=[trial.trial_key]) == [trial]
    assert store.grades(f.EXP, all_attempts=True, keys=["base/t9/1"]) == []
    assert store.notes(f.EXP) == [note]
    assert store.next_attempt(f.EXP, "base/t1/1") == 2
    [row] = store.index(f.EXP)
    assert row["hidden_total"] == 3 and row["tamper_signals"] == []
    [summary] = store.summary(f.EXP)
    assert (summary["trials"], summary["graded"]) == (1, 1)


def test_running_trials_tokens_count_toward_the_throttle_once_in_the_lake(
    lake_env: dict[str, str],
) -> None:
    from tally_check import assert_live_tokens_count_once

    assert_live_tokens_count_once(Store(paths()))


def test_the_lake_refuses_what_the_embedded_store_refuses(lake_env: dict[str, str]) -> None:
    store = Store(paths())
    store.put(f.trial(cost_usd=0.25))
    with pytest.raises(DuplicateRecordError, match="trials already holds .*next_attempt"):
        store.put(f.trial(cost_usd=9.0))
    store.put(f.pin_set())
    store.put(f.pin_set(created_at=f.T0.replace(year=2030)))  # same content: fine
    with pytest.raises(DuplicateRecordError, match="different model.*immutable"):
        store.put(f.pin_set(model="claude-opus-4-20250514"))
    assert [t.cost_usd for t in store.trials(f.EXP, all_attempts=True)] == [0.25]


def test_an_unknown_store_mode_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HANGAR_STORE", "sqlite")
    with pytest.raises(ValueError, match="HANGAR_STORE='sqlite' .* known: ducklake, embedded"):
        Store(paths())
    monkeypatch.setenv("HANGAR_STORE", "ducklake")
    monkeypatch.delenv("HANGAR_STORE_CATALOG", raising=False)
    with pytest.raises(ValueError, match="needs HANGAR_STORE_CATALOG"):
        Store(paths())


WRITERS = 8

_WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import factories as f
    from hangar_dagster.results.store import Store
    from hangar_dagster.settings import paths
    store = Store(paths())
    n, rows, batch = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    store.experiments()
    print("ready", flush=True)
    sys.stdin.readline()
    for start in range(0, rows, batch):
        span = range(start, min(start + batch, rows))
        trials = [f.trial(f"v{n}", f"t{i}", cost_usd=1.0) for i in span]
        grades = [f.grade(f"v{n}", f"t{i}", passed=i % 2 == 0) for i in span]
        if batch == 1:
            store.put(trials[0])
            store.put(grades[0])
        else:
            store.put_many(trials)  # each batch's trials commit before its grades
            store.put_many(grades)
""")

# One snapshot: every grade has its trial (each writer stores the trial first) and the two
# counts come from the same moment even though writers commit between the two reads.
_SNAPSHOT = """
SELECT (SELECT count(*) FROM trials) AS trials,
       (SELECT count(*) FROM grades) AS grades,
       (SELECT count(*) FROM grades g ANTI JOIN trials t USING (experiment_id, trial_key, attempt))
         AS orphan_grades,
       (SELECT coalesce(sum(trials), 0) FROM variant_summary) AS summary_trials,
       (SELECT count(*) FROM experiment_index) AS index_keys,
       (SELECT count(passed) FROM experiment_index) AS index_graded
"""


@pytest.mark.parametrize(
    ("rows", "batch"),
    [
        pytest.param(1000, 50, id="1000-rows-each-in-batches"),
        pytest.param(6, 1, id="6-rows-each-one-put-at-a-time"),
    ],
)
def test_eight_writer_processes_lose_nothing_and_an_analyst_sees_snapshots(
    lake_env: dict[str, str], rows: int, batch: int
) -> None:
    store = Store(paths())  # creates the tables once, before the writers race
    assert isinstance(store, LakeStore) and store.experiments() == []
    here = str(Path(__file__).parents[1])
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, here, str(n), str(rows), str(batch)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(WRITERS)
    ]
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline()
        if line.strip() != "ready":
            p.kill()
            raise AssertionError((line, p.communicate(timeout=60)))
    for p in procs:  # all at once
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()

    # An analyst, attached read-only as the docs say, reads while the writers write.
    analyst = duckdb.connect()
    analyst.execute("SET enable_progress_bar = false")
    analyst.execute(attach_sql(lake_env["HANGAR_STORE_CATALOG"], read_only=True))
    seen: list[tuple[int, int]] = []
    while any(p.poll() is None for p in procs):
        analyst.execute("BEGIN")
        first = analyst.execute(_SNAPSHOT).fetchone()
        time.sleep(0.2)
        again = analyst.execute(_SNAPSHOT).fetchone()
        analyst.execute("COMMIT")
        assert first is not None and again == first, "one transaction reads one snapshot"
        trials, grades, orphans, summary_trials, index_keys, index_graded = first
        assert orphans == 0 and grades <= trials and summary_trials == trials
        # the stored index commits with its rows: level with them in every snapshot
        assert (index_keys, index_graded) == (trials, grades)
        seen.append((trials, grades))
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    assert len({s for s in seen}) > 2, f"the analyst read while writes happened: {seen}"

    total = WRITERS * rows
    got = analyst.execute("SELECT count(*), count(DISTINCT (variant, task)) FROM trials").fetchone()
    assert got == (total, total), "nothing lost, nothing duplicated"
    got = analyst.execute("SELECT count(*), count(DISTINCT trial_key) FROM grades").fetchone()
    assert got == (total, total)
    analyst.close()
    assert sum(r["passed"] for r in store.summary(f.EXP)) == total // 2

    # Compaction writes the inlined rows out: few files, readable by any hive reader. The
    # writers' own flushes kept what they replaced (an analyst was reading); with every reader
    # gone, 0 deletes those too.
    store.compact(keep_replaced_s=0)
    lake = Path(lake_env["HANGAR_STORE_DATA"])
    files = sorted((lake / "main" / "trials").rglob("*.parquet"))
    assert 1 <= len(files) <= 4, files
    assert all(p.parent.name == f"experiment_id={f.EXP}" for p in files)
    # the index's replaced rows (every grade replaced its trial's) are written out too
    index_files = sorted((lake / "main" / "experiment_index").rglob("*.parquet"))
    assert 1 <= len(index_files) <= 4, index_files
    plain = duckdb.connect()
    got = plain.execute(
        "SELECT experiment_id, count(*) FROM read_parquet(?, hive_partitioning = true) GROUP BY 1",
        [str(lake / "main" / "trials" / "**" / "*.parquet")],
    ).fetchall()
    assert got == [(f.EXP, total)]
    table = ds.dataset(lake / "main" / "grades", format="parquet", partitioning="hive").to_table()
    assert table.num_rows == total and set(table.column("experiment_id").to_pylist()) == {f.EXP}
    # and the store still answers the same after compaction
    assert store.next_attempt(f.EXP, "v0/t0/1") == 2
    assert len(store.trials(f.EXP)) == total


def test_the_documented_queries_and_views_answer_the_same_in_both_modes(
    lake_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_data_doc import _populate, _sql_blocks  # the records and queries docs/data.md pins

    lake = Store(paths())
    monkeypatch.setenv("HANGAR_STORE", "embedded")
    embedded = Store(paths())
    assert type(embedded).__name__ == "EmbeddedStore"
    for store in (lake, embedded):
        _populate(store)
    # a lake whose views an older hangar made: the next store to attach it makes them again
    assert isinstance(lake, LakeStore)
    with lake._db() as con:  # its index a view, as before it was a table
        con.execute("BEGIN")
        con.execute("DROP TABLE experiment_index")
        con.execute("CREATE VIEW experiment_index AS SELECT 1 AS stale")
        con.execute("COMMIT")
    with lake._pg_tx() as cur:
        cur.execute("UPDATE hangar_store_keys SET k = 'an older digest' WHERE tbl = '_schema'")
    lake.close()
    lake = LakeStore(lake.paths)
    blocks = _sql_blocks()
    assert len(blocks) == 6
    for sql in [
        *blocks,
        "SELECT * FROM experiment_index ORDER BY ALL",
        "SELECT * FROM variant_summary ORDER BY ALL",
        "SELECT * FROM budget_ledger ORDER BY ALL",
    ]:
        got_lake, got_embedded = lake._query(sql, []), embedded._query(sql, [])
        assert got_lake == got_embedded, sql
        assert got_embedded, f"the populated store answers {sql}"
    # the progress line's one aggregate query (run --wait reads it every second)
    ids = embedded._query("SELECT DISTINCT experiment_id FROM trials ORDER BY 1", [])
    counts = {r["experiment_id"]: embedded.progress_counts(r["experiment_id"]) for r in ids}
    assert counts and any(c["done"] for c in counts.values()), counts
    assert {e: lake.progress_counts(e) for e in counts} == counts


def test_the_store_settings_reach_a_run_and_come_back(tmp_path: Path) -> None:
    from hangar_dagster.orchestration.resources import HangarResource
    from hangar_dagster.settings import Settings

    env = {
        "HANGAR_HOME": str(tmp_path),
        "HANGAR_STORE": "ducklake",
        "HANGAR_STORE_CATALOG": "host=db dbname=hangar user=w password=secret",
        "HANGAR_STORE_DATA": "/shared/lake",
    }
    settings = Settings.from_env(env)
    assert settings.paths.store.mode == "ducklake" and settings.paths.lake == Path("/shared/lake")
    assert "secret" not in repr(settings) and "secret" not in repr(settings.paths)
    resource = HangarResource.from_settings(settings)
    assert "secret" not in repr(resource)  # an EnvVar: resolved in the run's process
    assert resource.store_mode == "ducklake" and resource.store_data == "/shared/lake"


_TALLY_WRITER = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/results")
    import factories as f
    from tally_check import mixed_attempts
    from hangar_dagster.results import lake
    from hangar_dagster.results.store import Store
    from hangar_dagster.settings import paths
    store = Store(paths())
    n, crash = int(sys.argv[2]), sys.argv[3]
    eid = f"exp-w{n}"
    store.put(f.experiment(experiment_id=eid, author=f"author{n % 2}"))
    for t in mixed_attempts(eid, 8, seed=n):
        store.put(t)
    dead = f.attempt_of(eid, "v0/dead/1", 1, outcome_class="infra_error", infra_reason="preempted")
    if crash == "after-commit":  # stored in the DuckLake, the tally not yet told
        lake._SQL.apply_trials = lambda *a: os._exit(9)
        store.put(dead)
    elif crash == "before-commit":  # marked unapplied, never stored
        lake.LakeStore._retrying_insert = lambda *a: os._exit(9)
        store.put(dead)
""")


def test_the_tally_agrees_with_writer_processes_and_their_crashes(
    lake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tally_check import assert_agrees

    from hangar_dagster.results import lake

    store = Store(paths())
    store.experiments()  # the tables exist before the writers race
    here = str(Path(__file__).parents[1])
    crashes = ["none", "after-commit", "before-commit"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _TALLY_WRITER, here, str(n), crash],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n, crash in enumerate(crashes)
    ]
    for proc, crash in zip(procs, crashes, strict=True):
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == (0 if crash == "none" else 9), err
    experiments = [f"exp-w{n}" for n in range(len(crashes))]
    # the dead writers' marks are settled once stale: one row applied, one forgotten
    monkeypatch.setattr(lake, "UNAPPLIED_STALE_S", 0.0)
    assert store.next_attempt("exp-w1", "v0/dead/1") == 2
    assert store.next_attempt("exp-w2", "v0/dead/1") == 1
    assert_agrees(store, experiments)
    assert isinstance(store, LakeStore)
    with store._pg_tx() as cur:
        cur.execute("SELECT count(*) FROM tally_unapplied")
        assert cur.fetchone()[0] == 0
    store.rebuild_tally()
    assert_agrees(store, experiments)
    store.close()


def test_a_catalog_made_before_a_column_existed_gains_it_once(lake_env: dict[str, str]) -> None:
    """A catalog an older hangar made lacks the columns and views added since (trials.
    reused_from, say): the next connect adds them, and records it, so later ones do not."""
    from hangar_dagster.results import lake as lake_module

    store = Store(paths())
    assert isinstance(store, LakeStore)
    store.put(f.trial())
    with store._db() as con:  # what the catalog looked like before the column
        con.execute("BEGIN")
        con.execute("ALTER TABLE trials DROP COLUMN reused_from")
        con.execute("COMMIT")
    with store._pg_tx() as cur:
        cur.execute(f"DELETE FROM {lake_module.KEYS} WHERE tbl = '_schema'")
    again = Store(paths())
    origin = {"experiment_id": "exp-0", "trial_key": "base/t1/1", "attempt": 1}
    again.put(f.trial(replicate=2, reused_from=origin))
    assert [t.reused_from for t in again.trials(f.EXP)] == [None, origin]
    assert isinstance(again, LakeStore)
    with again._pg_tx() as cur:
        cur.execute(f"SELECT k FROM {lake_module.KEYS} WHERE tbl = '_schema'")
        marks = cur.fetchall()
    assert marks == [(lake_module.SCHEMA_DIGEST,)]


def test_a_second_writer_of_a_key_waits_for_the_first_and_is_refused(
    lake_env: dict[str, str],
) -> None:
    """The key is reserved before the DuckLake commit: a writer that finds it reserved but its
    row not yet there waits for the reserver (its advisory lock), instead of taking it for dead
    and storing the attempt a second time."""
    import threading

    first, second = Store(paths()), Store(paths())
    assert isinstance(first, LakeStore) and isinstance(second, LakeStore)
    first.experiments()  # the tables exist before the race, and both are attached
    second.experiments()
    reserved = threading.Event()
    real = first._retrying_insert

    def slow(table: object, batch: object) -> None:
        reserved.set()  # the key is reserved, the row not committed yet
        time.sleep(2.0)
        real(table, batch)  # type: ignore[arg-type]

    first._retrying_insert = slow  # type: ignore[method-assign]
    errors: list[BaseException] = []
    writer = threading.Thread(target=lambda: first.put(f.trial(cost_usd=0.25)))
    writer.start()
    assert reserved.wait(60)
    try:
        second.put(f.trial(cost_usd=9.0))
    except DuplicateRecordError as e:
        errors.append(e)
    writer.join(60)
    assert len(errors) == 1, "the second write of the key is refused"
    assert [t.cost_usd for t in second.trials(f.EXP, all_attempts=True)] == [0.25]
    assert second.next_attempt(f.EXP, "base/t1/1") == 2
    first.close()
    second.close()


def test_the_lake_keeps_its_index_current_in_any_order(lake_env: dict[str, str]) -> None:
    """As tests/results/test_index.py for the embedded store: records in a shuffled order, one
    by one and in batches, leave experiment_index what its plain definition says."""
    import random

    from test_views import PLAIN_INDEX, _mix

    records = _mix(4)
    random.Random(4).shuffle(records)
    store = Store(paths())
    for i in range(0, len(records), 9):
        chunk = records[i : i + 9]
        if i % 2:
            store.put_many(chunk)
        else:
            for r in chunk:
                store.put(r)
    order = "ORDER BY experiment_id, trial_key"
    index = store._query(f"SELECT * FROM experiment_index {order}", [])
    assert index == store._query(f"SELECT * FROM ({PLAIN_INDEX}) {order}", [])
    assert len(index) == 2 * 3 * 6 * 2
    store.compact()  # the index's files written again without their replaced rows
    assert store._query(f"SELECT * FROM experiment_index {order}", []) == index


@pytest.mark.parametrize("batched", [False, True], ids=["one-by-one", "put_many"])
def test_batched_puts_flush_inlined_rows_as_often_as_single_ones(
    lake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, batched: bool
) -> None:
    """Regression: only `put` counted toward FLUSH_EVERY, so a loader that wrote in batches kept
    every row inlined in the catalog until someone called compact by hand."""
    from hangar_dagster.results import lake

    monkeypatch.setattr(lake, "FLUSH_EVERY", 4)
    store = Store(paths())
    trials = [f.trial(task=f"t{n}") for n in range(9)]
    for i in range(0, len(trials), 3):
        if batched:
            store.put_many(trials[i : i + 3])
        else:
            for t in trials[i : i + 3]:
                store.put(t)
    files = list((Path(lake_env["HANGAR_STORE_DATA"]) / "main" / "trials").rglob("*.parquet"))
    assert files, "9 puts with FLUSH_EVERY = 4 wrote no inlined row out"
    assert len(store.trials(f.EXP)) == 9


def test_a_compaction_leaves_the_files_of_an_open_analyst_snapshot(
    lake_env: dict[str, str],
) -> None:
    """Regression: compact deleted every replaced file at once (cleanup_all), so an analyst
    whose transaction began before a writer's flush failed reading a file that was gone."""
    store = Store(paths())
    assert isinstance(store, LakeStore)
    store.put_many([f.trial(task=f"t{n}") for n in range(3)])
    store.compact()  # the rows in Parquet files: the next compaction merges (replaces) them
    analyst = duckdb.connect()
    analyst.execute(attach_sql(lake_env["HANGAR_STORE_CATALOG"], read_only=True))
    analyst.execute("BEGIN")
    read = "SELECT count(DISTINCT task) FROM trials"  # reads the files, not the catalog counts
    first = analyst.execute(read).fetchone()
    store.put_many([f.trial(task=f"t{n}") for n in range(3, 6)])
    live = (
        "SELECT path FROM __ducklake_metadata_hangar.ducklake_data_file WHERE end_snapshot IS NULL"
    )
    with store._db() as con:
        before = {p for (p,) in con.execute(live).fetchall()}
    store.compact()
    with store._db() as con:
        after = {p for (p,) in con.execute(live).fetchall()}
    assert before - after, "the compaction replaced no file: the test would show nothing"
    assert analyst.execute(read).fetchone() == first == (3,)
    analyst.execute("COMMIT")
    assert analyst.execute(read).fetchone() == (6,)
