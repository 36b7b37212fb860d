"""Local files of the embedded store: per-thread SQLite connections, and its journal entries.

The embedded store (results/store.py) and its compaction (results/compaction.py) keep small
SQLite files beside the Parquet tree (the tally, the registry of compacted keys): WAL, so
readers never wait and a writer holds a file for one short transaction. Both read the journal
(``HANGAR_HOME/pending/``): each entry is a record's Parquet file naming its place under
parquet/ (``journaled_path``).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq

_LOCAL = threading.local()

# The schema metadata key of a journal entry: the record file's path under parquet/.
JOURNAL_KEY = b"hangar.file"


def journaled_path(entry: Path) -> str | None:
    """The path under parquet/ a journal entry names; None for an older hangar's marker (its
    text is that path). FileNotFoundError when the entry is gone."""
    with open(entry, "rb") as fh:
        if fh.read(4) != b"PAR1":
            return None
    meta: dict[bytes, bytes] = pq.read_schema(entry).metadata or {}
    return meta[JOURNAL_KEY].decode()


def sqlite(path: Path, init: Callable[[sqlite3.Cursor, bool], None]) -> sqlite3.Connection:
    """This thread's connection to the SQLite file at ``path`` (WAL: readers never wait).

    ``init(cursor, new)`` runs in a write transaction whenever a connection is opened (``new``:
    the file did not exist before). Opened again when the file was replaced or removed (a
    rebuild), or after a fork.
    """
    if getattr(_LOCAL, "pid", None) != os.getpid():
        _LOCAL.pid, _LOCAL.conns = os.getpid(), {}
    conns: dict[Path, tuple[sqlite3.Connection, int]] = _LOCAL.conns
    try:
        inode = path.stat().st_ino
    except FileNotFoundError:
        inode = -1
    held = conns.get(path)
    if held is not None and held[1] == inode:
        return held[0]
    if held is not None:
        held[0].close()
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path, timeout=60.0, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    # FULL: a commit survives a power cut (a journal entry removed after it stays removed)
    con.execute("PRAGMA synchronous=FULL")
    with write(con) as cur:
        init(cur, inode == -1)
    conns[path] = (con, path.stat().st_ino)
    return con


@contextmanager
def write(con: sqlite3.Connection) -> Iterator[sqlite3.Cursor]:
    """One SQLite write transaction (taken at once: no upgrade deadlock between writers)."""
    cur = con.cursor()
    cur.execute("BEGIN IMMEDIATE")
    try:
        yield cur
    except BaseException:
        cur.execute("ROLLBACK")
        raise
    cur.execute("COMMIT")
