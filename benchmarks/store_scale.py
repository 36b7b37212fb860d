"""The results store at scale: the example queries and views over a million trial rows, one put at
0 and at a million stored rows, and the file count, in each mode.

    .venv/bin/python benchmarks/store_scale.py [--rows 1000000] [--mode embedded|ducklake|both]
        [--repeat 5] [--compact-files 1000]

The rows: experiments shaped as issue 16's (10 variants x 500 tasks x 10 trials, 50,000 trial
keys each; 20 of them for a million rows), every tenth key an infra error retried by a second
attempt, a grade for every attempt that is not an infra error (one in fifty passes with a
tamper signal, one in twenty-five with no test run). They are loaded in batches straight into
the engine: the embedded store's DuckDB file and, beside it, its Parquet files as compaction
leaves them (one ``part@`` file per table and experiment: a million ``Store.put`` calls would
take days at the put cost below); the DuckLake through SQL inserts, then ``compact``. The
``experiment_index`` table is then rebuilt from the loaded tables, as a sync rebuilds it (timed:
``index rebuild s``; docs/data.md, "experiment_index: a table kept current"). The
embedded compaction itself is timed apart, on ``--compact-files`` small files of one partition
written as ``put`` writes them. Then, per mode:

- each of the six example queries of docs/data.md and a full read of ``experiment_index`` (a
  table) and the ``variant_summary`` view, from a fresh analyst connection (the embedded DuckDB file
  read-only; the DuckLake attached read-only as docs/data.md says), the answer fetched whole as
  an Arrow table (the engine's own result, what pandas or polars get; turning a million rows
  into Python tuples costs ten times the query and measures the client, not the store): median
  wall seconds and the process's CPU seconds of ``--repeat`` runs. The answer is fetched as
  docs/data.md tells a Python analyst to, through the relation API
  (``con.sql(q).to_arrow_table()``), where DuckDB builds the Arrow batches on all its threads;
  the full read of ``experiment_index`` is also timed through
  ``con.execute(q).fetch_arrow_table()``, which converts the result on one thread;
- one ``Store.put`` of a trial on an empty store and on the loaded one, interleaved (empty,
  loaded, empty, ...), median of ``--repeat`` each;
- the data files there are.

The load average is printed before and after: on a shared machine the wall figures move with it
and the CPU figures much less. The ducklake mode starts a private Postgres cluster (as the
tests do: initdb in a temp dir, Unix socket only). Figures go into docs/performance.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "results"))

import factories as f  # noqa: E402

from hangar_dagster.results import compaction  # noqa: E402
from hangar_dagster.results.lake import LakeStore, attach_sql  # noqa: E402
from hangar_dagster.results.schema import BY_NAME, INDEX_REBUILD  # noqa: E402
from hangar_dagster.results.store import Store, rebuild_index  # noqa: E402
from hangar_dagster.settings import HangarPaths, StoreConfig  # noqa: E402

VARIANTS, TASKS, REPS = 10, 500, 10
KEYS_PER_EXPERIMENT = VARIANTS * TASKS * REPS
NAMES = [
    "pass rate per variant",
    "pass counts per task",
    "infra errors by reason",
    "cost per variant",
    "tamper signals",
    "reused and fresh per variant",
]


def _sql_blocks() -> list[str]:
    doc = (ROOT / "docs" / "data.md").read_text()
    return re.findall(r"^```sql\n(.*?)^```", doc, flags=re.S | re.M)


def _experiment(i: int) -> str:
    return f"exp-{i:04d}"


def _attempts(lo: int, hi: int) -> list[tuple[int, int, int]]:
    """(key index, attempt, retried) for keys lo..hi: every tenth key has two attempts."""
    out = []
    for k in range(lo, hi):
        if k % 10 == 3:
            out += [(k, 1, 1), (k, 2, 0)]
        else:
            out.append((k, 1, 0))
    return out


def _columns(table: str, attempts: list[tuple[int, int, int]]) -> pa.Table:
    """The rows of ``table`` for these attempts, from one template row; keys and outcomes vary."""
    template = BY_NAME[table].to_row(f.trial() if table == "trials" else f.grade())
    if table == "grades":
        attempts = [a for a in attempts if not a[2]]
    n = len(attempts)
    exp, variant, task, rep = [], [], [], []
    for k, _, _ in attempts:
        within = k % KEYS_PER_EXPERIMENT
        exp.append(_experiment(k // KEYS_PER_EXPERIMENT))
        variant.append(f"v{within % VARIANTS}")
        task.append(f"t{(within // VARIANTS) % TASKS}")
        rep.append(1 + within // (VARIANTS * TASKS))
    schema = BY_NAME[table].arrow_schema()
    cols: dict[str, pa.Array] = {
        fl.name: pa.array([template[fl.name]] * n, type=fl.type) for fl in schema
    }
    cols["experiment_id"] = pa.array(exp)
    cols["variant"] = pa.array(variant)
    cols["task"] = pa.array(task)
    cols["replicate"] = pa.array(rep, pa.int64())
    cols["trial_key"] = pa.array(
        [f"{v}/{t}/{r}" for v, t, r in zip(variant, task, rep, strict=True)]
    )
    cols["attempt"] = pa.array([a for _, a, _ in attempts], pa.int64())
    if table == "trials":
        cols["outcome_class"] = pa.array(
            ["infra_error" if x else "completed" for *_, x in attempts]
        )
        cols["infra_reason"] = pa.array(["preempted" if x else None for *_, x in attempts])
        cols["run_id"] = pa.array([f"run-{k}-{a}" for k, a, _ in attempts])
    else:
        cols["passed"] = pa.array([k % 3 != 0 for k, _, _ in attempts])
        cols["tamper_signals"] = pa.array(
            ['["conftest.py"]' if k % 50 == 7 else "[]" for k, _, _ in attempts]
        )
        cols["hidden_tests"] = pa.array(
            [
                '{"errors": 0, "failed": 0, "passed": 0, "skipped": 3, "total": 3}'
                if k % 25 == 11
                else template["hidden_tests"]
                for k, _, _ in attempts
            ]
        )
    return pa.table([cols[fl.name] for fl in schema], schema=schema)


def batches(rows: int, chunk: int = 100_000) -> Iterator[tuple[str, pa.Table]]:
    """(table, rows) batches: ``rows`` trial rows in all, and the grades of their attempts."""
    keys = round(rows / 1.1)
    for lo in range(0, keys, chunk):
        attempts = _attempts(lo, min(keys, lo + chunk))
        for table in ("trials", "grades"):
            yield table, _columns(table, attempts)


def experiments(rows: int) -> list[str]:
    return [_experiment(i) for i in range(-(-round(rows / 1.1) // KEYS_PER_EXPERIMENT))]


def load(con: duckdb.DuckDBPyConnection, rows: int, parts: Path | None = None) -> None:
    """Insert the rows; with ``parts``, also write them as compaction's part files there."""
    by_part: dict[tuple[str, str], list[pa.Table]] = {}
    for table, batch in batches(rows):
        con.register("incoming", batch)
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM incoming")
        con.unregister("incoming")
        if parts is not None:
            for eid in sorted(set(batch.column("experiment_id").to_pylist())):
                mask = pc.equal(batch.column("experiment_id"), eid)
                by_part.setdefault((table, eid), []).append(batch.filter(mask))
    exp = BY_NAME["experiments"]
    for eid in experiments(rows):
        row = exp.to_row(f.experiment(experiment_id=eid))
        con.register("incoming", pa.Table.from_pylist([row], schema=exp.arrow_schema()))
        con.execute("INSERT INTO experiments BY NAME SELECT * FROM incoming")
        con.unregister("incoming")
    if parts is None:
        return
    for (table, eid), pieces in by_part.items():
        folder = parts / table / f"experiment_id={eid}"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.concat_tables(pieces), folder / f"{compaction.PART_PREFIX}bench.parquet")


def _in_transaction(con: duckdb.DuckDBPyConnection, work: Callable[[], Any]) -> None:
    con.execute("BEGIN")
    work()
    con.execute("COMMIT")


def timed(work: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """Median wall and CPU seconds of ``repeat`` runs of ``work``."""
    wall, cpu = [], []
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        work()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def queries(open_con: Callable[[], duckdb.DuckDBPyConnection], repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    con = open_con()
    con.execute("SET enable_progress_bar = false")
    for name, sql in zip(NAMES, _sql_blocks(), strict=True):
        out[name] = timed(lambda s=sql: con.sql(s).to_arrow_table(), repeat)
    for view in ("experiment_index", "variant_summary"):
        out[f"SELECT * FROM {view}"] = timed(
            lambda v=view: con.sql(f"SELECT * FROM {v}").to_arrow_table(), repeat
        )
    out["SELECT * FROM experiment_index (one thread)"] = timed(
        lambda: con.execute("SELECT * FROM experiment_index").fetch_arrow_table(), repeat
    )
    out["experiment_index rows"] = con.execute("SELECT count(*) FROM experiment_index").fetchone()
    con.close()
    return out


def puts(empty: Store, loaded: Store, repeat: int) -> dict[str, float]:
    """One put each on the empty and the loaded store, interleaved; medians."""
    times: dict[str, list[float]] = {"put, empty store": [], "put, loaded store": []}
    for i in range(repeat):
        for name, store in (("put, empty store", empty), ("put, loaded store", loaded)):
            t0 = time.perf_counter()
            store.put(f.trial("put", f"p{i}", experiment_id=_experiment(0)))
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def files(root: Path) -> int:
    return sum(1 for _ in root.rglob("*.parquet"))


def compaction_of(n: int, tmp: Path) -> dict[str, float]:
    """``n`` small trial files of one partition, written as put writes them, then compacted."""
    paths = HangarPaths(tmp / "compaction")
    table = BY_NAME["trials"]
    for i in range(n):
        row = table.to_row(f.trial("v0", f"t{i}", trace={"events": [{"type": "turn"}] * 40}))
        path = paths.parquet / table.relpath(row)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist([row], schema=table.arrow_schema()), path)
    store = Store(paths)
    t0 = time.perf_counter()
    removed = store.compact()
    took = time.perf_counter() - t0
    return {
        "small files": n,
        "compaction s": took,
        "files after": files(paths.parquet),
        "removed": removed,
    }


def run_embedded(rows: int, repeat: int, tmp: Path) -> dict[str, Any]:
    empty = Store(HangarPaths(tmp / "empty"))
    paths = HangarPaths(tmp / "embedded")
    store = Store(paths)
    store.experiments()  # the schema
    t0 = time.perf_counter()
    con = duckdb.connect(str(paths.duckdb))
    load(con, rows, parts=paths.parquet)
    out: dict[str, Any] = {"load s": time.perf_counter() - t0}
    # experiment_index from the loaded tables, as a sync rebuilds it
    out["index rebuild s"] = timed(lambda: _in_transaction(con, lambda: rebuild_index(con)), 1)
    con.close()
    out["data files"] = files(paths.parquet)
    # the registry of compacted keys, made from the parts (what a compaction keeps as it goes)
    t0 = time.perf_counter()
    store._compactor.registered(BY_NAME["trials"], BY_NAME["trials"].to_row(f.trial()))  # type: ignore[attr-defined]
    out["registry from the parts s"] = time.perf_counter() - t0
    out |= puts(empty, store, repeat)
    out |= queries(lambda: duckdb.connect(str(paths.duckdb), read_only=True), repeat)
    return out


def run_lake(rows: int, repeat: int, tmp: Path, catalog: str, empty_catalog: str) -> dict[str, Any]:
    def lake(name: str, cat: str) -> LakeStore:
        store = Store(
            HangarPaths(tmp / name, StoreConfig("ducklake", cat, str(tmp / f"{name}-data")))
        )
        assert isinstance(store, LakeStore)
        return store

    empty, store = lake("empty", empty_catalog), lake("loaded", catalog)
    t0 = time.perf_counter()
    with store._db() as con:
        load(con, rows)
        out: dict[str, Any] = {"load s": time.perf_counter() - t0}

        def rebuild() -> None:
            for sql in INDEX_REBUILD:
                con.execute(sql)

        out["index rebuild s"] = timed(lambda: _in_transaction(con, rebuild), 1)
    store.compact(keep_replaced_s=0)  # no reader yet: what it replaced goes now
    out["data files"] = files(tmp / "loaded-data")
    out |= puts(empty, store, repeat)

    def analyst() -> duckdb.DuckDBPyConnection:
        con = duckdb.connect()
        con.execute(attach_sql(catalog, read_only=True))
        return con

    out |= queries(analyst, repeat)
    empty.close()
    store.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--mode", choices=["embedded", "ducklake", "both"], default="both")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--compact-files", type=int, default=1000)
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()}", flush=True)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="hangar-store-bench-") as d:
        tmp = Path(d)
        if args.mode in ("embedded", "both"):
            results["embedded"] = run_embedded(args.rows, args.repeat, tmp / "e")
            results["embedded compaction"] = compaction_of(args.compact_files, tmp / "c")
        if args.mode in ("ducklake", "both"):
            from conftest import Cluster  # the tests' private Postgres cluster

            root = Path(tempfile.mkdtemp(prefix="hangar-pg-"))
            root.chmod(0o755)
            cluster = Cluster(root)
            cluster.start()
            try:
                results["ducklake"] = run_lake(
                    args.rows,
                    args.repeat,
                    tmp / "l",
                    cluster.new_database(),
                    cluster.new_database(),
                )
            finally:
                cluster.stop()
                shutil.rmtree(root, ignore_errors=True)  # the cluster's data (tens of MB)
    print(f"load average at end: {os.getloadavg()}")
    print(
        f"{args.rows:,} trial rows and their grades ({dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC); "
        f"median of {args.repeat}; wall s / CPU s"
    )
    for mode, figures in results.items():
        print(f"[{mode}]")
        for k, v in figures.items():
            if isinstance(v, tuple) and len(v) == 2:
                print(f"  {k:46s} {v[0]:8.3f} / {v[1]:.3f}")
            elif isinstance(v, float):
                print(f"  {k:46s} {v:8.3f}")
            else:
                print(f"  {k:46s} {v}")


if __name__ == "__main__":
    main()
