"""The embedded store's compaction (results/compaction.py): small files merged into parts, every
row kept once, readable by plain hive readers, the write-once rule kept for compacted keys, and a
compaction killed at any step losing nothing, duplicating nothing and showing nothing half."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import duckdb
import factories as f
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from hangar_dagster.results import compaction
from hangar_dagster.results.records import Record
from hangar_dagster.results.schema import BY_NAME
from hangar_dagster.results.store import DuplicateRecordError, Store
from hangar_dagster.settings import HangarPaths

pytestmark = pytest.mark.unit

OTHER = "exp-0002"


def _records() -> list[Record]:
    out: list[Record] = [f.experiment(), f.experiment(experiment_id=OTHER, author="bo")]
    for eid, keys in ((f.EXP, 6), (OTHER, 3)):
        for k in range(keys):
            variant, task = f"v{k % 2}", f"t{k}"
            out.append(f.trial(variant, task, experiment_id=eid, cost_usd=0.1 * k))
            out.append(f.graded(variant, task, experiment_id=eid))
        out += [f.note(f"note {n} of {eid}", experiment_id=eid) for n in (1, 2)]
    # a retried key: attempt 1 an infra error, attempt 2 graded
    out.append(
        f.trial("v0", "t0", attempt=2, experiment_id=f.EXP, retry_of="run-t-v0-t0-1")
    )  # attempt 2 of v0/t0/1
    out.append(f.graded("v0", "t0", attempt=2))
    return out


@pytest.fixture(scope="module")
def small_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home holding two experiments' trials, grades (with per-test rows) and notes, one small
    file each, written once through Store.put; tests copy it."""
    home = tmp_path_factory.mktemp("compaction") / "hangar"
    store = Store(HangarPaths(home))
    for record in _records():
        store.put(record)
    return home


def _copy(small_home: Path, tmp_path: Path) -> Store:
    shutil.copytree(small_home, tmp_path / "hangar")
    return Store(HangarPaths(tmp_path / "hangar"))


def _everything(store: Store) -> dict[str, Any]:
    return {
        eid: (
            store.trials(eid, all_attempts=True),
            store.grades(eid, all_attempts=True),
            store.grade_tests(eid),
            store.notes(eid),
            store.index(eid),
            store.summary(eid),
        )
        for eid in (f.EXP, OTHER)
    }


KEYS = {
    "trials": ("experiment_id", "trial_key", "attempt"),
    "grades": ("experiment_id", "trial_key", "attempt"),
    "grade_tests": ("experiment_id", "trial_key", "attempt", "test_id"),
    "notes": ("note_id",),
}


def _files(store: Store, table: str) -> list[Path]:
    return sorted((store.paths.parquet / table).glob("*/*.parquet"))


def _keys_on_disk(store: Store, table: str) -> list[tuple[Any, ...]]:
    """Every row's key in the table's Parquet files, as a glob reader sees them (repeats kept);
    each file must read whole (nothing half-visible)."""
    out = []
    for path in _files(store, table):
        for row in pq.read_table(path, columns=list(KEYS[table])).to_pylist():
            out.append(tuple(row.values()))
    return sorted(out)


def test_a_compaction_merges_small_files_and_keeps_every_row_once(
    small_home: Path, tmp_path: Path
) -> None:
    store = _copy(small_home, tmp_path)
    before = _everything(store)
    on_disk = {t: _keys_on_disk(store, t) for t in KEYS}
    small = sum(len(_files(store, t)) for t in KEYS)

    removed = store.compact()

    # one part per table and experiment: 4 tables x 2 experiments
    files = {t: _files(store, t) for t in KEYS}
    assert sum(len(v) for v in files.values()) == 8 and removed == small - 8
    assert all(p.name.startswith(compaction.PART_PREFIX) for v in files.values() for p in v)
    assert {t: _keys_on_disk(store, t) for t in KEYS} == on_disk, "every row, each once"
    assert _everything(store) == before
    # a database rebuilt from the files alone holds the same rows
    store.paths.duckdb.unlink()
    assert _everything(Store(store.paths)) == before
    # plain hive readers, no hangar: DuckDB and pyarrow see each trial once
    trials = store.paths.parquet / "trials"
    got = duckdb.sql(
        "SELECT experiment_id, count(*), count(DISTINCT (trial_key, attempt)) FROM "
        f"read_parquet('{trials}/*/*.parquet', hive_partitioning = true) GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert got == [(f.EXP, 7, 7), (OTHER, 3, 3)]
    table = ds.dataset(trials, format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 10
    # the write-once rule holds for a key whose file was compacted away
    with pytest.raises(DuplicateRecordError, match="trials already holds .*part@"):
        store.put(f.trial("v1", "t1", cost_usd=9.0))
    with pytest.raises(DuplicateRecordError, match="grade_tests already holds"):
        store.put(f.graded("v1", "t1"))
    assert not any(".tmp-" in p.name for p in store.paths.parquet.rglob("*"))
    assert _everything(store) == before
    # ... also once the registry of compacted keys is gone (rebuilt from the parts)
    for leftover in store.paths.home.glob("compacted.sqlite*"):
        leftover.unlink()
    with pytest.raises(DuplicateRecordError, match="trials already holds"):
        Store(store.paths).put(f.trial("v0", "t0", attempt=2, cost_usd=9.0))
    # a new record is a small file again, and its own key's next attempt is known
    store.put(f.trial("v1", "t1", attempt=2))
    assert store.next_attempt(f.EXP, "v1/t1/1") == 3
    assert len(_files(store, "trials")) == 3


def test_puts_keep_the_file_count_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compaction, "COMPACT_AT", 3)
    monkeypatch.setattr(compaction, "MAX_SMALL_PARTS", 2)
    store = f.make_store(tmp_path, monkeypatch)
    for n in range(1, 15):
        store.put(f.trial("v0", f"t{n}"))
        small = [p for p in _files(store, "trials") if compaction.is_small(p.name)]
        parts = [p for p in _files(store, "trials") if compaction.is_part(p.name)]
        assert len(small) < 3 and len(parts) <= 2, (n, small, parts)
    assert len(store.trials(f.EXP)) == 14
    assert len(_keys_on_disk(store, "trials")) == 14


_KILLED = textwrap.dedent("""
    import os, sys, pathlib
    from hangar_dagster.results import compaction
    from hangar_dagster.results.store import Store
    from hangar_dagster.settings import HangarPaths
    where = sys.argv[2]
    C = compaction.Compactor
    def die(*a, **kw):
        os._exit(9)
    if where == "before-journal":  # the part is written under its temporary name
        C._write_journal = die
    elif where == "before-link":  # the journal names it; not linked yet
        real_journal = C._write_journal
        def journal_then_die(self, j):
            real_journal(self, j)
            os._exit(9)
        C._write_journal = journal_then_die
    elif where == "before-register":  # linked: its rows are in the part and in the sources
        C._finish = die
    elif where == "mid-remove":  # registered; one source removed, the others not
        real_unlink, seen = pathlib.Path.unlink, []
        def unlink_once(self, missing_ok=False):
            if self.name.endswith(".parquet") and not self.name.startswith("part@"):
                if seen:
                    os._exit(9)
                seen.append(self)
            real_unlink(self, missing_ok=missing_ok)
        pathlib.Path.unlink = unlink_once
    Store(HangarPaths(pathlib.Path(sys.argv[1]))).compact()
    print("finished", flush=True)
""")


@pytest.mark.parametrize(
    "where", ["before-journal", "before-link", "before-register", "mid-remove"]
)
def test_a_compaction_killed_at_any_step_loses_nothing_and_duplicates_nothing(
    small_home: Path, tmp_path: Path, where: str
) -> None:
    store = _copy(small_home, tmp_path)
    before = _everything(store)
    on_disk = {t: _keys_on_disk(store, t) for t in KEYS}
    died = subprocess.run(
        [sys.executable, "-c", _KILLED, str(store.paths.home), where],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert died.returncode == 9, died.stdout + died.stderr
    # Right after the kill: every file reads whole, every row is in some file, and the store's
    # reads (DuckDB, or a database rebuilt from the files) hold each row once.
    for table, keys in on_disk.items():
        now = _keys_on_disk(store, table)
        assert set(now) == set(keys), f"{table}: nothing lost"
    assert _everything(store) == before
    store.paths.duckdb.unlink()
    assert _everything(Store(store.paths)) == before
    # The next write (or compaction) finishes or drops the killed one: each row in one file.
    fresh = Store(store.paths)
    fresh.put(f.note("after the kill"))
    assert not any((store.paths.home / "compacting").glob("*.json"))
    for table, keys in on_disk.items():
        if table != "notes":
            assert _keys_on_disk(store, table) == keys, f"{table}: nothing duplicated"
    assert len(_keys_on_disk(store, "notes")) == len(on_disk["notes"]) + 1
    with pytest.raises(DuplicateRecordError):
        fresh.put(f.trial("v1", "t1", cost_usd=9.0))
    fresh.compact()
    assert {t: _keys_on_disk(store, t) for t in ("trials", "grades", "grade_tests")} == {
        t: on_disk[t] for t in ("trials", "grades", "grade_tests")
    }
    assert sum(len(_files(store, t)) for t in KEYS) == 8
    assert _everything(Store(store.paths))[OTHER] == before[OTHER]


def test_files_still_settling_and_orphan_tests_stay_small(small_home: Path, tmp_path: Path) -> None:
    store = _copy(small_home, tmp_path)
    # per-test rows whose grade never came (a crash between the two writes)
    orphan = f.graded("v1", "t9")
    store._put_rows(BY_NAME["grade_tests"], orphan.tests)  # type: ignore[attr-defined]
    # a trial whose journal marker is still there (its DuckDB row not confirmed yet)
    marker = store.paths.pending / "0123.trials"
    relpath = BY_NAME["trials"].relpath(BY_NAME["trials"].to_row(f.trial("v0", "t0")))
    marker.write_text(relpath)
    store.compact()
    assert (store.paths.parquet / relpath).exists()
    tests_rel = BY_NAME["grade_tests"].relpath(BY_NAME["grades"].to_row(orphan))
    assert (store.paths.parquet / tests_rel).exists()
    marker.unlink()
    # the regrade replaces the orphans, as before compaction
    store.put(orphan)
    assert len(store.grade_tests(f.EXP, "v1/t9/1")) == 3
