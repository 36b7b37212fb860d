"""Compaction of the embedded store's Parquet files: a million trials are not a million files.

``put`` writes one small file per record (results/store.py: linked whole or not at all, its
name refusing a second write of its key). Here the small files of one table and experiment (a
partition, ``<table>/experiment_id=<id>/``) are merged into one ``part@<time>-<random>.parquet``
file, and parts under ``PART_BYTES`` are merged again once there are more than
``MAX_SMALL_PARTS`` of them, so a partition holds a few parts plus fewer than ``COMPACT_AT`` new
small files, whatever the number of rows. Only the tables that grow with the trials are
compacted (``TABLES``); the others hold a few rows per experiment, task or variant.

The crash rule stays: a finished record is never lost and a half-written row never shows.

1. The part is written under a name no reader globs (``*.tmp-*``) and fsynced.
2. A journal entry (``HANGAR_HOME/compacting/<id>.json``: the part, its temporary name and the
   source files) is written and fsynced.
3. The part is linked to its final name: from here its rows are readable twice (in the part
   and in the sources) but never missing. Every reader of the tree takes each key once (the
   DuckDB tables' primary keys: ``sync``, a rebuild, the fallback reads).
4. The part's keys go into the registry (``HANGAR_HOME/compacted.sqlite``: table, key -> part)
   before any source is removed: a second ``put`` of a key whose file is gone finds it there
   and is refused, as the file's name refused it before.
5. The sources are removed, then the journal entry.

A compaction killed anywhere is finished by the next one (or the next ``EmbeddedStore``'s
first write): with its part linked, the part's keys are registered and the sources removed;
without, the temporary file is removed and nothing else changed. One compaction runs at a
time per home (an ``flock`` on ``HANGAR_HOME/compact.lock``); a put that would start one
while another runs leaves it to that one. Files a journal marker names (their DuckDB row or
tally row not yet confirmed) and per-test rows whose grade is not stored (a crash between the
two; the regrade replaces them) are left small until they are settled.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import logging
import os
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from hangar_dagster.results import local
from hangar_dagster.results.schema import BY_NAME, Table
from hangar_dagster.settings import HangarPaths
from hangar_dagster.util.fs import fsync

log = logging.getLogger(__name__)

# The tables whose rows grow with the trials; the rest keep one small file per record.
TABLES = ("trials", "grades", "grade_tests", "notes")
# A put that leaves this many small files in its partition compacts the partition.
COMPACT_AT = 256
# Parts under this size are merged again once a partition has more than MAX_SMALL_PARTS.
PART_BYTES = 128 * 1024 * 1024
MAX_SMALL_PARTS = 4
PART_PREFIX = "part@"  # "@" never appears in a small file's name (schema._safe escapes it)
# A temporary file older than this belongs to a dead writer.
STALE_TMP_S = 600.0

# one row per compacted key: its table, its key, the name of the part holding it (in the key's
# own partition folder)
_REGISTRY_DDL = (
    "CREATE TABLE IF NOT EXISTS compacted (tbl TEXT NOT NULL, k TEXT NOT NULL, "
    "part TEXT NOT NULL, PRIMARY KEY (tbl, k)) WITHOUT ROWID"
)


def key_of(table: Table, row: dict[str, Any]) -> str:
    """The registry's key of a row: its file's key columns (a whole grade's tests: one key)."""
    return "\x1f".join(str(row[c]) for c in table.file_key or table.key)


def is_small(name: str) -> bool:
    return name.endswith(".parquet") and not name.startswith(PART_PREFIX)


def is_part(name: str) -> bool:
    return name.endswith(".parquet") and name.startswith(PART_PREFIX)


@dataclass(frozen=True)
class Journal:
    """One compaction in flight (paths relative to parquet/)."""

    table: str
    part: str
    tmp: str
    sources: list[str]


class Compactor:
    """The embedded store's compaction and its registry of compacted keys."""

    def __init__(self, paths: HangarPaths) -> None:
        self.paths = paths
        self.root = paths.parquet
        self.journals = paths.home / "compacting"
        self.lock_file = paths.home / "compact.lock"
        self.registry = paths.home / "compacted.sqlite"

    # ---- the registry ----------------------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
        return local.sqlite(self.registry, self._init_registry)

    def _init_registry(self, cur: sqlite3.Cursor, new: bool) -> None:
        cur.execute(_REGISTRY_DDL)
        if not new:
            return
        # A missing registry (deleted, a home from before it): its keys are in the parts, which
        # is the one time the tree is listed.
        for name in TABLES:
            table = BY_NAME[name]
            if table.on_duplicate != "refuse" or not (self.root / name).is_dir():
                continue
            for part in (self.root / name).glob(f"*/{PART_PREFIX}*.parquet"):
                self._register(cur, table, part)

    def _register(self, cur: sqlite3.Cursor, table: Table, part: Path) -> None:
        cols = list(table.file_key or table.key)
        keys = pq.read_table(part, columns=cols).to_pylist()
        cur.executemany(
            "INSERT OR REPLACE INTO compacted (tbl, k, part) VALUES (?, ?, ?)",
            sorted({(table.name, key_of(table, r), part.name) for r in keys}),
        )

    def registered(self, table: Table, row: dict[str, Any]) -> str | None:
        """The part that holds ``row``'s key (relative to parquet/), if a compaction moved it."""
        if table.name not in TABLES or table.on_duplicate != "refuse":
            return None
        got = (
            self._db()
            .execute(
                "SELECT part FROM compacted WHERE tbl = ? AND k = ?",
                [table.name, key_of(table, row)],
            )
            .fetchone()
        )
        return str(Path(table.relpath(row)).parent / got[0]) if got else None

    # ---- compaction ----------------------------------------------------------------------

    @contextmanager
    def _locked(self, wait: bool) -> Iterator[bool]:
        """The home's compaction lock; yields False when ``wait`` is off and it is held."""
        self.lock_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_file, "a+b") as fh:  # closing it releases the flock
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True

    def after_put(self, table: Table, row: dict[str, Any]) -> None:
        """Compact ``row``'s partition once it holds COMPACT_AT small files (a put's last step)."""
        if table.name not in TABLES:
            return
        folder = (self.root / table.relpath(row)).parent
        with os.scandir(folder) as it:
            small = sum(1 for e in it if is_small(e.name))
        if small < COMPACT_AT:
            return
        with self._locked(wait=False) as held:
            if held:  # else another compaction runs: it or the next put's takes this one
                self._recover()
                self._compact(table, folder, min_small=COMPACT_AT)

    def recover(self) -> None:
        """Finish what a killed compaction left (nothing when none is in flight)."""
        if not self.journals.is_dir() or not any(self.journals.iterdir()):
            return
        with self._locked(wait=False) as held:
            if held:
                self._recover()

    def compact(self) -> int:
        """Compact every partition of the compacted tables; returns how many files fewer."""
        removed = 0
        with self._locked(wait=True):
            self._recover()
            for name in TABLES:
                folder = self.root / name
                if not folder.is_dir():
                    continue
                for part in sorted(p for p in folder.iterdir() if p.is_dir()):
                    removed += self._compact(BY_NAME[name], part, min_small=2)
        return removed

    def _settling(self) -> set[str]:
        """Files journal markers name: their rows are not confirmed in DuckDB and the tally."""
        out: set[str] = set()
        try:
            entries = list(os.scandir(self.paths.pending))
        except FileNotFoundError:
            return out
        for entry in entries:
            if entry.name.startswith("."):
                continue  # an entry being written: no file of its is linked yet
            try:
                rel = local.journaled_path(Path(entry.path))
                out.add(rel if rel is not None else Path(entry.path).read_text())
            except FileNotFoundError:
                continue
        return out

    def _graded(self, row: dict[str, Any]) -> bool:
        grades = BY_NAME["grades"]
        return (self.root / grades.relpath(row)).exists() or self.registered(
            grades, row
        ) is not None

    def _compact(self, table: Table, folder: Path, min_small: int) -> int:
        """Merge ``folder``'s small files (and its small parts, past MAX_SMALL_PARTS) into one
        part; returns how many files fewer. The caller holds the lock."""
        entries = list(os.scandir(folder))
        settling = self._settling()  # after the listing: a marker is written before its file
        now = time.time()
        small, parts = [], []
        for e in entries:
            rel = str(Path(e.path).relative_to(self.root))
            if ".tmp-" in e.name:
                if now - e.stat().st_mtime > STALE_TMP_S:  # a dead writer's
                    Path(e.path).unlink(missing_ok=True)
            elif is_part(e.name):
                parts.append(e)
            elif is_small(e.name) and rel not in settling:
                small.append(e)
        if table.name == "grade_tests":
            small = [e for e in small if self._graded(self._file_key_row(table, Path(e.path)))]
        if len(small) < min_small:
            small = []
        under = [e for e in parts if e.stat().st_size < PART_BYTES]
        merge = under if len(under) + (1 if small else 0) > MAX_SMALL_PARTS else []
        sources = [Path(e.path) for e in small + merge]
        if len(sources) < 2:
            return 0
        # Here, not at the top: pyarrow.dataset imports pandas (about 1 CPU s), which every
        # process importing the store (each stage run's worker, each CLI call) paid unused.
        import pyarrow.dataset as ds

        rows = ds.dataset(sources, schema=table.arrow_schema(), format="parquet").to_table()
        rows = _first_per_key(table, rows)
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        part = folder / f"{PART_PREFIX}{stamp}-{uuid.uuid4().hex[:8]}.parquet"
        tmp = part.with_name(f"{part.name}.tmp-{uuid.uuid4().hex}")
        try:
            pq.write_table(rows, tmp)
            fsync(tmp)
            journal = Journal(
                table.name,
                self._rel(part),
                self._rel(tmp),
                [self._rel(s) for s in sources],
            )
            entry = self._write_journal(journal)
            os.link(tmp, part)
            fsync(folder)
        finally:
            tmp.unlink(missing_ok=True)
        self._finish(journal, entry)
        log.info("compacted %d file(s) of %s into %s", len(sources), folder, part.name)
        return len(sources) - 1

    @staticmethod
    def _file_key_row(table: Table, path: Path) -> dict[str, Any]:
        first: dict[str, Any] = (
            pq.read_table(path, columns=list(table.file_key or table.key))
            .slice(0, 1)
            .to_pylist()[0]
        )
        return first

    def _rel(self, path: Path) -> str:
        return str(path.relative_to(self.root))

    def _write_journal(self, journal: Journal) -> Path:
        self.journals.mkdir(parents=True, exist_ok=True)
        entry = self.journals / f"{uuid.uuid4().hex}.json"
        with open(entry, "w") as fh:
            json.dump(journal.__dict__, fh)
            fh.flush()
            os.fsync(fh.fileno())
        fsync(self.journals)
        return entry

    def _finish(self, journal: Journal, entry: Path) -> None:
        """Steps 4 and 5: register the part's keys, remove the sources, then the journal."""
        table = BY_NAME[journal.table]
        part = self.root / journal.part
        if table.on_duplicate == "refuse":
            with local.write(self._db()) as cur:
                self._register(cur, table, part)
        for source in journal.sources:
            (self.root / source).unlink(missing_ok=True)
        fsync(part.parent)
        entry.unlink(missing_ok=True)
        fsync(self.journals)

    def _recover(self) -> None:
        try:
            entries = sorted(self.journals.iterdir())
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.suffix != ".json":
                continue
            journal = Journal(**json.loads(entry.read_text()))
            if (self.root / journal.part).exists():
                self._finish(journal, entry)
                log.warning("finished an interrupted compaction into %s", journal.part)
            else:
                (self.root / journal.tmp).unlink(missing_ok=True)
                entry.unlink(missing_ok=True)
                log.warning("dropped an interrupted compaction into %s", journal.part)


def _first_per_key(table: Table, rows: pa.Table) -> pa.Table:
    """``rows`` with each primary key once (the first): a part and a source of a compaction
    killed after its link hold the same rows."""
    keys = rows.select(list(table.key)).to_pylist()
    seen: set[tuple[Any, ...]] = set()
    keep = []
    for i, k in enumerate(keys):
        t = tuple(k.values())
        if t not in seen:
            seen.add(t)
            keep.append(i)
    return rows if len(keep) == rows.num_rows else rows.take(keep)
