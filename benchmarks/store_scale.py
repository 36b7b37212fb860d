"""The results store at scale: the example queries and views over many trial rows, and one put.

    .venv/bin/python benchmarks/store_scale.py [--rows 1000000] [--mode embedded|ducklake|both]
        [--catalog 'host=... dbname=... user=...'] [--repeat 5]

Loads ``--rows`` trial rows and a grade for each (100 experiments, 4 variants, every trial
key's attempt 1; one in ten an infra error with a second attempt) straight into the engine
in batches: into the embedded store's DuckDB file (what its reads query; writing a million
one-row Parquet files through ``Store.put`` would take hours here, and reads never look at
them), and into the DuckLake through SQL inserts (Parquet files, then ``compact``). Then, per
mode, the median of ``--repeat`` runs of each of the five example queries of docs/data.md and
of a full read of the ``experiment_index`` and ``variant_summary`` views (from a fresh
analyst connection, as docs/data.md attaches it), and the median of ``--repeat`` single
``Store.put`` calls of a trial row on an empty store and on the loaded one. The ducklake mode
needs ``--catalog``: an empty Postgres database. Figures go into docs/performance.md.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import factories as f  # noqa: E402

from hangar_dagster.results.lake import LakeStore, attach_sql  # noqa: E402
from hangar_dagster.results.schema import BY_NAME  # noqa: E402
from hangar_dagster.results.store import Store  # noqa: E402
from hangar_dagster.settings import HangarPaths, StoreConfig  # noqa: E402

EXPERIMENTS, VARIANTS = 100, 4


def _sql_blocks() -> list[str]:
    doc = (ROOT / "docs" / "data.md").read_text()
    return re.findall(r"^```sql\n(.*?)^```", doc, flags=re.S | re.M)


def _batch(table: str, template: dict[str, Any], lo: int, hi: int) -> pa.Table:
    """Rows lo..hi of ``table`` from one template row; keys and outcomes vary per row."""
    n = hi - lo
    idx = list(range(lo, hi))
    exp = [f"exp-{i % EXPERIMENTS:04d}" for i in idx]
    variant = [f"v{(i // EXPERIMENTS) % VARIANTS}" for i in idx]
    task = [f"t{(i // (EXPERIMENTS * VARIANTS)) % 1000}" for i in idx]
    replicate = [1 + (i // (EXPERIMENTS * VARIANTS * 1000)) for i in idx]
    cols: dict[str, Any] = {}
    schema = BY_NAME[table].arrow_schema()
    for field in schema:
        cols[field.name] = pa.array([template[field.name]] * n, type=field.type)
    cols["experiment_id"] = pa.array(exp)
    cols["variant"] = pa.array(variant)
    cols["task"] = pa.array(task)
    cols["replicate"] = pa.array(replicate, pa.int64())
    cols["trial_key"] = pa.array(
        [f"{v}/{t}/{r}" for v, t, r in zip(variant, task, replicate, strict=True)]
    )
    if table == "trials":
        cols["outcome_class"] = pa.array(
            ["infra_error" if i % 10 == 0 else "completed" for i in idx]
        )
    if table == "grades":
        cols["passed"] = pa.array([i % 3 != 0 for i in idx])
    return pa.table([cols[fl.name] for fl in schema], schema=schema)


def load(con: duckdb.DuckDBPyConnection, rows: int, chunk: int = 100_000) -> None:
    templates = {
        "trials": BY_NAME["trials"].to_row(f.trial()),
        "grades": BY_NAME["grades"].to_row(f.grade()),
    }
    for table, template in templates.items():
        for lo in range(0, rows, chunk):
            batch = _batch(table, template, lo, min(rows, lo + chunk))
            con.register("incoming", batch)
            con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM incoming")
            con.unregister("incoming")
    exp = BY_NAME["experiments"]
    for i in range(EXPERIMENTS):
        row = exp.to_row(f.experiment(experiment_id=f"exp-{i:04d}"))
        con.register("incoming", pa.Table.from_pylist([row], schema=exp.arrow_schema()))
        con.execute("INSERT INTO experiments BY NAME SELECT * FROM incoming")
        con.unregister("incoming")


def median_s(work: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def put_s(store: Store, repeat: int, tag: str) -> float:
    counter = iter(range(10**6))
    return median_s(lambda: store.put(f.trial(f"put{tag}", f"p{next(counter)}")), repeat)


def queries(open_con: Any, repeat: int) -> dict[str, float]:
    out = {}
    names = ["pass rate per variant", "pass counts per task", "infra errors", "cost", "tamper"]
    con = open_con()
    for name, sql in zip(names, _sql_blocks(), strict=True):
        out[name] = median_s(lambda s=sql: con.execute(s).fetchall(), repeat)
    for view in ("experiment_index", "variant_summary"):
        out[view] = median_s(lambda v=view: con.execute(f"SELECT * FROM {v}").fetchall(), repeat)
    con.close()
    return out


def run_embedded(rows: int, repeat: int, tmp: Path) -> dict[str, Any]:
    empty = Store(HangarPaths(tmp / "empty"))
    put0 = put_s(empty, repeat, "0")
    paths = HangarPaths(tmp / "embedded")
    store = Store(paths)
    store.experiments()  # creates the schema
    t0 = time.perf_counter()
    con = duckdb.connect(str(paths.duckdb))
    load(con, rows)
    con.close()
    load_s = time.perf_counter() - t0
    put_n = put_s(store, repeat, "n")
    q = queries(lambda: duckdb.connect(str(paths.duckdb), read_only=True), repeat)
    return {"load_s": load_s, "put_0_s": put0, "put_n_s": put_n, **q}


def run_lake(rows: int, repeat: int, tmp: Path, catalog: str) -> dict[str, Any]:
    paths = HangarPaths(tmp / "home", StoreConfig("ducklake", catalog, str(tmp / "lake")))
    store = Store(paths)
    assert isinstance(store, LakeStore)
    put0 = put_s(store, repeat, "0")
    t0 = time.perf_counter()
    with store._db() as con:
        load(con, rows)
    store.compact()
    load_s = time.perf_counter() - t0
    files = sum(1 for _ in (tmp / "lake").rglob("*.parquet"))
    put_n = put_s(store, repeat, "n")

    def analyst() -> duckdb.DuckDBPyConnection:
        con = duckdb.connect()
        con.execute("SET enable_progress_bar = false")
        con.execute(attach_sql(catalog, read_only=True))
        return con

    q = queries(analyst, repeat)
    store.close()
    return {"load_s": load_s, "files": files, "put_0_s": put0, "put_n_s": put_n, **q}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--mode", choices=["embedded", "ducklake", "both"], default="both")
    ap.add_argument("--catalog", default="")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hangar-store-bench-") as d:
        tmp = Path(d)
        results = {}
        if args.mode in ("embedded", "both"):
            results["embedded"] = run_embedded(args.rows, args.repeat, tmp / "e")
        if args.mode in ("ducklake", "both"):
            if not args.catalog:
                sys.exit("--catalog: a libpq connection string of an empty Postgres database")
            results["ducklake"] = run_lake(args.rows, args.repeat, tmp / "l", args.catalog)
    print(f"rows: {args.rows} trials + {args.rows} grades; median of {args.repeat}")
    for mode, figures in results.items():
        print(f"[{mode}]")
        for k, v in figures.items():
            print(f"  {k:24s} {v:.4f}" if isinstance(v, float) else f"  {k:24s} {v}")


if __name__ == "__main__":
    main()
