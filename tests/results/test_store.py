"""Store: round trips, the highest-attempt rule, immutability, healing and concurrent writers."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import duckdb
import factories as f
import pytest

from hangar_dagster.results.store import (
    STALE_MARKER_S,
    DuplicateRecordError,
    EmbeddedStore,
    Store,
)

pytestmark = pytest.mark.unit


def _duck_rows(store: Store, sql: str) -> list[tuple[object, ...]]:
    con = duckdb.connect(str(store.paths.duckdb), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_every_record_type_round_trips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    exp, pin, check = f.experiment(), f.pin_set(), f.base_check()
    trial, grade, note = f.trial(), f.grade(), f.note()
    for rec in (exp, pin, f.experiment_pin(), check, trial, grade, note):
        store.put(rec)

    assert store.experiment(f.EXP) == exp
    assert store.experiment("nope") is None
    assert store.pins(f.EXP) == {"base": pin}
    assert store.base_checks(f.EXP) == {"t1": check}
    assert store.trials(f.EXP) == [trial]
    assert store.grades(f.EXP) == [grade]
    assert store.notes(f.EXP) == [note]
    # JSON and timestamp columns have their documented DuckDB types
    types = {
        r[0]: r[1]
        for r in _duck_rows(
            store,
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_name = 'trials'",
        )
    }
    assert types["trace"] == "JSON" and types["started_at"] == "TIMESTAMP WITH TIME ZONE"
    # and each record is one Parquet file under the documented layout
    parquet = store.paths.parquet
    assert (parquet / "trials/experiment_id=exp-0001/base.t1.1.attempt-1.parquet").is_file()
    assert (parquet / f"pin_sets/{pin.pin_set}.parquet").is_file()


def test_find_experiment_by_id_or_latest_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    store.put(f.experiment(experiment_id="exp-old"))
    store.put(f.experiment(experiment_id="exp-new", submitted_at=f.T0.replace(year=2026)))
    store.put(f.experiment(experiment_id="exp-other", name="other"))
    found = store.find_experiment("skill-vs-none")
    assert found is not None and found.experiment_id == "exp-new"
    by_id = store.find_experiment("exp-old")
    assert by_id is not None and by_id.experiment_id == "exp-old"
    assert store.find_experiment("missing") is None


def test_highest_attempt_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    assert store.next_attempt(f.EXP, "base/t1/1") == 1
    first = f.trial(
        attempt=1,
        outcome_class="infra_error",
        infra_reason="preempted",
        verify_passed=None,
        cost_usd=0.1,
    )
    store.put(first)
    assert store.next_attempt(f.EXP, "base/t1/1") == 2
    second = f.trial(attempt=2, retry_of=first.run_id)
    store.put(second)
    store.put(f.grade(attempt=2, passed=True))
    assert store.next_attempt(f.EXP, "base/t1/1") == 3
    assert store.next_attempt(f.EXP, "base/t2/1") == 1

    assert store.trials(f.EXP) == [second]
    assert store.trials(f.EXP, all_attempts=True) == [first, second]
    [row] = store.index(f.EXP)
    assert (row["attempt"], row["run_id"], row["retry_of"]) == (2, second.run_id, first.run_id)
    assert row["outcome_class"] == "completed" and row["passed"] is True
    assert row["hidden_total"] == 3 and row["hidden_tests"]["passed"] == 3
    assert row["tamper_signals"] == []


def test_summary_leaves_invalid_tasks_out_of_the_pass_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    # t1's hidden tests pass on the base: its "pass" says nothing about the agent.
    store.put(
        f.base_check("t1", base_passed=True, invalid=True, reason="hidden tests pass on base")
    )
    store.put(f.trial("base", "t1"))
    store.put(f.grade("base", "t1", passed=True, task_invalid=True))
    store.put(f.trial("base", "t2"))
    store.put(f.grade("base", "t2", passed=False))
    (row,) = store.summary(f.EXP)
    assert (row["trials"], row["graded"], row["passed"], row["invalid_task"]) == (2, 1, 0, 1)
    assert row["pass_rate_pts"] == 0.0


def test_summary_excludes_infra_errors_from_the_denominator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    # base: t1 passes, t2's only attempt so far is an infra error
    store.put(f.trial("base", "t1"))
    store.put(f.grade("base", "t1", passed=True))
    store.put(f.trial("base", "t2", outcome_class="infra_error", infra_reason="rate_limit"))
    # skill: 1 of 3 passes; t1 passed on attempt 1 but attempt 2 (which counts) failed
    store.put(f.trial("skill", "t1", attempt=1))
    store.put(f.grade("skill", "t1", attempt=1, passed=True))
    store.put(f.trial("skill", "t1", attempt=2))
    store.put(f.grade("skill", "t1", attempt=2, passed=False))
    store.put(f.trial("skill", "t2", outcome_class="empty_patch"))
    store.put(f.grade("skill", "t2", passed=False))
    store.put(f.trial("skill", "t3"))
    store.put(f.grade("skill", "t3", passed=True))
    # down: nothing but infra errors, so no pass rate at all
    store.put(f.trial("down", "t1", outcome_class="infra_error", infra_reason="sandbox"))

    base, down, skill = store.summary(f.EXP)
    assert (down["trials"], down["graded"], down["pass_rate_pts"]) == (1, 0, None)
    assert base == {
        "variant": "base",
        "trials": 2,
        "passed": 1,
        "graded": 1,
        "pass_rate_pts": 100.0,
        "invalid_task": 0,
        "execution_failures": 1,
        "evidence_failures": 0,
        "admissible": 1,
        "completed": 1,
        "empty_patch": 0,
        "agent_error": 0,
        "timeout": 0,
        "budget_exceeded": 0,
        "infra_error": 1,
        "flagged_passes": 0,
    }
    assert (skill["trials"], skill["passed"], skill["graded"]) == (3, 1, 3)
    assert skill["pass_rate_pts"] == 33.3
    assert (skill["completed"], skill["empty_patch"]) == (2, 1)
    counted = [(g.variant, g.task, g.attempt) for g in store.grades(f.EXP)]
    assert ("skill", "t1", 2) in counted and ("skill", "t1", 1) not in counted
    assert len(store.grades(f.EXP, all_attempts=True)) == 5


def test_duplicate_attempt_is_refused_and_the_first_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    store.put(f.trial(cost_usd=0.25))
    store.put(f.grade(passed=True))
    store.put(f.experiment())
    with pytest.raises(DuplicateRecordError, match="trials already holds .*next_attempt"):
        store.put(f.trial(cost_usd=9.0))
    with pytest.raises(DuplicateRecordError, match="grades"):
        store.put(f.grade(passed=False))
    with pytest.raises(DuplicateRecordError, match="experiments"):
        store.put(f.experiment())
    assert [t.cost_usd for t in store.trials(f.EXP, all_attempts=True)] == [0.25]
    assert [g.passed for g in store.grades(f.EXP, all_attempts=True)] == [True]
    leftovers = [p.name for p in store.paths.parquet.rglob("*") if ".tmp-" in p.name]
    assert leftovers == []


def test_a_batch_stores_each_record_whole_through_one_duckdb_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    store.put(f.trial("base", "t2"))  # the batch's third record repeats this key
    opened: list[str] = []
    connect = duckdb.connect
    monkeypatch.setattr(duckdb, "connect", lambda *a, **kw: opened.append("x") or connect(*a, **kw))
    with_tests = f.graded("skill", "t1", tests=2)
    batch = [with_tests, f.trial("skill"), f.trial("base", "t2", cost_usd=9.0), f.trial("late")]
    with pytest.raises(DuplicateRecordError, match="trials already holds"):
        store.put_many(list(batch))
    assert opened == ["x"], "the stored records' rows went in through one connection"
    monkeypatch.setattr(duckdb, "connect", connect)
    # what preceded the refused record is stored whole (its per-test rows too); nothing after
    assert sorted(t.trial_key for t in store.trials(f.EXP)) == ["base/t2/1", "skill/t1/1"]
    assert [t.cost_usd for t in store.trials(f.EXP) if t.task == "t2"] != [9.0]
    assert [g.trial_key for g in store.grades(f.EXP)] == ["skill/t1/1"]
    assert len(store.grade_tests(f.EXP)) == 2
    assert list(store.paths.pending.iterdir()) == [], "no journal marker left behind"
    assert _duck_rows(store, "SELECT count(*) FROM trials") == [(2,)]


def test_a_refused_record_in_a_batch_is_the_error_raised_even_when_the_insert_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    store.put(f.trial("base", "t2"))

    def broken(*_a: object) -> None:
        raise RuntimeError("the insert failed")

    insert = EmbeddedStore._insert
    monkeypatch.setattr(EmbeddedStore, "_insert", staticmethod(broken))
    with pytest.raises(DuplicateRecordError):  # the refusal, which a caller acts on
        store.put_many([f.trial("skill"), f.trial("base", "t2", cost_usd=9.0)])
    monkeypatch.setattr(EmbeddedStore, "_insert", staticmethod(insert))
    # the record before it has its file and journal marker: the next read brings it in
    assert sorted(t.trial_key for t in Store(store.paths).trials(f.EXP)) == [
        "base/t2/1",
        "skill/t1/1",
    ]


def test_rows_behind_stores_the_slots_puts_through_one_duckdb_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    store.put(f.trial("base", "t2"))
    assert store.next_attempt(f.EXP, "base/t2/1") == 2  # the tally is built, as a start reads it
    opened: list[str] = []
    connect = duckdb.connect
    monkeypatch.setattr(duckdb, "connect", lambda *a, **kw: opened.append("x") or connect(*a, **kw))

    def slot(variant: str) -> None:  # a trial, then its grade with per-test rows
        store.put(f.trial(variant))
        store.put_many([f.graded(variant, "t1", tests=2)])

    with store.rows_behind(every_s=600):  # the committer does not wake: the end commits
        slots = [threading.Thread(target=slot, args=(v,)) for v in ("skill", "late")]
        for t in slots:
            t.start()
        for t in slots:
            t.join()
        # each file, journal marker and tally row is there at once: a crash now loses nothing
        assert store.next_attempt(f.EXP, "skill/t1/1") == 2
        assert len(list(store.paths.pending.iterdir())) == 6
        assert opened == [], "no DuckDB connection before the block ends"
        with pytest.raises(DuplicateRecordError):  # a refusal is still raised at once
            store.put(f.trial("base", "t2"))
    assert opened == ["x"], "the block's rows went in through one connection"
    monkeypatch.setattr(duckdb, "connect", connect)
    assert list(store.paths.pending.iterdir()) == [], "no journal marker left behind"
    assert _duck_rows(store, "SELECT count(*) FROM trials") == [(3,)]
    assert [g.trial_key for g in store.grades(f.EXP)] == ["late/t1/1", "skill/t1/1"]
    assert len(store.grade_tests(f.EXP)) == 4


def test_a_read_inside_rows_behind_sees_the_rows_not_yet_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    seen: list[list[str]] = []
    with store.rows_behind(every_s=600):
        store.put(f.trial("skill"))
        # another thread's read (the progress line, a start) finds it through its marker
        reader = threading.Thread(
            target=lambda: seen.append([t.trial_key for t in Store(store.paths).trials(f.EXP)])
        )
        reader.start()
        reader.join()
        store.put(f.grade("skill", "t1"))
    assert seen == [["skill/t1/1"]]
    assert [g.trial_key for g in store.grades(f.EXP)] == ["skill/t1/1"]
    assert _duck_rows(store, "SELECT count(*) FROM trials") == [(1,)]
    assert list(store.paths.pending.iterdir()) == []


def _killed_after_one_trial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> Store:
    """A store holding one trial, after ``script`` (given the home) was killed storing another."""
    store = f.make_store(tmp_path, monkeypatch)
    store.put(f.trial())
    here = str(Path(__file__).parents[1])
    died = subprocess.run(
        [sys.executable, "-c", script, str(store.paths.home), here],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert died.returncode == 9, died.stderr
    return store


_DIES_INSIDE_ROWS_BEHIND = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, sys.argv[2])
    import factories as f
    from pathlib import Path
    from hangar_dagster.results.store import Store
    from hangar_dagster.settings import HangarPaths
    store = Store(HangarPaths(Path(sys.argv[1])))
    with store.rows_behind(every_s=600):
        store.put(f.trial("skill"))
        os._exit(9)  # killed while its grade runs: the block never ends
""")


def test_a_crash_inside_rows_behind_loses_no_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _killed_after_one_trial(tmp_path, monkeypatch, _DIES_INSIDE_ROWS_BEHIND)
    assert _duck_rows(store, "SELECT count(*) FROM trials") == [(1,)]
    assert store.next_attempt(f.EXP, "skill/t1/1") == 2
    assert [t.variant for t in Store(store.paths).trials(f.EXP)] == ["base", "skill"]
    assert list(store.paths.pending.iterdir()) == []


def test_trial_key_must_match_its_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    with pytest.raises(ValueError, match="trial_key is 'base/t9/1' but .* 'base/t1/1'"):
        store.put(f.trial(trial_key="base/t9/1"))
    assert not store.paths.parquet.exists() or not any(store.paths.parquet.rglob("*.parquet"))


def test_pin_sets_are_immutable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    pin = f.pin_set()
    store.put(pin)
    store.put(f.pin_set(created_at=f.T0.replace(year=2030)))  # same content, later: fine
    with pytest.raises(DuplicateRecordError, match="different model.*immutable"):
        store.put(f.pin_set(model="claude-opus-4-20250514"))
    store.put(f.experiment_pin())
    assert store.pins(f.EXP) == {"base": pin}  # the first created_at stays


def test_notes_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    store.put(f.note("retry cap reached", at=f.T0))
    store.put(f.note("retry cap reached", at=f.T0))
    store.put(f.note("earlier", at=f.T0.replace(year=2024)))
    assert [n.message for n in store.notes(f.EXP)] == ["earlier", *["retry cap reached"] * 2]


_HOLDER = textwrap.dedent("""
    import duckdb, sys
    con = duckdb.connect(sys.argv[1])  # an analyst's read-write session
    print("holding", flush=True)
    sys.stdin.read()
""")


def test_locked_duckdb_heals_from_parquet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = f.make_store(tmp_path, monkeypatch, lock_timeout_s=0.5)
    store.put(f.experiment())
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(store.paths.duckdb)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        with caplog.at_level(logging.WARNING, logger="hangar_dagster.results.store"):
            store.put(f.trial())  # must not raise
        assert "Parquet only" in caplog.text
        # reads still answer, from the Parquet files
        assert [t.trial_key for t in store.trials(f.EXP)] == ["base/t1/1"]
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    assert _duck_rows(store, "SELECT count(*) FROM trials") == [(0,)]
    assert store.sync() == 1
    assert store.sync() == 0  # idempotent
    assert _duck_rows(store, "SELECT trial_key, attempt FROM trials") == [("base/t1/1", 1)]


def test_a_journal_marker_caught_before_its_text_is_left_to_its_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A start check beside a slot's put once saw the marker between its creation and its
    # text: it read the empty name as the whole Parquet tree (pyarrow: "Unable to merge").
    store = f.make_store(tmp_path, monkeypatch)
    store.put(f.trial())
    caught = store.paths.pending / "0123abcd.trials"
    caught.write_text("")
    assert store.start_state(f.EXP, 1).open_counted == 0
    assert store.next_attempt(f.EXP, "base/t1/1") == 2
    assert [t.trial_key for t in Store(store.paths).trials(f.EXP)] == ["base/t1/1"]
    assert caught.exists(), "its writer is still on it: the marker stays"


_DIES_BEFORE_DUCKDB = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, sys.argv[2])
    import factories as f
    from pathlib import Path
    from hangar_dagster.results.store import EmbeddedStore, Store
    from hangar_dagster.settings import HangarPaths
    # the process dies right after the Parquet file is linked, before its DuckDB row
    EmbeddedStore._insert = staticmethod(lambda *a: os._exit(9))
    Store(HangarPaths(Path(sys.argv[1]))).put(f.trial("skill"))
""")


def test_a_crash_between_parquet_and_duckdb_heals_on_the_next_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _killed_after_one_trial(tmp_path, monkeypatch, _DIES_BEFORE_DUCKDB)
    assert _duck_rows(store, "SELECT count(*) FROM trials") == [(1,)]
    assert len(list(store.paths.pending.iterdir())) == 1, "its journal marker stays"
    assert store.next_attempt(f.EXP, "skill/t1/1") == 2
    assert [t.variant for t in Store(store.paths).trials(f.EXP)] == ["base", "skill"]
    assert _duck_rows(store, "SELECT count(*) FROM trials") == [(2,)]
    assert list(store.paths.pending.iterdir()) == []
    # a deleted database is rebuilt from Parquet as a whole, by the next read or a sync
    store.paths.duckdb.unlink()
    assert [t.variant for t in Store(store.paths).trials(f.EXP)] == ["base", "skill"]
    store.paths.duckdb.unlink()
    assert Store(store.paths).sync() == 2


def test_a_slots_put_flushes_its_journal_entry_and_the_commit_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A slot's put flushed four times (marker, journal folder, Parquet file, its folder): the
    # journal entry is the record's file now, and its folder is flushed once per commit.
    store = f.make_store(tmp_path, monkeypatch)
    store.put(f.experiment())
    flushed: list[tuple[str, int]] = []
    fsync = os.fsync

    def counted(fd: int) -> None:
        entries = len(list(store.paths.pending.iterdir()))
        flushed.append((os.readlink(f"/proc/self/fd/{fd}"), entries))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", counted)
    pending = str(store.paths.pending)
    with store.rows_behind(every_s=600):
        store.put(f.trial("skill"))
        assert [Path(p).parent.as_posix() for p, _ in flushed] == [
            pending,
            str(tmp_path / "hangar"),
        ]
        assert flushed[1][0] == pending
        del flushed[:]
    # the record's folder on disk while its journal entry is still there, then the entry gone
    folder = store.paths.parquet / "trials" / f"experiment_id={f.EXP}"
    assert flushed == [(str(folder), 1)]
    assert list(store.paths.pending.iterdir()) == []
    assert [t.variant for t in store.trials(f.EXP)] == ["skill"]


_DIES_BEFORE_THE_LINK = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, sys.argv[2])
    import factories as f
    from pathlib import Path
    from hangar_dagster.results.store import EmbeddedStore, Store
    from hangar_dagster.settings import HangarPaths
    # the journal entry is on disk, the file not yet linked into parquet/
    EmbeddedStore._link = lambda *a: os._exit(9)
    Store(HangarPaths(Path(sys.argv[1]))).put(f.trial("skill", cost_usd=0.5))
""")


def test_a_crash_between_the_journal_entry_and_its_link_heals_on_the_next_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _killed_after_one_trial(tmp_path, monkeypatch, _DIES_BEFORE_THE_LINK)
    [entry] = store.paths.pending.iterdir()
    placed = (
        store.paths.parquet / "trials" / f"experiment_id={f.EXP}" / "skill.t1.1.attempt-1.parquet"
    )
    assert not placed.exists()
    # the start check's heal links and tallies it; the next read brings its row in
    assert store.next_attempt(f.EXP, "skill/t1/1") == 2
    assert placed.is_file()
    assert [(t.variant, t.cost_usd) for t in Store(store.paths).trials(f.EXP)] == [
        ("base", f.trial().cost_usd),
        ("skill", 0.5),
    ]
    assert not entry.exists()
    store.paths.duckdb.unlink()  # and it is in the Parquet truth: a new database has it
    assert Store(store.paths).sync() == 2


_DIES_WRITING_THE_ENTRY = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, sys.argv[2])
    import factories as f
    from pathlib import Path
    from hangar_dagster.results.store import Store
    from hangar_dagster.settings import HangarPaths
    # the entry written and flushed under its temporary name, not renamed into the journal
    os.rename = lambda *a: os._exit(9)
    Store(HangarPaths(Path(sys.argv[1]))).put(f.trial("skill"))
""")


def test_a_crash_writing_the_journal_entry_stores_nothing_and_its_leftover_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _killed_after_one_trial(tmp_path, monkeypatch, _DIES_WRITING_THE_ENTRY)
    [left] = store.paths.pending.iterdir()
    assert left.name.startswith(".") and left.name.endswith(".trials.tmp")
    # put never returned: nothing is stored, and no reader takes the half-made entry
    assert store.next_attempt(f.EXP, "skill/t1/1") == 1
    assert [t.variant for t in Store(store.paths).trials(f.EXP)] == ["base"]
    assert left.exists(), "a writer may still be on it"
    old = left.stat().st_mtime - STALE_MARKER_S - 1
    os.utime(left, (old, old))
    assert [t.variant for t in Store(store.paths).trials(f.EXP)] == ["base"]
    assert list(store.paths.pending.iterdir()) == [], "a dead writer's leftover is dropped"


_DIES_REFUSED = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, sys.argv[2])
    import factories as f
    from pathlib import Path
    from hangar_dagster.results.store import EmbeddedStore, Store
    from hangar_dagster.settings import HangarPaths
    # a second write of the stored key, killed as it is refused, before its entry is dropped
    EmbeddedStore._check_duplicate = lambda *a: os._exit(9)
    Store(HangarPaths(Path(sys.argv[1]))).put(f.trial(cost_usd=9.0))
""")


def test_the_journal_entry_of_a_refused_record_is_dropped_and_the_stored_one_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _killed_after_one_trial(tmp_path, monkeypatch, _DIES_REFUSED)
    assert len(list(store.paths.pending.iterdir())) == 1
    assert [t.cost_usd for t in Store(store.paths).trials(f.EXP)] == [f.trial().cost_usd]
    assert store.next_attempt(f.EXP, "base/t1/1") == 2
    assert list(store.paths.pending.iterdir()) == []
    store.paths.duckdb.unlink()
    assert [t.cost_usd for t in Store(store.paths).trials(f.EXP)] == [f.trial().cost_usd]


def test_a_reader_links_a_slow_writers_entry_and_the_writer_still_stores_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    store.put(f.trial())
    seen: list[list[str]] = []
    link = EmbeddedStore._link

    def slow(self: EmbeddedStore, *a: Any) -> Path:
        # between the writer's entry and its link, another store reads: it links the entry,
        # brings the row in and removes the entry
        seen.append([t.variant for t in Store(store.paths).trials(f.EXP)])
        assert list(store.paths.pending.iterdir()) == []
        return link(self, *a)

    monkeypatch.setattr(EmbeddedStore, "_link", slow)
    store.put(f.trial("skill"))  # not refused: the file in its place is its own
    monkeypatch.setattr(EmbeddedStore, "_link", link)
    assert seen == [["base", "skill"]]
    assert [t.variant for t in store.trials(f.EXP)] == ["base", "skill"]
    assert store.next_attempt(f.EXP, "skill/t1/1") == 2
    assert list(store.paths.pending.iterdir()) == []
    with pytest.raises(DuplicateRecordError):
        store.put(f.trial("skill"))


def test_reads_do_not_list_the_parquet_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    for task in ("t1", "t2", "t3"):
        store.put(f.trial("base", task))
        store.put(f.grade("base", task))
    store.put(f.experiment())

    def listed(self: Path, *args: object, **kwargs: object) -> None:
        raise AssertionError(f"a read listed {self}")

    monkeypatch.setattr(Path, "glob", listed)
    monkeypatch.setattr(Path, "rglob", listed)
    monkeypatch.setattr(EmbeddedStore, "_sync_table", listed)
    fresh = Store(store.paths)
    assert len(fresh.trials(f.EXP)) == 3 and len(fresh.index(f.EXP)) == 3
    assert fresh.summary(f.EXP)[0]["graded"] == 3
    assert fresh.next_attempt(f.EXP, "base/t1/1") == 2
    assert fresh.month_spend("2025-01") is not None


def test_eight_threads_write_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = f.make_store(tmp_path, monkeypatch, lock_timeout_s=120)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            own = Store(store.paths, lock_timeout_s=120)  # separate instances share the locks
            for task in ("t1", "t2"):
                own.put(f.trial(f"v{n}", task))
                own.put(f.grade(f"v{n}", task, passed=n % 2 == 0))
        except BaseException as e:  # reported below: a thread's exception is otherwise lost
            errors.append(e)

    with caplog.at_level(logging.WARNING):
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert caplog.records == []  # every row reached DuckDB directly
    assert _duck_rows(store, "SELECT count(*) FROM trials") == [(16,)]
    assert _duck_rows(store, "SELECT count(*) FROM grades") == [(16,)]
    assert store.sync() == 0
    assert sum(r["passed"] for r in store.summary(f.EXP)) == 8


_WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    import factories as f
    from hangar_dagster.settings import HangarPaths
    from hangar_dagster.results.store import Store
    from pathlib import Path
    store = Store(HangarPaths(Path(sys.argv[1])), lock_timeout_s=120)
    for rep in range(1, 6):
        store.put(f.trial(sys.argv[3], "t1", rep))
""")


def test_two_processes_write_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    here = str(Path(__file__).parents[1])  # tests/, where factories.py lives
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(store.paths.home), here, v],
            stderr=subprocess.PIPE,
            text=True,
        )
        for v in ("base", "skill")
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "Parquet only" not in err
    assert _duck_rows(store, "SELECT variant, count(*) FROM trials GROUP BY ALL ORDER BY 1") == [
        ("base", 5),
        ("skill", 5),
    ]


def test_an_experiments_first_folder_made_by_another_writer_between_link_and_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writers of an experiment's first records: this one's link fails (no folder yet),
    another makes the folder before this one looks. The failure was then read as "the entry is
    gone" and the put raised FileNotFoundError (test_eight_threads_write_at_once, now and then)."""
    store = f.make_store(tmp_path, monkeypatch)
    real_link = os.link
    calls: list[str] = []

    def link_then_folder_appears(src: Any, dst: Any) -> None:
        calls.append(str(dst))
        if len(calls) == 1:
            try:
                real_link(src, dst)
            finally:
                Path(dst).parent.mkdir(parents=True, exist_ok=True)  # the other writer's mkdir
        real_link(src, dst)

    monkeypatch.setattr(os, "link", link_then_folder_appears)
    store.put(f.trial("v1", "t1"))
    assert len(calls) == 2  # the first failed for the folder, the second linked
    assert [t.trial_key for t in store.trials(f.EXP)] == ["v1/t1/1"]
