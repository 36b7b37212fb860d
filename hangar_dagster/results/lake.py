"""The distributed results store: a DuckLake with its catalog in Postgres (``HANGAR_STORE=ducklake``).

Many run workers, on many machines, write at once and analysts read at the same time:
DuckLake keeps every table's snapshots in the Postgres catalog (``HANGAR_STORE_CATALOG``)
and its Parquet data files, hive-partitioned by ``experiment_id``, under a directory every
worker mounts (``HANGAR_STORE_DATA``). Each ``put`` is one DuckLake transaction; a reader
sees one committed snapshot for its whole query. Small inserts are inlined into the catalog
and written out as one Parquet file per partition by ``compact`` (DuckLake's own
``ducklake_flush_inlined_data`` and ``ducklake_merge_adjacent_files``), so the file count
stays bounded. DuckLake has no primary keys: the write-once rule is a unique key in a
plain Postgres table next to the catalog (``hangar_store_keys``). ``experiment_index`` is a
table each put of a trial, grade or base check keeps current in its own transaction, the
writers taking turns on one advisory lock (DuckLake's conflicts on deletes are per table).
docs/data.md, "Distributed mode", says why DuckLake and how an analyst attaches it.

The ``ducklake`` and ``postgres`` extensions load from the ``duckdb-ext-*`` packages'
directory; autoinstall is off, so nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras
import pyarrow as pa

from hangar_dagster.results.records import GradeRecord, Record
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
from hangar_dagster.results.store import Store, _rows
from hangar_dagster.results.tally import TABLES as TALLY_TABLES
from hangar_dagster.results.tally import (
    TRIAL_COLUMNS,
    Cursor,
    TallySQL,
    trial_row,
)
from hangar_dagster.settings import HangarPaths
from hangar_dagster.util.digests import sha256_json

log = logging.getLogger(__name__)

CATALOG = "hangar"  # the attached DuckLake's name: tables are hangar.trials, ...
KEYS = "hangar_store_keys"
# Inserts of at most this many rows are kept in the catalog until compact writes them out.
INLINE_ROWS = 1000
# A process flushes inlined rows after this many puts of its own (compact stays callable).
FLUSH_EVERY = 500
# Replaced files and old snapshots outlive a compaction this long: a reader's open snapshot
# still reads them.
KEEP_REPLACED_S = 3600
_RETRIES = 50


def _execute_values(cur: Cursor, sql: str, rows: list[tuple[Any, ...]]) -> None:
    psycopg2.extras.execute_values(cur, sql, rows, page_size=1000)


_SQL = TallySQL(psycopg2.paramstyle, values=_execute_values)
# A trial whose tally row was reserved this long ago but never applied: its writer died between
# its DuckLake commit and the tally (or before the commit); a start check settles it.
UNAPPLIED_STALE_S = 60.0
_TALLY_LOCK = 0x68616E67  # pg_advisory_xact_lock key of the tally's schema and rebuild
# A start check settles stale unapplied marks at most this often (per Store).
SETTLE_EVERY_S = 5.0
# The first of the two advisory-lock keys a put holds on its record's key (the second is the
# key's hash); the two-key space does not overlap _TALLY_LOCK's one-key space.
_KEY_LOCKS = 0x6B657973
_KEYS_DDL = (
    f"CREATE TABLE IF NOT EXISTS {KEYS} (tbl TEXT NOT NULL, k TEXT NOT NULL, PRIMARY KEY (tbl, k))"
)
_UNAPPLIED_DDL = (
    "CREATE TABLE IF NOT EXISTS tally_unapplied (experiment_id TEXT NOT NULL, "
    "trial_key TEXT NOT NULL, attempt BIGINT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT now(), "
    "PRIMARY KEY (experiment_id, trial_key, attempt))"
)
# The row of hangar_store_keys that says which schema the catalog holds.
_SCHEMA_TBL = "_schema"
SCHEMA_DIGEST = sha256_json([[t.ddl() for t in TABLES], list(VIEWS), INDEX_DIGEST])
# pg_advisory_lock key every writer of experiment_index holds through its DuckLake transaction
# (a put of a trial, grade or base check; compact): DuckLake takes two transactions that delete
# from one table as a conflict, whichever rows they touch, so they take turns instead of
# retrying (their commits serialise on the catalog anyway). Taken before the store's DuckDB
# connection, never while holding it.
_INDEX_LOCK = 0x696E6478
# the tables whose rows experiment_index is made of (schema.index_scope)
_INDEXED = ("trials", "grades", "base_checks")


def extension_directory() -> Path:
    """Where the duckdb-ext-* packages put their builds (``v<duckdb>/<platform>/*``)."""
    spec = importlib.util.find_spec("duckdb_ext")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the ducklake store needs the duckdb-ext-ducklake and duckdb-ext-postgres packages "
            "(pip install -e .); they are in pyproject.toml"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "extensions"


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def attach_sql(catalog: str, data: Path | None = None, *, read_only: bool = False) -> str:
    """The statements that attach the store in a DuckDB session (docs/data.md)."""
    opts = [f"DATA_PATH {_quote(str(data) + '/')}"] if data is not None else []
    if read_only:
        opts.append("READ_ONLY")
    else:
        opts.append(f"DATA_INLINING_ROW_LIMIT {INLINE_ROWS}")
    return (
        f"SET autoinstall_known_extensions = false; "
        f"SET extension_directory = {_quote(str(extension_directory()))}; "
        "LOAD postgres; LOAD ducklake; "
        f"ATTACH {_quote('ducklake:postgres:' + catalog)} AS {CATALOG} ({', '.join(opts)}); "
        f"USE {CATALOG};"
    )


def _conflict(e: Exception) -> bool:
    # another writer committed first (DuckLake retries some itself) or a catalog race
    text = str(e).lower()
    return isinstance(e, duckdb.TransactionException) or "conflict" in text


class LakeStore(Store):
    """Records in a DuckLake (Postgres catalog, Parquet files on a shared directory)."""

    def __init__(self, paths: HangarPaths, *, lock_timeout_s: float = 5.0) -> None:
        if not paths.store.catalog:
            raise ValueError(
                "HANGAR_STORE=ducklake needs HANGAR_STORE_CATALOG, a libpq connection string "
                "of the Postgres database that holds the catalog, e.g. "
                "'host=db dbname=hangar user=hangar' (docs/data.md, 'Distributed mode')"
            )
        self.paths = paths
        self.lock_timeout_s = lock_timeout_s
        self._con: duckdb.DuckDBPyConnection | None = None
        self._lock = threading.Lock()
        self._puts = 0
        # the tally's Postgres connections, one per thread (results/tally.py)
        self._pg_local = threading.local()
        self._pg_all: list[psycopg2.extensions.connection] = []
        self._pg_all_lock = threading.Lock()
        self._tally_ready = False
        self._settled_at = -SETTLE_EVERY_S
        self._any_trials = False

    # ---- connection ----------------------------------------------------------------------

    @contextmanager
    def _db(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """This Store's one connection (attached once), one thread at a time."""
        with self._lock:
            if self._con is None:
                self._con = self._connect()
            yield self._con

    def _connect(self) -> duckdb.DuckDBPyConnection:
        data = self.paths.lake
        data.mkdir(parents=True, exist_ok=True)
        # no progress bar: a slow catalog query would print one on the process's stdout
        con = duckdb.connect()
        try:
            con.execute("SET enable_progress_bar = false")
            con.execute(attach_sql(self.paths.store.catalog, data))
            self._retrying(con, self._create_schema)
        except BaseException:
            con.close()
            raise
        return con

    def _create_schema(self, con: duckdb.DuckDBPyConnection) -> None:
        # The schema this code writes, by digest: a catalog made by an older hangar (a column
        # or a view added since) is brought level once, then every connect is one lookup.
        with self._pg_tx() as cur:
            cur.execute(
                f"SELECT 1 FROM {KEYS} WHERE tbl = %s AND k = %s", [_SCHEMA_TBL, SCHEMA_DIGEST]
            )
            if cur.fetchone():
                return
        existing = {
            r[0]
            for r in con.execute(
                f"SELECT table_name FROM duckdb_tables() WHERE database_name = '{CATALOG}'"
            ).fetchall()
        }
        views = {
            r[0]
            for r in con.execute(
                f"SELECT view_name FROM duckdb_views() WHERE database_name = '{CATALOG}'"
            ).fetchall()
        }
        con.execute("BEGIN")
        # experiment_index was a view before it was a table: made again from the tables
        if "experiment_index" in views:
            con.execute("DROP VIEW experiment_index")
        con.execute(INDEX_DDL)
        if "experiment_index" not in existing:
            con.execute("ALTER TABLE experiment_index SET PARTITIONED BY (experiment_id)")
        for table in TABLES:
            # DuckLake has no PRIMARY KEY: the key is kept in hangar_store_keys instead
            con.execute(table.ddl().replace(f",\n  PRIMARY KEY ({', '.join(table.key)})\n)", "\n)"))
            if table.by_experiment and table.name not in existing:
                con.execute(f"ALTER TABLE {table.name} SET PARTITIONED BY (experiment_id)")
            for c in table.columns:  # a catalog made before a nullable column existed gains it
                if c.nullable and table.name in existing:
                    con.execute(
                        f'ALTER TABLE {table.name} ADD COLUMN IF NOT EXISTS "{c.name}" {c.sql_type}'
                    )
        for view in VIEWS:
            con.execute(view)
        con.execute("COMMIT")
        # a new catalog, or one an older hangar made: the index from the tables (a transaction
        # of its own: read in the one that altered a table, the DuckLake extension aborts)
        con.execute("BEGIN")
        for sql in INDEX_REBUILD:
            con.execute(sql)
        con.execute("COMMIT")
        with self._pg_tx() as cur:
            cur.execute(
                f"INSERT INTO {KEYS} (tbl, k) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                [_SCHEMA_TBL, SCHEMA_DIGEST],
            )

    def _retrying(self, con: duckdb.DuckDBPyConnection, work: Any) -> Any:
        delay = 0.01
        for attempt in range(_RETRIES):
            try:
                return work(con)
            except duckdb.Error as e:
                with_rollback(con)
                if not _conflict(e) or attempt == _RETRIES - 1:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        raise AssertionError("unreachable")

    # ---- writing -------------------------------------------------------------------------

    def put(self, record: Record) -> None:
        table = BY_MODEL.get(type(record))
        if table is None:
            raise TypeError(f"{type(record).__name__} is not a stored record type")
        row = table.to_row(record)
        self.check_trial_key(record)
        if isinstance(record, GradeRecord) and record.tests:
            tests = BY_NAME["grade_tests"]
            self._drop_orphan_tests(row)
            self._put_rows(tests, [tests.to_row(t) for t in record.tests])
        self._put_rows(table, [row])
        self._count_puts(1)

    def _count_puts(self, n: int) -> None:
        """Flush inlined rows each time this process's puts, single or batched, pass a multiple
        of FLUSH_EVERY: inlined rows live in the catalog until a flush writes them out."""
        before, self._puts = self._puts, self._puts + n
        if before // FLUSH_EVERY != self._puts // FLUSH_EVERY:
            try:
                self.compact()
            except duckdb.Error as e:  # another writer's flush won; the next one catches up
                log.info("flush of inlined rows deferred: %s", e)

    def put_many(self, records: list[Record]) -> None:
        """Trials and grades without per-test rows in one transaction per table (a loader's or
        a benchmark's batch); any other record, or a batch with a stored key, goes one by one."""
        plain = [r for r in records if type(r) in BY_MODEL and not getattr(r, "tests", None)]
        if len(plain) != len(records) or any(
            BY_MODEL[type(r)].on_duplicate != "refuse" for r in plain
        ):
            return super().put_many(records)
        by_table: dict[str, list[dict[str, Any]]] = {}
        for r in records:
            self.check_trial_key(r)
            by_table.setdefault(BY_MODEL[type(r)].name, []).append(BY_MODEL[type(r)].to_row(r))
        for name, rows in by_table.items():
            table = BY_NAME[name]
            keys = [self._key(table, r) for r in rows]
            self._lock_keys(table, keys)
            try:
                try:
                    self._reserve(table, keys, rows)
                except psycopg2.errors.UniqueViolation:
                    reserved = False
                else:
                    reserved = True
                if reserved:
                    batch = pa.Table.from_pylist(rows, schema=table.arrow_schema())
                    self._stored(table, rows, lambda t=table, b=batch: self._retrying_insert(t, b))
                    continue
            finally:
                self._unlock_keys(table, keys)
            for row in rows:  # a stored key among them: the one-by-one path says which
                self._put_rows(table, [row])
        self._count_puts(len(records))

    @staticmethod
    def _key(table: Table, row: dict[str, Any]) -> str:
        cols = table.file_key or table.key
        return "\x1f".join(str(row[c]) for c in cols)

    def _where(self, table: Table, row: dict[str, Any]) -> tuple[str, list[Any]]:
        cols = table.file_key or table.key
        return " AND ".join(f"{c} = ?" for c in cols), [row[c] for c in cols]

    def _lock_keys(self, table: Table, keys: list[str]) -> None:
        """Hold the keys' advisory locks (this thread's Postgres session) until _unlock_keys: a
        writer that finds a key reserved waits here for its reserver to commit or die, so a
        reservation without its row means the reserver is gone, never that it is mid-insert."""
        with self._pg().cursor() as cur:  # session locks: outlive any transaction
            cur.execute(
                "SELECT pg_advisory_lock(%s, h) FROM (SELECT DISTINCT hashtext(%s || k) AS h "
                "FROM unnest(%s::text[]) AS k ORDER BY h) AS keys",
                [_KEY_LOCKS, table.name, keys],
            )

    def _unlock_keys(self, table: Table, keys: list[str]) -> None:
        with self._pg().cursor() as cur:
            cur.execute(
                "SELECT pg_advisory_unlock(%s, h) FROM (SELECT DISTINCT hashtext(%s || k) AS h "
                "FROM unnest(%s::text[]) AS k) AS keys",
                [_KEY_LOCKS, table.name, keys],
            )

    def _reserve(self, table: Table, keys: list[str], rows: list[dict[str, Any]]) -> None:
        """Reserve the keys (UniqueViolation: one is taken) and, for trials, mark them unapplied
        in the tally, in one Postgres transaction before the DuckLake commit."""
        with self._pg_tx() as cur:
            if keys:
                cur.execute(
                    f"INSERT INTO {KEYS} (tbl, k) SELECT %s, unnest(%s::text[])",
                    [table.name, keys],
                )
            if table.name == "trials":
                self._mark_unapplied(cur, rows)

    @staticmethod
    def _mark_unapplied(cur: Cursor, rows: list[dict[str, Any]]) -> None:
        cur.execute(
            "INSERT INTO tally_unapplied (experiment_id, trial_key, attempt) "
            "SELECT * FROM unnest(%s::text[], %s::text[], %s::bigint[]) "
            "ON CONFLICT (experiment_id, trial_key, attempt) DO UPDATE SET at = now()",
            [
                [r["experiment_id"] for r in rows],
                [r["trial_key"] for r in rows],
                [r["attempt"] for r in rows],
            ],
        )

    def _put_rows(self, table: Table, rows: list[dict[str, Any]]) -> None:
        batch = pa.Table.from_pylist(rows, schema=table.arrow_schema())
        insert = lambda: self._retrying_insert(table, batch)  # noqa: E731
        if table.on_duplicate == "append":
            self._reserve(table, [], rows)
            self._stored(table, rows, insert)
            return
        keys = [self._key(table, rows[0])]
        self._lock_keys(table, keys)
        try:
            try:
                self._reserve(table, keys, rows)
            except psycopg2.errors.UniqueViolation:
                where, params = self._where(table, rows[0])
                stored = self._query(f"SELECT * FROM {table.name} WHERE {where} LIMIT 1", params)
                if stored:
                    if table.on_duplicate == "refuse":
                        raise self.duplicate_error(table, rows[0], "the DuckLake store") from None
                    self.check_same_content(
                        table, self._encoded(table, stored[0]), rows[0], "the DuckLake store"
                    )
                    return
                # its reserver died before its insert (we hold its lock): the key is ours
                self._reserve(table, [], rows)
            self._stored(table, rows, insert)
        finally:
            self._unlock_keys(table, keys)

    def _retrying_insert(self, table: Table, batch: pa.Table) -> None:
        with self._index_lock(table.name in _INDEXED), self._db() as con:
            self._retrying(con, lambda c: self._insert(c, table, batch))

    @contextmanager
    def _index_lock(self, needed: bool = True) -> Iterator[None]:
        """Hold _INDEX_LOCK (this thread's Postgres session) while experiment_index is written."""
        if not needed:
            yield
            return
        with self._pg().cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(%s)", [_INDEX_LOCK])
        try:
            yield
        finally:
            with self._pg().cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s)", [_INDEX_LOCK])

    def _stored(self, table: Table, rows: list[dict[str, Any]], insert: Any) -> None:
        """Run ``insert`` (the DuckLake commit) and keep the tally level with it: a trial's key
        is marked unapplied first (``_reserve``), applied after the commit, so a crash between
        is found. A failed insert gives its keys back."""
        try:
            insert()
        except BaseException:
            with self._pg_tx() as cur:
                if table.name == "trials":
                    self._forget_unapplied(cur, rows)
                if table.on_duplicate != "append":
                    cur.execute(
                        f"DELETE FROM {KEYS} WHERE tbl = %s AND k = ANY(%s::text[])",
                        [table.name, sorted({self._key(table, r) for r in rows})],
                    )
            raise
        if table.name == "trials":
            with self._pg_tx() as cur:
                _SQL.apply_trials(cur, [trial_row(r) for r in rows])
                self._forget_unapplied(cur, rows)
        elif table.name == "experiments":
            with self._pg_tx() as cur:
                _SQL.apply_experiments(cur, [(r["experiment_id"], r["author"]) for r in rows])

    @staticmethod
    def _forget_unapplied(cur: Cursor, rows: list[dict[str, Any]]) -> None:
        cur.execute(
            "DELETE FROM tally_unapplied WHERE (experiment_id, trial_key, attempt) IN "
            "(SELECT * FROM unnest(%s::text[], %s::text[], %s::bigint[]))",
            [
                [r["experiment_id"] for r in rows],
                [r["trial_key"] for r in rows],
                [r["attempt"] for r in rows],
            ],
        )

    @staticmethod
    def _encoded(table: Table, row: dict[str, Any]) -> dict[str, Any]:
        return table.to_row(table.from_row(row))

    @staticmethod
    def _insert(con: duckdb.DuckDBPyConnection, table: Table, batch: pa.Table) -> None:
        con.register("incoming", batch)
        try:
            con.execute("BEGIN")
            con.execute(f"INSERT INTO {table.name} BY NAME SELECT * FROM incoming")
            # the index rows these rows change, in the same transaction (schema.index_refresh)
            if table.name in _INDEXED:
                cols = ["experiment_id", "task" if table.name == "base_checks" else "trial_key"]
                scope = index_scope(table.name, batch.select(cols).to_pylist())
                for sql in index_refresh(*scope) if scope else []:
                    con.execute(sql)
            con.execute("COMMIT")
        finally:
            con.unregister("incoming")

    def _drop_orphan_tests(self, grade_row: dict[str, Any]) -> None:
        """Per-test rows of an attempt without a grade: a crash between the two writes."""
        grades, tests = BY_NAME["grades"], BY_NAME["grade_tests"]
        where, params = self._where(grades, grade_row)
        with self._db() as con:
            if con.execute(f"SELECT 1 FROM grades WHERE {where} LIMIT 1", params).fetchone():
                return  # graded: the second write is refused as a duplicate, tests and all
            if not con.execute(
                f"SELECT 1 FROM grade_tests WHERE {where} LIMIT 1", params
            ).fetchone():
                return

            def drop(c: duckdb.DuckDBPyConnection) -> None:
                c.execute("BEGIN")
                c.execute(f"DELETE FROM grade_tests WHERE {where}", params)
                c.execute("COMMIT")

            self._retrying(con, drop)
        with self._pg_tx() as cur:
            cur.execute(
                f"DELETE FROM {KEYS} WHERE tbl = %s AND k = %s",
                [tests.name, self._key(tests, grade_row)],
            )

    # ---- upkeep --------------------------------------------------------------------------

    def sync(self) -> int:
        return 0  # one engine, one truth: nothing to bring level

    def compact(self, keep_replaced_s: int = KEEP_REPLACED_S) -> int:
        """Write inlined rows out as Parquet, merge small files, drop files no snapshot needs.

        Returns how many data files fewer there are (in the catalog). Old snapshots, and the
        files a compaction replaced, are kept ``keep_replaced_s`` (an hour): a reader's open
        snapshot still lists them, and a writer's flush may run in the middle of it. 0 deletes
        them at once: only when no reader can be open (a test, a loader done with the lake).
        """
        with self._index_lock(), self._db() as con:
            before = self._files(con)
            self._retrying(
                con, lambda c: c.execute(f"CALL ducklake_flush_inlined_data('{CATALOG}')")
            )
            # the index's replaced rows are deletes: a file with any is written again without
            # them (DuckLake's default waits for 95% deleted), so no delete file outlives this
            self._retrying(
                con,
                lambda c: c.execute(
                    f"CALL ducklake_rewrite_data_files('{CATALOG}', 'experiment_index', "
                    "delete_threshold => 0)"
                ),
            )
            self._retrying(
                con, lambda c: c.execute(f"CALL ducklake_merge_adjacent_files('{CATALOG}')")
            )
            # cleanup_all would delete files an analyst's snapshot is reading (it did, under
            # the 8-writer test once batched puts flushed too)
            older = f"older_than => now() - INTERVAL {int(keep_replaced_s)} SECOND"
            con.execute(f"CALL ducklake_expire_snapshots('{CATALOG}', {older})")
            con.execute(f"CALL ducklake_cleanup_old_files('{CATALOG}', {older})")
            return before - self._files(con)

    @staticmethod
    def _files(con: duckdb.DuckDBPyConnection) -> int:
        got = con.execute(
            f"SELECT count(*) FROM __ducklake_metadata_{CATALOG}.ducklake_data_file "
            "WHERE end_snapshot IS NULL"
        ).fetchone()
        return int(got[0]) if got else 0

    # ---- reads ---------------------------------------------------------------------------

    def _query(self, sql: str, params: list[Any]) -> list[dict[str, Any]]:
        with self._db() as con:
            return _rows(con.execute(sql, params))

    # ---- the tally (results/tally.py), in the catalog's Postgres ---------------------------

    def _pg(self) -> psycopg2.extensions.connection:
        """This thread's Postgres connection for the tally and the keys (no lock shared between
        threads). Autocommit: a read is one round trip; ``_pg_tx`` brackets the writes."""
        con: psycopg2.extensions.connection | None = getattr(self._pg_local, "con", None)
        if con is None or con.closed:
            con = psycopg2.connect(self.paths.store.catalog)
            con.autocommit = True
            self._pg_local.con, self._pg_local.built = con, False
            with self._pg_all_lock:  # not self._lock: _connect (under it) opens one too
                self._pg_all.append(con)
        return con

    @contextmanager
    def _pg_tx(self) -> Iterator[Cursor]:
        """One Postgres transaction on this thread's connection, the tally's tables ready."""
        if not self._tally_ready:
            self._create_tally()
        with self._transaction() as cur:
            yield cur

    @contextmanager
    def _transaction(self) -> Iterator[Cursor]:
        con = self._pg()
        with con.cursor() as cur:
            cur.execute("BEGIN")
            try:
                yield cur
            except BaseException:
                if not con.closed:
                    cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")

    def _create_tally(self) -> None:
        with self._transaction() as cur:
            # one creator at a time: concurrent CREATE ... IF NOT EXISTS can still collide
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [_TALLY_LOCK])
            _SQL.create(cur)
            cur.execute(_UNAPPLIED_DDL)
            cur.execute(_KEYS_DDL)
        self._tally_ready = True

    @contextmanager
    def _tally(self) -> Iterator[tuple[TallySQL, Cursor]]:
        # once this thread's session saw it built, it stays so (a rebuild is one transaction)
        if not getattr(self._pg_local, "built", False):
            with self._pg_tx() as cur:
                if not _SQL.built(cur):
                    self._build_tally(cur)
            self._pg_local.built = True
        now = time.monotonic()
        if now - self._settled_at > SETTLE_EVERY_S:
            self._settled_at = now
            with self._pg_tx() as cur:
                self._settle_unapplied(cur)
        with self._pg().cursor() as cur:  # autocommit: each question one round trip
            yield _SQL, cur

    @contextmanager
    def _tally_write(self) -> Iterator[tuple[TallySQL, Cursor]]:
        with self._tally():  # built, as for a read
            pass
        with self._pg_tx() as cur:
            yield _SQL, cur

    def _build_tally(self, cur: Cursor) -> None:
        """Fill a new (or outdated) tally from the DuckLake's trials and experiments."""
        trials = self._query(f"SELECT {', '.join(TRIAL_COLUMNS)} FROM trials", [])
        authors = self._query("SELECT experiment_id, author FROM experiments", [])
        cur.execute("SELECT pg_advisory_xact_lock(%s)", [_TALLY_LOCK])
        if _SQL.built(cur):
            return  # another process built it meanwhile
        _SQL.rebuild(
            cur,
            [trial_row(r) for r in trials],
            [(r["experiment_id"], r["author"]) for r in authors],
        )
        # fresh statistics: planned on none, the start check's index lookups become table scans
        cur.execute(f"ANALYZE {', '.join(TALLY_TABLES)}")
        log.info("built the tally from %d trial attempt(s)", len(trials))

    def _settle_unapplied(self, cur: Cursor) -> None:
        """Settle trials marked unapplied long ago (normally none): their writer died after the
        DuckLake commit (the row is there: apply it) or before it (nothing stored: forget it)."""
        cur.execute(
            "SELECT experiment_id, trial_key, attempt, at FROM tally_unapplied "
            "WHERE at < now() - make_interval(secs => %s)",
            [UNAPPLIED_STALE_S],
        )
        for experiment_id, trial_key, attempt, at in cur.fetchall():
            stored = self._query(
                f"SELECT {', '.join(TRIAL_COLUMNS)} FROM trials "
                "WHERE experiment_id = ? AND trial_key = ? AND attempt = ?",
                [experiment_id, trial_key, attempt],
            )
            _SQL.apply_trials(cur, [trial_row(r) for r in stored])
            cur.execute(
                "DELETE FROM tally_unapplied WHERE experiment_id = %s AND trial_key = %s "
                "AND attempt = %s AND at = %s",
                [experiment_id, trial_key, attempt, at],
            )
            log.warning(
                "tally: %s %s attempt %s %s",
                experiment_id,
                trial_key,
                attempt,
                "applied after its writer died" if stored else "was never stored; forgotten",
            )

    def rebuild_tally(self) -> None:
        with self._pg_tx() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [_TALLY_LOCK])
            for name in TALLY_TABLES:
                cur.execute(f"DELETE FROM {name}")
            self._build_tally(cur)

    def _has_trials(self) -> bool:
        # the tally knows, without a DuckLake query (tens of ms through the catalog); stored
        # trials stay stored, so a yes is kept
        if not self._any_trials:
            with self._tally() as (_, cur):
                cur.execute("SELECT 1 FROM tally_attempts LIMIT 1")
                self._any_trials = cur.fetchone() is not None
        return self._any_trials

    def close(self) -> None:
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None
            for con in self._pg_all:
                con.close()
            self._pg_all.clear()


def with_rollback(con: duckdb.DuckDBPyConnection) -> None:
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass  # no transaction was open
