"""The results store: one interface (``Store``), backends chosen by ``paths.store.mode``.

``Store(paths)`` builds the backend the settings name (``HANGAR_STORE``): ``embedded`` (this
module's ``EmbeddedStore``, the default) or ``ducklake`` (results/lake.py, many writers on
many machines). Every backend serves the same tables and views (results/schema.py), so the
read methods here are written once, in SQL.

The embedded backend: every record lands in one Parquet file (the truth) and in DuckDB.
``put`` writes a record's Parquet file atomically, then inserts the row into
DuckDB, with the ``experiment_index`` rows it changes, in one transaction; the tables that grow with the trials are compacted as they grow (results/compaction.py:
many records per file, the same crash rule). Should DuckDB be unreachable (an analyst holds it open read-write) or the
process die in between, the Parquet file is already there and ``sync`` brings the
row in; reads call a cheap check first, so they heal on their own. DuckDB is only
ever opened for a moment, under a thread lock and an ``flock`` on a lock file next
to it, so many threads and processes can share it. docs/data.md has the layout.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import importlib
import json
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from hangar_dagster.experiment.plan import TrialKey
from hangar_dagster.results import local
from hangar_dagster.results.compaction import Compactor
from hangar_dagster.results.records import (
    BaseCheckRecord,
    ExperimentRecord,
    GradeRecord,
    GradeTestRecord,
    NoteRecord,
    PinSetRecord,
    Record,
    TrialRecord,
)
from hangar_dagster.results.schema import (
    BY_MODEL,
    BY_NAME,
    INDEX_DDL,
    INDEX_DIGEST,
    INDEX_REBUILD,
    TABLES,
    VIEWS,
    Table,
    index_refresh,
    index_scope,
)
from hangar_dagster.results.tally import TABLES as TALLY_TABLES
from hangar_dagster.results.tally import (
    TRIAL_COLUMNS,
    Attempt,
    Cursor,
    StartState,
    TallySQL,
    trial_row,
)
from hangar_dagster.settings import HangarPaths
from hangar_dagster.util.background import while_running
from hangar_dagster.util.fs import fsync

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Record)
T = TypeVar("T")


class DuplicateRecordError(ValueError):
    """A record's key is already stored and the table does not allow replacing it."""


class StoreUnavailable(RuntimeError):
    """DuckDB stayed locked (by another process or thread) past the store's timeout."""


_THREAD_LOCKS: dict[Path, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


def _thread_lock(db: Path) -> threading.Lock:
    # one lock per database file for the whole process, however many Stores point at it
    with _THREAD_LOCKS_GUARD:
        return _THREAD_LOCKS.setdefault(db, threading.Lock())


_SQL = TallySQL(sqlite3.paramstyle)
# marker names whose rows this process already put in the tally (a marker stays while DuckDB is
# out of reach; each start check would otherwise read its file again)
_TALLIED: set[tuple[Path, str]] = set()
_TALLIED_GUARD = threading.Lock()


def _tally_db(path: Path) -> sqlite3.Connection:
    """This thread's connection to the tally's SQLite file, its tables made."""
    return local.sqlite(path, lambda cur, _new: _SQL.create(cur))


# A journal marker whose file never appeared (an older hangar's), or a journal entry cut off
# before it was whole, is dropped after this long (its writer died; a live writer finishes
# either within seconds).
STALE_MARKER_S = 600.0

BACKENDS: dict[str, str] = {
    "embedded": "hangar_dagster.results.store:EmbeddedStore",
    "ducklake": "hangar_dagster.results.lake:LakeStore",
}


def backend(mode: str) -> type[Store]:
    """The Store class registered as ``mode``; a clear error naming HANGAR_STORE if none."""
    target = BACKENDS.get(mode)
    if target is None:
        raise ValueError(
            f"HANGAR_STORE={mode!r} is not a results store backend; "
            f"known: {', '.join(sorted(BACKENDS))} (docs/data.md)"
        )
    module, name = target.split(":")
    cls = getattr(importlib.import_module(module), name)
    assert isinstance(cls, type) and issubclass(cls, Store)
    return cls


class Store:
    """hangar's records: ``put`` writes one, the other methods read (the same SQL everywhere).

    ``Store(paths)`` returns the backend ``paths.store.mode`` names (not an ABC: so that
    ``Store(paths)`` type-checks where callers build one).
    """

    paths: HangarPaths

    def __new__(cls, paths: HangarPaths, **kwargs: Any) -> Store:
        if cls is Store:
            cls = backend(paths.store.mode)
        return super().__new__(cls)

    def put(self, record: Record) -> None:
        """Write ``record`` whole; DuplicateRecordError when its table forbids a second write."""
        raise NotImplementedError  # each backend has its own

    def put_many(self, records: list[Record]) -> None:
        """``put`` each record; a backend may store them in fewer transactions (same rules)."""
        for record in records:
            self.put(record)

    @contextmanager
    def rows_behind(self) -> Iterator[None]:
        """Within the block, a ``put`` (from any thread) returns once its record is safe from a
        crash, and a backend may add its query rows behind it, batched, by the block's end
        (one whose ``put`` is already one short transaction stores as it goes)."""
        yield

    def _query(self, sql: str, params: list[Any]) -> list[dict[str, Any]]:
        """Rows of ``sql`` over the documented tables and views, JSON columns decoded."""
        raise NotImplementedError  # each backend has its own

    @contextmanager
    def _tally(self) -> Iterator[tuple[TallySQL, Cursor]]:
        """The tally (results/tally.py), level with every stored trial: the start check's reads."""
        raise NotImplementedError  # each backend has its own
        yield  # pragma: no cover

    def next_attempt(self, experiment_id: str, trial_key: str) -> int:
        """1 + the highest attempt stored for the key (1 if none); an index lookup."""
        with self._tally() as (sql, cur):
            return sql.next_attempt(cur, experiment_id, trial_key)

    def start_state(self, experiment_id: str, per_key: int) -> StartState:
        """What the outage breaker and the retry cap need (queue/starts.py ``blocker``);
        ``per_key`` is the retries a key may have (``HANGAR_TRIAL_INFRA_RETRIES``)."""
        with self._tally() as (sql, cur):
            return sql.start_state(cur, experiment_id, per_key)

    def open_infra(self, experiment_id: str, per_key: int) -> list[Attempt]:
        """The keys ``StartState.open_counted`` counts: their infra errors, oldest first."""
        with self._tally() as (sql, cur):
            return sql.open_infra(cur, experiment_id, per_key)

    def attempts(self, experiment_id: str) -> list[Attempt]:
        """Every trial attempt of the experiment, narrow (no trace or manifest)."""
        with self._tally() as (sql, cur):
            return sql.attempts(cur, experiment_id)

    def experiment_spent(self, experiment_id: str) -> float:
        """What the experiment's attempts cost so far, from the tally (``budget.max_cost_usd``)."""
        if not self._has_trials():
            return 0.0
        with self._tally() as (sql, cur):
            return sql.experiment_spend(cur, experiment_id)

    def spent_by_author(self, month: str) -> dict[str, float]:
        """Author -> what their experiments' attempts finished in ``month`` (UTC) cost, as the
        ``budget_ledger`` view counts it (an experiment with no stored record counts for nobody)."""
        if not self._has_trials():
            return {}  # answer without creating anything (a refused submit writes nothing)
        with self._tally() as (sql, cur):
            rows = sql.spend(cur, month)
        authors = {e: a for e, _, a in rows if a is not None}
        unknown = [e for e, _, a in rows if a is None]
        if unknown:
            # a crash between an experiment's record and its tally row: its record says
            found = [(e, r.author) for e in unknown if (r := self.experiment(e)) is not None]
            with self._tally() as (sql, cur):
                sql.apply_experiments(cur, found)
            authors.update(found)
        out: dict[str, float] = {}
        for experiment_id, spent, _ in rows:
            if experiment_id in authors:
                out[authors[experiment_id]] = out.get(authors[experiment_id], 0.0) + spent
        return out

    def rebuild_tally(self) -> None:
        """Drop the tally and fill it again from the stored trials and experiments."""
        raise NotImplementedError  # each backend has its own

    def sync(self) -> int:
        """Bring the queryable tables level with what was written; returns rows added."""
        raise NotImplementedError  # each backend has its own

    def compact(self) -> int:
        """Merge small Parquet files; returns how many files it removed."""
        raise NotImplementedError  # each backend has its own

    def _has_trials(self) -> bool:
        """Whether any trial attempt is stored, without creating anything."""
        raise NotImplementedError  # each backend has its own

    @staticmethod
    def check_trial_key(record: Record) -> None:
        if isinstance(record, TrialRecord | GradeRecord):
            expected = TrialKey(record.variant, record.task, record.replicate).key
            if record.trial_key != expected:
                raise ValueError(
                    f"{type(record).__name__}.trial_key is {record.trial_key!r} but variant/task/"
                    f"replicate say {expected!r}; build it with TrialKey(...).key"
                )

    @staticmethod
    def duplicate_error(table: Table, row: dict[str, Any], where: str) -> DuplicateRecordError:
        key = ", ".join(f"{k}={row[k]!r}" for k in table.key)
        return DuplicateRecordError(
            f"{table.name} already holds {key} ({where}); records are written once: "
            "a retry must use the next attempt (Store.next_attempt)"
        )

    @staticmethod
    def check_same_content(
        table: Table, stored_row: dict[str, Any], row: dict[str, Any], where: str
    ) -> None:
        """Allow a second write of a same_content key only if nothing but ``volatile`` moved."""
        stored, new = table.from_row(stored_row), table.from_row(row)
        differ = [
            f
            for f in table.model.model_fields
            if f not in table.volatile and getattr(stored, f) != getattr(new, f)
        ]
        if differ:
            key = ", ".join(f"{k}={row[k]!r}" for k in table.key)
            raise DuplicateRecordError(
                f"{table.name} already holds {key} with different {', '.join(differ)} "
                f"({where}); stored {table.name} are immutable: record the change under a new key"
            )

    # ---- reads (every backend) -----------------------------------------------------

    def _records(self, model: type[R], sql: str, params: list[Any]) -> list[R]:
        table = BY_MODEL[model]
        out = []
        for row in self._query(sql, params):
            rec = table.from_row(row)
            assert isinstance(rec, model)
            out.append(rec)
        return out

    def experiment(self, experiment_id: str) -> ExperimentRecord | None:
        got = self._records(
            ExperimentRecord, "SELECT * FROM experiments WHERE experiment_id = ?", [experiment_id]
        )
        return got[0] if got else None

    def find_experiment(self, name_or_id: str) -> ExperimentRecord | None:
        """The experiment with this id, else the most recently submitted one with this name."""
        got = self._records(
            ExperimentRecord,
            "SELECT * FROM experiments WHERE experiment_id = ? OR name = ? "
            "ORDER BY experiment_id = ? DESC, submitted_at DESC LIMIT 1",
            [name_or_id, name_or_id, name_or_id],
        )
        return got[0] if got else None

    def experiments(self) -> list[ExperimentRecord]:
        """Every submitted experiment, oldest first (archived ones too: the store keeps all)."""
        return self._records(
            ExperimentRecord, "SELECT * FROM experiments ORDER BY submitted_at, experiment_id", []
        )

    def trial_progress(self) -> dict[str, tuple[int, dt.datetime]]:
        """Per experiment with attempts: (trial keys tried, when its last attempt finished)."""
        rows = self._query(
            "SELECT experiment_id, count(DISTINCT trial_key) AS tried, "
            "max(finished_at) AS last FROM trials GROUP BY experiment_id",
            [],
        )
        return {r["experiment_id"]: (int(r["tried"]), r["last"].astimezone(dt.UTC)) for r in rows}

    def _attempts(
        self,
        model: type[R],
        experiment_id: str,
        all_attempts: bool,
        keys: Collection[str] | None = None,
    ) -> list[R]:
        name = BY_MODEL[model].name
        # the latest attempts are the ones experiment_index picked: the rule lives there only
        join = (
            ""
            if all_attempts
            else (
                "JOIN experiment_index i ON i.experiment_id = x.experiment_id "
                "AND i.trial_key = x.trial_key AND i.attempt = x.attempt "
            )
        )
        where, params = "x.experiment_id = ?", [experiment_id]
        if keys is not None:  # a run's own keys: its reads follow its range, not the experiment
            where += " AND list_contains(?, x.trial_key)"
            params.append(list(keys))  # type: ignore[arg-type]
        return self._records(
            model,
            f"SELECT x.* FROM {name} x {join}WHERE {where} "
            "ORDER BY x.variant, x.task, x.replicate, x.attempt",
            params,
        )

    def trials(
        self, experiment_id: str, all_attempts: bool = False, keys: Collection[str] | None = None
    ) -> list[TrialRecord]:
        """Trial records; by default only the highest attempt of each trial key; ``keys``: only
        those trial keys'."""
        return self._attempts(TrialRecord, experiment_id, all_attempts, keys)

    def grades(
        self, experiment_id: str, all_attempts: bool = False, keys: Collection[str] | None = None
    ) -> list[GradeRecord]:
        """Grades; by default only those of the attempt that counts for each trial key; ``keys``:
        only those trial keys'."""
        return self._attempts(GradeRecord, experiment_id, all_attempts, keys)

    def base_checks(self, experiment_id: str) -> dict[str, BaseCheckRecord]:
        got = self._records(
            BaseCheckRecord, "SELECT * FROM base_checks WHERE experiment_id = ?", [experiment_id]
        )
        return {b.task: b for b in sorted(got, key=lambda b: b.task)}

    def pins(self, experiment_id: str) -> dict[str, PinSetRecord]:
        """Variant -> the pin set it runs under."""
        rows = self._query(
            "SELECT e.variant AS _variant, p.* FROM experiment_pins e "
            "JOIN pin_sets p ON p.pin_set = e.pin_set WHERE e.experiment_id = ? ORDER BY e.variant",
            [experiment_id],
        )
        table = BY_NAME["pin_sets"]
        out: dict[str, PinSetRecord] = {}
        for row in rows:
            rec = table.from_row(row)
            assert isinstance(rec, PinSetRecord)
            out[row["_variant"]] = rec
        return out

    def grade_tests(
        self, experiment_id: str, trial_key: str | None = None, keys: list[str] | None = None
    ) -> list[GradeTestRecord]:
        """Per-test rows of an experiment's grades (every attempt), or of one trial key's, or
        of ``keys``' (one query for a run's keys)."""
        where, params = "experiment_id = ?", [experiment_id]
        if trial_key is not None:
            where, params = where + " AND trial_key = ?", [*params, trial_key]
        if keys is not None:
            where, params = where + " AND list_contains(?, trial_key)", [*params, keys]  # type: ignore[list-item]
        return self._records(
            GradeTestRecord,
            f"SELECT * FROM grade_tests WHERE {where} ORDER BY trial_key, attempt, test_id",
            params,
        )

    def counting_trials(
        self,
        *,
        harness_digests: Collection[str],
        base_shas: Collection[str],
        finished_after: dt.datetime,
        other_than: str,
    ) -> list[TrialRecord]:
        """The counting, graded, non-infra attempt of every trial key of the experiments other
        than ``other_than`` that ran one of ``harness_digests`` on one of ``base_shas`` and
        finished after ``finished_after``, newest first: what reuse may copy (experiment/reuse.py)."""
        if not harness_digests or not base_shas or not self._has_trials():
            return []
        return self._records(
            TrialRecord,
            "SELECT t.* FROM trials t JOIN experiment_index i ON i.experiment_id = t.experiment_id "
            "AND i.trial_key = t.trial_key AND i.attempt = t.attempt "
            "WHERE t.experiment_id <> ? AND t.outcome_class <> 'infra_error' "
            "AND i.passed IS NOT NULL AND list_contains(?, t.harness_digest) "
            "AND list_contains(?, t.base_sha) AND t.finished_at > ? "
            "ORDER BY t.finished_at DESC, t.experiment_id, t.trial_key",
            [other_than, sorted(harness_digests), sorted(base_shas), finished_after],
        )

    def notes(self, experiment_id: str) -> list[NoteRecord]:
        return self._records(
            NoteRecord,
            'SELECT * FROM notes WHERE experiment_id = ? ORDER BY "at", note_id',
            [experiment_id],
        )

    def progress_counts(self, experiment_id: str) -> dict[str, int]:
        """What ``run --wait``'s progress line shows, as one aggregate over narrow columns:
        ``done`` (keys whose latest attempt ran), ``graded``, ``passed``, ``failed`` of those,
        and ``infra_errors`` (every attempt that ended as one, retried ones too). Read every
        second while trials run, so no full row or JSON column is read (it was, and took a
        quarter of the CLI's time in a regrade)."""
        ran = "outcome_class <> 'infra_error'"
        rows = self._query(
            f"SELECT count(*) FILTER (WHERE {ran}) AS done, "
            f"count(*) FILTER (WHERE {ran} AND passed IS NOT NULL) AS graded, "
            f"count(*) FILTER (WHERE {ran} AND passed) AS passed, "
            f"count(*) FILTER (WHERE {ran} AND NOT passed) AS failed, "
            "(SELECT count(*) FROM trials WHERE experiment_id = ? "
            "AND outcome_class = 'infra_error') AS infra_errors "
            "FROM experiment_index WHERE experiment_id = ?",
            [experiment_id, experiment_id],
        )
        return {k: int(v or 0) for k, v in rows[0].items()}

    def index(self, experiment_id: str) -> list[dict[str, Any]]:
        """Per trial key, the attempt that counts with its grade (the experiment_index view)."""
        return self._query(
            "SELECT * FROM experiment_index WHERE experiment_id = ? "
            "ORDER BY variant, task, replicate",
            [experiment_id],
        )

    def month_spend(self, month: str) -> list[dict[str, Any]]:
        """Per author and experiment with attempts finished in ``month`` (``YYYY-MM``, UTC):
        ``attempts`` and ``spent_usd`` in the month, ``spent_total_usd`` over all months."""
        # nothing spent yet: answer without opening DuckDB, which would create the home
        # (a submit the budget refuses must write nothing)
        if not self._has_trials():
            return []
        in_month = "FILTER (WHERE month = ?)"
        return self._query(
            f"SELECT author, experiment_id, count(*) {in_month} AS attempts, "
            f"coalesce(sum(cost_usd) {in_month}, 0) AS spent_usd, "
            "sum(cost_usd) AS spent_total_usd FROM budget_ledger GROUP BY author, experiment_id "
            f"HAVING count(*) {in_month} > 0 ORDER BY author, experiment_id",
            [month, month, month],
        )

    def tokens_since(self, since: dt.datetime) -> int:
        """Tokens used after ``since``, every experiment: trial attempts that finished, and the
        model answers to attempts still running (``add_live_tokens``)."""
        with self._tally() as (sql, cur):
            return sql.tokens_since(cur, since)

    def add_live_tokens(
        self, experiment_id: str, trial_key: str, attempt: int, tokens: int, at: dt.datetime
    ) -> None:
        """Count a running attempt's model answer toward the TPM throttle at once (its own row,
        when stored, replaces these)."""
        with self._tally_write() as (sql, cur):
            sql.live_add(cur, experiment_id, trial_key, attempt, tokens, at)

    @contextmanager
    def _tally_write(self) -> Iterator[tuple[TallySQL, Cursor]]:
        """One write transaction on the tally."""
        raise NotImplementedError  # each backend has its own
        yield  # pragma: no cover

    def graded_attempts(self, experiment_id: str) -> set[tuple[str, int]]:
        """(trial key, attempt) of every stored grade of the experiment (two narrow columns)."""
        rows = self._query(
            "SELECT trial_key, attempt FROM grades WHERE experiment_id = ?", [experiment_id]
        )
        return {(r["trial_key"], int(r["attempt"])) for r in rows}

    def work_durations(self, pin_sets: list[str]) -> dict[tuple[str, str], float]:
        """(pin set, task) -> median seconds of a finished attempt plus its grade, over every
        experiment that ran that pin set: what orders a run's trials longest first."""
        if not pin_sets:
            return {}
        rows = self._query(
            "SELECT t.pin_set, t.task, median(t.duration_s + coalesce(g.duration_s, 0)) AS s "
            "FROM trials t LEFT JOIN grades g ON g.experiment_id = t.experiment_id "
            "AND g.trial_key = t.trial_key AND g.attempt = t.attempt "
            f"WHERE t.outcome_class != 'infra_error' AND t.pin_set IN ({', '.join('?' * len(pin_sets))}) "
            "GROUP BY t.pin_set, t.task",
            list(pin_sets),
        )
        return {(r["pin_set"], r["task"]): float(r["s"]) for r in rows}

    def duration_p90s(self, pin_sets: list[str]) -> dict[tuple[str, str], tuple[float, int]]:
        """(pin set, task) -> (90th percentile of a finished attempt's seconds, how many were
        measured), over every experiment that ran that pin set and measured it itself (a
        reused row repeats a measurement): whether a trial can finish before the window closes."""
        if not pin_sets:
            return {}
        rows = self._query(
            "SELECT pin_set, task, quantile_cont(duration_s, 0.9) AS p90, count(*) AS n "
            "FROM trials WHERE outcome_class != 'infra_error' AND reused_from IS NULL "
            f"AND pin_set IN ({', '.join('?' * len(pin_sets))}) GROUP BY pin_set, task",
            list(pin_sets),
        )
        return {(r["pin_set"], r["task"]): (float(r["p90"]), int(r["n"])) for r in rows}

    def summary(self, experiment_id: str) -> list[dict[str, Any]]:
        """Per variant: trials, passed, graded, pass_rate_pts, outcome counts (variant_summary)."""
        return self._query(
            "SELECT * EXCLUDE (experiment_id) FROM variant_summary WHERE experiment_id = ? "
            "ORDER BY variant",
            [experiment_id],
        )


@dataclass(frozen=True)
class _Staged:
    """A record journaled and linked into place whose DuckDB row is not in yet (``_commit``)."""

    table: Table
    row: dict[str, Any]
    batch: pa.Table
    marker: Path  # its journal entry (HANGAR_HOME/pending/), the record's file itself
    path: Path  # the same file under parquet/, its folder not flushed yet
    tallied: bool


class EmbeddedStore(Store):
    """Parquet + DuckDB storage of hangar's records under ``paths.home`` (the default)."""

    def __init__(self, paths: HangarPaths, *, lock_timeout_s: float = 5.0) -> None:
        self.paths = paths
        self.lock_timeout_s = lock_timeout_s
        self.lock_file = paths.duckdb.with_name(paths.duckdb.name + ".lock")
        self._schema_ready = False
        self._fresh_db = False
        self._compactor = Compactor(paths)
        self._recovered = False
        # rows_behind: the staged files whose DuckDB rows its committer thread puts in
        self._behind: list[_Staged] | None = None
        self._behind_guard = threading.Lock()

    # ---- writing -------------------------------------------------------------------------

    def put(self, record: Record) -> None:
        """Write ``record`` whole: its Parquet file first, then its DuckDB row.

        Raises DuplicateRecordError when the key exists and the table forbids
        replacing it. An unreachable DuckDB only logs a warning: the Parquet file
        is written and the next read (or ``sync``) inserts the row.
        """
        self.put_many([record])

    def put_many(self, records: list[Record]) -> None:
        """``put`` each record, their DuckDB rows inserted through one connection.

        Opening and closing the DuckDB file (its checkpoint) cost most of a small put, so a
        regrade's hundreds of grades and copied trials go in a batch. Each record's files are
        written as ``put`` writes them; when one is refused (DuplicateRecordError), the ones
        before it are still stored whole and the error is raised after them.
        """
        staged: list[_Staged] = []
        try:
            for record in records:
                table = BY_MODEL.get(type(record))
                if table is None:
                    raise TypeError(f"{type(record).__name__} is not a stored record type")
                row = table.to_row(record)
                self.check_trial_key(record)
                if not self._recovered:  # a compaction killed mid-way is finished first
                    self._compactor.recover()
                    self._recovered = True
                if isinstance(record, GradeRecord) and record.tests:
                    # First: a grade in the store always has its per-test rows.
                    self._drop_orphan_tests(row)
                    staged.append(self._stage(BY_NAME["grade_tests"], record.tests))
                staged.append(self._stage(table, [record], [row]))
        except BaseException:
            try:  # what preceded the refused record is stored whole
                self._commit(staged)
            except Exception as e:  # its journal markers stay: the next read brings it in
                log.warning("rows before a refused record not inserted yet: %s", e)
            raise  # the refusal itself, which the caller acts on
        self._commit(staged)

    @contextmanager
    def rows_behind(self, every_s: float = 2.0) -> Iterator[None]:
        """Within the block, a put writes its Parquet file, journal marker and tally rows as
        always and returns; a committer thread puts the DuckDB rows of what was staged in the
        last ``every_s`` through one connection, and the rest when the block ends.

        Opening and closing the DuckDB file and the insert are most of a small put, and a trial
        slot made two per trial (its trial, then its grade): the slots' time between trials
        (docs/performance.md). Every 2 s, not 0.5: a commit opens, inserts and closes (a
        checkpoint), and at 0.5 s the committer was a quarter of the CLI's busy samples during a
        trials stage (py-spy, docs/performance.md). Nothing is less safe: a crash inside the
        block loses no record (each is stored and journaled at its put; the next read brings the
        rows in), and a read meanwhile, in any thread or process, brings the journaled rows in
        itself."""
        if self._behind is not None:
            yield  # nested: the outer block commits
            return
        self._behind = []

        def committer(done: threading.Event) -> None:
            while not done.wait(every_s):
                self._commit_behind()

        try:
            with while_running(committer, "hangar-store-rows"):
                yield
        finally:
            self._commit_behind(last=True)

    def _commit_behind(self, last: bool = False) -> None:
        with self._behind_guard:
            staged = self._behind or []
            self._behind = None if last else []
        try:
            self._commit_now(staged)
        except Exception as e:  # their journal markers stay: the next read brings them in
            log.warning("%d staged row(s) not inserted yet: %s", len(staged), e)

    def _drop_orphan_tests(self, grade_row: dict[str, Any]) -> None:
        """Remove the per-test rows of an attempt that has no grade: a crash between the two
        writes left them, and its regrade writes its own (no grade refers to the orphans)."""
        grades = BY_NAME["grades"]
        if (self.paths.parquet / grades.relpath(grade_row)).exists() or self._compactor.registered(
            grades, grade_row
        ):
            return  # graded: the second write is refused as a duplicate, tests and all
        tests = self.paths.parquet / BY_NAME["grade_tests"].relpath(grade_row)
        if not tests.exists():
            return
        tests.unlink()
        with suppress(StoreUnavailable), self._db() as con:
            con.execute(
                "DELETE FROM grade_tests WHERE experiment_id = ? AND trial_key = ? AND attempt = ?",
                [grade_row["experiment_id"], grade_row["trial_key"], grade_row["attempt"]],
            )

    def _put_rows(
        self, table: Table, records: list[Any], rows: list[dict[str, Any]] | None = None
    ) -> None:
        """``records`` as one Parquet file of ``table`` (several only where it has a file_key)."""
        self._commit([self._stage(table, records, rows)])

    def _stage(
        self, table: Table, records: list[Any], rows: list[dict[str, Any]] | None = None
    ) -> _Staged:
        """``records``' Parquet file written as a journal entry, linked into place and tallied;
        the DuckDB row is ``_commit``'s."""
        rows = rows if rows is not None else [table.to_row(r) for r in records]
        if len(rows) > 1:
            keys = {tuple(r[k] for k in table.file_key) for r in rows} if table.file_key else ()
            if len(keys) != 1:
                raise ValueError(f"{table.name}: the rows of one file must share {table.file_key}")
        batch = pa.Table.from_pylist(rows, schema=table.arrow_schema())
        # The journal entry first, and it is the record's file itself: once it is on disk the
        # record is, and should the process die before the file is linked into place or before
        # its DuckDB row, the next read finds it there, without listing parquet/.
        marker, written = self._journal(table, rows[0], batch)
        try:
            path = self._link(table, rows[0], marker, written)
        except BaseException:
            marker.unlink(missing_ok=True)
            raise
        tallied = self._tally_rows(table, rows, marker.name)
        return _Staged(table, rows[0], batch, marker, path, tallied)

    def _commit(self, staged: list[_Staged]) -> None:
        """The staged files' rows into DuckDB through one connection, then their markers gone
        (a marker stays where the tally missed its rows: the next read adds them)."""
        with self._behind_guard:
            if self._behind is not None:  # inside rows_behind: its committer puts them in
                self._behind.extend(staged)
                return
        self._commit_now(staged)

    def _commit_now(self, staged: list[_Staged]) -> None:
        if not staged:
            return
        by_table: dict[str, list[_Staged]] = {}
        for s in staged:
            by_table.setdefault(s.table.name, []).append(s)
        try:
            with self._db() as con, _transaction(con):
                for same in by_table.values():  # one INSERT per table: each costs a plan
                    self._insert(con, same[0].table, pa.concat_tables([s.batch for s in same]))
                # the index rows they change, in the same transaction: none shows half-written
                for same in by_table.values():
                    _refresh_index(con, same[0].table.name, [s.row for s in same])
        except StoreUnavailable as e:
            names = sorted({s.table.name for s in staged})
            log.warning("%s; %s row(s) kept in Parquet only until the next sync", e, names)
            return  # the markers stay: the next read brings the rows in
        settled = [s for s in staged if s.tallied]
        try:
            # The records' links on disk before their journal entries go (one flush per folder).
            for folder in sorted({s.path.parent for s in settled}):
                fsync(folder)
        except OSError as e:  # the entries stay: the next read flushes and removes them
            log.warning("record folders not flushed yet: %s", e)
            return
        for s in settled:
            s.marker.unlink(missing_ok=True)
            try:
                self._compactor.after_put(s.table, s.row)
            except Exception as e:  # the record is stored; the next put's compaction catches up
                log.warning("compaction of %s deferred: %s", s.table.name, e)

    def _journal(
        self, table: Table, row: dict[str, Any], batch: pa.Table
    ) -> tuple[Path, os.stat_result]:
        """The journal entry ``HANGAR_HOME/pending/<random>.<table>``: the record's Parquet
        file, naming its place under parquet/ in its metadata (``local.JOURNAL_KEY``), flushed
        with its folder. Written under a name no reader takes, then renamed: whole or absent.
        Returns the entry and its ``stat`` (which file it is, whoever removes the entry)."""
        # Few system calls: in a trials run each one waits for the GIL behind the busy threads.
        pending = self.paths.pending
        name = f"{uuid.uuid4().hex}.{table.name}"
        tmp, entry = pending / f".{name}.tmp", pending / name
        meta = {**(batch.schema.metadata or {}), local.JOURNAL_KEY: table.relpath(row).encode()}
        try:
            try:
                sink = pa.OSFile(str(tmp), "wb")
            except FileNotFoundError:
                pending.mkdir(parents=True, exist_ok=True)
                sink = pa.OSFile(str(tmp), "wb")
            with sink:
                pq.write_table(batch.replace_schema_metadata(meta), sink)
                os.fsync(sink.fileno())
                written = os.fstat(sink.fileno())
            os.rename(tmp, entry)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync(pending)
        return entry, written

    def _link(
        self, table: Table, row: dict[str, Any], entry: Path, written: os.stat_result
    ) -> Path:
        """Link the journal entry to its file under parquet/ (atomic and exclusive: an existing
        record is never replaced). Its folder is flushed before the entry goes (``_commit_now``):
        until then the entry holds the record."""
        path = self.paths.parquet / table.relpath(row)
        try:
            try:
                os.link(entry, path)
            except FileNotFoundError:
                # No folder yet (the experiment's first record), or a reader linked and removed
                # the entry. Ask the entry, not the folder: another writer may have made the
                # folder since this link failed.
                if not entry.exists():
                    raise
                path.parent.mkdir(parents=True, exist_ok=True)
                os.link(entry, path)
        except (FileExistsError, FileNotFoundError):
            # A reader links the entry of a writer slow between the two (and, done with it, may
            # have removed the entry); else the place holds another record.
            if not _is_file(path, written):
                if not path.exists():
                    raise
                self._check_duplicate(table, row, path)
                return path  # the same content, already stored (a same_content table)
        part = self._compactor.registered(table, row)
        if part is not None:  # its first file was compacted (compaction.py, step 4)
            path.unlink()
            raise self.duplicate_error(table, row, str(self.paths.parquet / part))
        return path

    def _journaled_file(self, entry: Path, table: Table) -> Path | None:
        """The record file under parquet/ a journal entry stands for, None while there is none
        to read. An entry not linked yet is linked here (its writer died, or stalls, between
        the two); one whose place holds another file was a refused record's, and is dropped.
        An older hangar's journal marker names its file as text: None until the file is there
        (its writer between the marker and the file)."""
        rel = local.journaled_path(entry)
        if rel is None:
            name = entry.read_text()  # an empty name would be the whole Parquet tree
            path = self.paths.parquet / name
            return path if name and path.is_file() else None
        path = self.paths.parquet / rel
        if not path.exists():
            row = pq.read_table(entry).slice(0, 1).to_pylist()[0]
            if self._compactor.registered(table, row) is not None:
                entry.unlink(missing_ok=True)  # its key is in a part: the put was refused
                return None
            path.parent.mkdir(parents=True, exist_ok=True)
            with suppress(FileExistsError):
                os.link(entry, path)
        if not _same_file(entry, path):
            entry.unlink(missing_ok=True)  # a refused record's: its writer died before dropping it
            return None
        return path

    def _check_duplicate(self, table: Table, row: dict[str, Any], path: Path) -> None:
        if table.on_duplicate != "same_content":
            raise self.duplicate_error(table, row, str(path))
        self.check_same_content(table, pq.read_table(path).to_pylist()[0], row, str(path))

    @staticmethod
    def _insert(con: duckdb.DuckDBPyConnection, table: Table, rows: pa.Table) -> None:
        con.register("incoming", rows)
        try:
            con.execute(f"INSERT OR IGNORE INTO {table.name} BY NAME SELECT * FROM incoming")
        finally:
            con.unregister("incoming")

    # ---- healing -------------------------------------------------------------------------

    def sync(self) -> int:
        """Insert every Parquet row DuckDB lacks (by primary key); returns how many were added.

        Idempotent. Reads run the cheap check ``_sync_if_behind`` themselves; call
        this to force a full pass (it rebuilds a deleted hangar.duckdb too, and
        experiment_index from the tables).
        """
        with self._db() as con:
            with _transaction(con):
                added = sum(self._sync_table(con, t) for t in TABLES)
                rebuild_index(con)
            self._sync_pending(con)  # every file is in now: clears the markers
            return added

    def _sync_table(self, con: duckdb.DuckDBPyConnection, table: Table) -> int:
        if not any(self.paths.parquet.glob(table.glob())):
            return 0
        before = self._count(con, table.name)
        con.execute(
            f"INSERT OR IGNORE INTO {table.name} BY NAME SELECT * FROM read_parquet(?, "
            "union_by_name = true, hive_partitioning = false)",
            [str(self.paths.parquet / table.glob())],
        )
        return self._count(con, table.name) - before

    def _sync_if_behind(self, con: duckdb.DuckDBPyConnection) -> None:
        """What a read does first: a new database is filled from every Parquet file; else only
        the files the journal names (normally none) come in. parquet/ is never listed here."""
        if self._fresh_db:
            with _transaction(con):
                added = sum(self._sync_table(con, t) for t in TABLES)
                rebuild_index(con)
            log.info("filled a new %s with %d row(s) from Parquet", self.paths.duckdb, added)
            self._fresh_db = False
        self._sync_pending(con)

    def _sync_pending(self, con: duckdb.DuckDBPyConnection) -> None:
        try:
            markers = list(os.scandir(self.paths.pending))
        except FileNotFoundError:
            return
        for entry in markers:
            marker = Path(entry.path)
            table = BY_NAME.get(marker.suffix.lstrip("."))
            try:
                path = None if table is None else self._journaled_file(marker, table)
                if path is None:
                    # an entry cut off before it was whole (its ``.tmp``), or an older hangar's
                    # marker whose file never appeared: dropped once older than any write
                    if time.time() - entry.stat().st_mtime > STALE_MARKER_S:
                        marker.unlink(missing_ok=True)
                    continue
            except FileNotFoundError:
                continue  # another reader or the committer took it
            assert table is not None
            with _transaction(con):
                con.execute(
                    f"INSERT OR IGNORE INTO {table.name} BY NAME SELECT * FROM read_parquet(?)",
                    [str(path)],
                )
                scope = ("experiment_id", "task" if table.name == "base_checks" else "trial_key")
                if table.name in ("trials", "grades", "base_checks"):
                    rows = pq.read_table(path, columns=list(scope)).to_pylist()
                    _refresh_index(con, table.name, rows)
            log.info("brought %s into DuckDB from its journal entry", path)
            if self._tally_file(table, path, marker.name):
                fsync(path.parent)  # its link on disk before the entry goes
                marker.unlink(missing_ok=True)

    @staticmethod
    def _count(con: duckdb.DuckDBPyConnection, name: str, per: tuple[str, ...] = ()) -> int:
        rows = f"(SELECT DISTINCT {', '.join(per)} FROM {name})" if per else name
        got = con.execute(f"SELECT count(*) FROM {rows}").fetchone()
        return int(got[0]) if got else 0

    # ---- connections ---------------------------------------------------------------------

    @contextmanager
    def _db(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short-lived DuckDB connection under the thread lock and the file lock."""
        deadline = time.monotonic() + self.lock_timeout_s
        db = self.paths.duckdb
        lock = _thread_lock(db)
        if not lock.acquire(timeout=self.lock_timeout_s):
            raise StoreUnavailable(f"{db} stayed busy in this process for {self.lock_timeout_s}s")
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
            with open(self.lock_file, "a+b") as fh:  # closing it releases the flock
                self._retry(deadline, lambda: fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB))
                if not db.exists():
                    self._fresh_db = True  # a first or deleted database: the next read fills it
                con = self._retry(deadline, lambda: duckdb.connect(str(db)))
                try:
                    if not self._schema_ready:
                        self._create_schema(con)
                        self._schema_ready = True
                    yield con
                finally:
                    con.close()
        finally:
            lock.release()

    def _retry(self, deadline: float, attempt: Callable[[], T]) -> T:
        delay = 0.02
        while True:
            try:
                return attempt()
            except (BlockingIOError, duckdb.IOException) as e:
                if isinstance(e, duckdb.IOException) and "lock" not in str(e).lower():
                    raise
                if time.monotonic() + delay > deadline:
                    raise StoreUnavailable(
                        f"{self.paths.duckdb} stayed locked for {self.lock_timeout_s}s ({e}); "
                        "another process holds it (an open duckdb shell?); see docs/data.md"
                    ) from e
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    @staticmethod
    def _create_schema(con: duckdb.DuckDBPyConnection) -> None:
        for table in TABLES:
            con.execute(table.ddl())
            # A database made before a nullable column existed gains it (base_outcomes, ...).
            for c in table.columns:
                if c.nullable:
                    con.execute(
                        f'ALTER TABLE {table.name} ADD COLUMN IF NOT EXISTS "{c.name}" {c.sql_type}'
                    )
            # ... and one made while a column was NOT NULL (trials.cost_usd) lets it be NULL.
            not_null = {
                r[0]
                for r in con.execute(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_name = ? AND is_nullable = 'NO'",
                    [table.name],
                ).fetchall()
            }
            for c in table.columns:
                if c.nullable and c.name in not_null:
                    con.execute(f'ALTER TABLE {table.name} ALTER COLUMN "{c.name}" DROP NOT NULL')
        _create_index(con)
        for view in VIEWS:
            con.execute(view)

    # ---- reads -------------------------------------------------------------------------

    def _query(self, sql: str, params: list[Any]) -> list[dict[str, Any]]:
        try:
            with self._db() as con:
                self._sync_if_behind(con)
                return _rows(con.execute(sql, params))
        except StoreUnavailable as e:
            # answer from the Parquet files through a throwaway in-memory copy
            log.warning("%s; answering from Parquet", e)
            mem = duckdb.connect(":memory:")
            try:
                self._create_schema(mem)
                for table in TABLES:
                    self._sync_table(mem, table)
                rebuild_index(mem)
                return _rows(mem.execute(sql, params))
            finally:
                mem.close()

    # ---- the tally (results/tally.py) ----------------------------------------------------

    def _tally_rows(self, table: Table, rows: list[dict[str, Any]], marker: str) -> bool:
        """Add stored rows to the tally (trials and experiments only); False if it failed (the
        journal marker then stays, and the next read or start check adds them)."""
        if table.name not in ("trials", "experiments"):
            return True
        try:
            with local.write(_tally_db(self.paths.tally)) as cur:
                if table.name == "trials":
                    _SQL.apply_trials(cur, [trial_row(r) for r in rows])
                else:
                    _SQL.apply_experiments(cur, [(r["experiment_id"], r["author"]) for r in rows])
        except (sqlite3.Error, OSError) as e:
            log.warning("the tally missed a %s row (%s); the journal keeps it", table.name, e)
            return False
        with _TALLIED_GUARD:
            _TALLIED.add((self.paths.tally, marker))
        return True

    def _tally_file(self, table: Table, path: Path, marker: str) -> bool:
        """``_tally_rows`` for the record file a journal marker names (once per process)."""
        with _TALLIED_GUARD:
            if (self.paths.tally, marker) in _TALLIED:
                return True
        if table.name not in ("trials", "experiments"):
            return True
        return self._tally_rows(table, pq.read_table(path).to_pylist(), marker)

    def _heal_tally(self) -> None:
        """Add the files of journal markers the tally may lack (normally there are none)."""
        try:
            markers = list(os.scandir(self.paths.pending))
        except FileNotFoundError:
            return
        for entry in markers:
            table = BY_NAME.get(Path(entry.name).suffix.lstrip("."))
            if table is None or table.name not in ("trials", "experiments"):
                continue
            with _TALLIED_GUARD:  # each start check meets the slots' entries: no read for them
                if (self.paths.tally, entry.name) in _TALLIED:
                    continue
            try:
                path = self._journaled_file(Path(entry.path), table)
                if path is not None:
                    self._tally_file(table, path, entry.name)
            except FileNotFoundError:
                continue  # healed and removed meanwhile

    @contextmanager
    def _tally(self) -> Iterator[tuple[TallySQL, Cursor]]:
        con = _tally_db(self.paths.tally)
        cur = con.cursor()
        if not _SQL.built(cur):
            self._build_tally(con)
        self._heal_tally()
        yield _SQL, cur

    @contextmanager
    def _tally_write(self) -> Iterator[tuple[TallySQL, Cursor]]:
        con = _tally_db(self.paths.tally)
        if not _SQL.built(con.cursor()):
            self._build_tally(con)
        with local.write(con) as cur:
            yield _SQL, cur

    def _build_tally(self, con: sqlite3.Connection) -> None:
        """Fill a new (or outdated) tally from DuckDB, itself level with Parquet first.

        Read before the write lock is taken (lock order: DuckDB, then SQLite); a trial stored
        meanwhile is added by its own put or its journal marker.
        """
        trials = self._query(f"SELECT {', '.join(TRIAL_COLUMNS)} FROM trials", [])
        authors = self._query("SELECT experiment_id, author FROM experiments", [])
        with local.write(con) as cur:
            if not _SQL.built(cur):
                _SQL.rebuild(
                    cur,
                    [trial_row(r) for r in trials],
                    [(r["experiment_id"], r["author"]) for r in authors],
                )
                log.info("built the tally from %d trial attempt(s)", len(trials))
        # A put that told the old tally before its DuckDB row was read above still has its
        # journal marker: the heal that follows adds it again (keys count once).
        with _TALLIED_GUARD:
            _TALLIED.difference_update({k for k in _TALLIED if k[0] == self.paths.tally})

    def rebuild_tally(self) -> None:
        con = _tally_db(self.paths.tally)
        with local.write(con) as cur:
            for name in TALLY_TABLES:
                cur.execute(f"DELETE FROM {name}")
        self._build_tally(con)

    def _has_trials(self) -> bool:
        # may hold some: then the query says (no listing of the tree)
        return (self.paths.parquet / BY_NAME["trials"].name).is_dir()

    def compact(self) -> int:
        """Merge every partition's small files into parts (results/compaction.py); each put
        does it for its own partition once it holds COMPACT_AT small files."""
        return self._compactor.compact()


def _is_file(path: Path, st: os.stat_result) -> bool:
    """Whether ``path`` is the file ``st`` was taken of (False if there is none)."""
    try:
        got = path.stat()
    except FileNotFoundError:
        return False
    return (got.st_dev, got.st_ino) == (st.st_dev, st.st_ino)


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``b`` is a link of ``a`` (FileNotFoundError if ``a`` is gone)."""
    return _is_file(b, a.stat())


@contextmanager
def _transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    con.execute("BEGIN")
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def _refresh_index(con: duckdb.DuckDBPyConnection, table: str, rows: list[dict[str, Any]]) -> None:
    """Make the experiment_index rows that ``rows`` of ``table`` change current."""
    scope = index_scope(table, rows)
    if scope is not None:
        for sql in index_refresh(*scope):
            con.execute(sql)


def rebuild_index(con: duckdb.DuckDBPyConnection) -> None:
    """experiment_index made again from the tables (a sync, a new database, a new definition)."""
    for sql in INDEX_REBUILD:
        con.execute(sql)
    con.execute(f"COMMENT ON TABLE experiment_index IS '{INDEX_DIGEST}'")


def _create_index(con: duckdb.DuckDBPyConnection) -> None:
    """The experiment_index table, rebuilt where an older hangar left a view of that name or
    an index of another definition (its digest is the table's comment)."""
    kind = con.execute(
        "SELECT table_type, (SELECT comment FROM duckdb_tables() WHERE table_name = "
        "'experiment_index' AND database_name = current_database() AND schema_name = 'main') "
        "FROM information_schema.tables WHERE table_name = 'experiment_index' "
        "AND table_catalog = current_database() AND table_schema = 'main'"
    ).fetchone()
    if kind is not None and kind[0] == "BASE TABLE" and kind[1] == INDEX_DIGEST:
        return
    with _transaction(con):
        if kind is not None:
            con.execute(f"DROP {'TABLE' if kind[0] == 'BASE TABLE' else 'VIEW'} experiment_index")
        con.execute(INDEX_DDL)
        rebuild_index(con)


def _rows(cur: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Result rows as dicts, JSON columns decoded."""
    desc = cur.description or []
    names = [d[0] for d in desc]
    is_json = [str(d[1]) == "JSON" for d in desc]
    return [
        {
            n: json.loads(v) if j and isinstance(v, str) else v
            for n, j, v in zip(names, is_json, row, strict=True)
        }
        for row in cur.fetchall()
    ]
