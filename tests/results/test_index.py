"""experiment_index is a stored table (docs/data.md, "experiment_index: a table kept current"):
every put of a trial, grade or base check keeps its rows what the plain definition says (a
retried attempt replaces the earlier one, a grade fills its columns, a base check stored late
marks the task invalid), in the same transaction as the record's row, whatever order the records
arrive in; a crash between the writes loses no finished trial and shows no half-written row; a
sync (a deleted database, an older one whose index was a view) rebuilds it from Parquet."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import duckdb
import factories as f
import pytest
from test_views import PLAIN_INDEX, _dicts, _mix

from hangar_dagster.results import store as store_module
from hangar_dagster.results.records import Record
from hangar_dagster.results.store import EmbeddedStore, Store

pytestmark = pytest.mark.unit

ORDER = "ORDER BY experiment_id, trial_key"


def _tables(store: Store) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the stored index, the plain definition over the stored tables), as DuckDB has them."""
    con = duckdb.connect(str(store.paths.duckdb), read_only=True)
    try:
        return (
            _dicts(con, f"SELECT * FROM experiment_index {ORDER}"),
            _dicts(con, f"SELECT * FROM ({PLAIN_INDEX}) {ORDER}"),
        )
    finally:
        con.close()


def assert_current(store: Store) -> list[dict[str, Any]]:
    index, plain = _tables(store)
    assert index == plain
    return index


def test_each_put_keeps_the_index_current(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    store.put(f.trial(attempt=1, outcome_class="infra_error", infra_reason="preempted"))
    [row] = assert_current(store)
    assert (row["attempt"], row["outcome_class"], row["passed"]) == (1, "infra_error", None)
    # the retry replaces the attempt that counted: one row per key
    store.put(f.trial(attempt=2, retry_of="run-1"))
    [row] = assert_current(store)
    assert (row["attempt"], row["outcome_class"], row["passed"]) == (2, "completed", None)
    # its grade fills the grade's columns
    store.put(f.grade(attempt=2, passed=True, tamper_signals=["conftest.py"]))
    [row] = assert_current(store)
    assert (row["passed"], row["hidden_total"]) == (True, 3)
    assert row["tamper_signals"] == '["conftest.py"]'
    assert row["task_invalid"] is False
    # a base check stored after the grade, finding the task invalid, counts
    store.put(f.base_check("t1", invalid=True, reason="passes on base"))
    [row] = assert_current(store)
    assert row["task_invalid"] is True
    # a regrade's grade and a reused trial show as the plain definition shows them
    origin = {"experiment_id": "exp-0", "trial_key": "base/t1/1", "attempt": 1}
    regrade = origin | {"grader_digest": "g"}
    store.put(f.trial("reused", reused_from=origin))
    store.put(f.grade("reused", regrade_of=regrade))
    rows = {r["trial_key"]: r for r in assert_current(store)}
    assert rows["reused/t1/1"]["reused_from"] and rows["reused/t1/1"]["regrade_of"]


@pytest.mark.parametrize("seed", [1, 2])
def test_records_in_any_order_and_batches_leave_the_plain_definition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    records = _mix(seed)
    random.Random(seed).shuffle(records)  # a grade before its trial, a late retry, a late check
    store = f.make_store(tmp_path, monkeypatch)
    i = 0
    while i < len(records):
        n = random.Random(seed + i).choice([1, 1, 7])
        batch: list[Record] = records[i : i + n]
        store.put_many(batch) if n > 1 else store.put(batch[0])
        i += n
        if i % 20 < n:
            assert_current(store)
    index = assert_current(store)
    assert len(index) == 2 * 3 * 6 * 2
    assert {r["attempt"] for r in index} > {1}


def test_a_failed_index_write_leaves_no_half_written_row_and_the_next_read_heals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    store.put(f.trial())
    refresh = store_module._refresh_index

    def dies(*_a: object) -> None:
        raise RuntimeError("killed between the row and its index row")

    monkeypatch.setattr(store_module, "_refresh_index", dies)
    with pytest.raises(RuntimeError, match="killed"):
        store.put(f.trial(attempt=2))
    monkeypatch.setattr(store_module, "_refresh_index", refresh)
    con = duckdb.connect(str(store.paths.duckdb), read_only=True)
    # the trial's row went with its index row: neither shows
    assert con.execute("SELECT max(attempt) FROM trials").fetchall() == [(1,)]
    assert con.execute("SELECT attempt FROM experiment_index").fetchall() == [(1,)]
    con.close()
    assert len(list(store.paths.pending.iterdir())) == 1, "its journal marker stays"
    # the next read brings the file in, its index row with it
    assert [r["attempt"] for r in Store(store.paths).index(f.EXP)] == [2]
    assert assert_current(store)[0]["attempt"] == 2


def test_a_crash_before_duckdb_is_healed_into_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    store.put(f.trial())
    # the process dies after the grade's Parquet file, before its DuckDB transaction
    monkeypatch.setattr(EmbeddedStore, "_commit", lambda self, staged: None)
    store.put(f.grade(passed=True))
    monkeypatch.undo()
    assert _tables(store)[0][0]["passed"] is None  # not in DuckDB yet
    assert Store(store.paths).index(f.EXP)[0]["passed"] is True
    assert assert_current(store)[0]["passed"] is True


def test_a_sync_rebuilds_the_index_from_parquet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    store.put_many(_mix(3))
    before = assert_current(store)
    # a deleted database: the next read fills it from Parquet, its index with it
    store.paths.duckdb.unlink()
    assert len(Store(store.paths).index("exp-a")) == len(before) // 2
    assert assert_current(store) == before
    # an index row lost by hand comes back with sync, as a table's row does
    con = duckdb.connect(str(store.paths.duckdb))
    con.execute("DELETE FROM experiment_index WHERE trial_key LIKE 'v1/%'")
    con.close()
    Store(store.paths).sync()
    assert assert_current(store) == before
    # a database an older hangar made, its index a view: the next store makes the table
    con = duckdb.connect(str(store.paths.duckdb))
    con.execute("DROP TABLE experiment_index")
    con.execute("CREATE VIEW experiment_index AS SELECT 1 AS stale")
    con.close()
    assert len(Store(store.paths).index("exp-b")) == len(before) // 2
    assert assert_current(store) == before


def test_keys_are_sql_literals_quoted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The refresh names its keys as literals (so the engines prune by them): a quote in an id
    is one more character, not the end of a string."""
    store = f.make_store(tmp_path, monkeypatch)
    eid = "exp-o'brien"
    store.put(f.trial(experiment_id=eid))
    store.put(f.grade(experiment_id=eid, passed=False))
    [row] = store.index(eid)
    assert row["passed"] is False
    assert assert_current(store)[0]["experiment_id"] == eid
