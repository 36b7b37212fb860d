"""The start check and one put at 100, 10,000 and 100,000 stored trial attempts, in each mode.

    .venv/bin/python benchmarks/start_check.py [--sizes 100,10000,100000] [--repeat 50]
        [--mode embedded|ducklake|both] [--full-upto 10000]

Per size, one experiment holds that many trial attempts (4 variants; one key in 25 an
infra_error retried by a completed attempt 2, one in 50 ended in drift and one in 100 out of
retries, both left as they are, and 3 keys open for a retry at the end: ``_rows``; traces of 40
events), loaded in batches straight
into the engine (the embedded DuckDB file, or the DuckLake through SQL), then the tally is
built from those rows (``Store.rebuild_tally``, what a home from before the tally gets). Then,
as medians of ``--repeat`` calls: ``queue.starts.blocker`` (window, monthly budgets, breaker,
retry cap), ``next_attempt``, ``tokens_since`` (the TPM throttle's question), and,
as the median of 9, one ``Store.put`` of a new trial through the whole write path; then
``blocker`` again while another thread stores trials without pause (a trials run's other slots:
the check takes no lock a put holds). For sizes up
to ``--full-upto`` it also times the full recomputation the start check did before the tally
(every attempt's full row, JSON decoded, then the same rules), for the ratio. The ducklake mode
starts a private Postgres cluster (as the tests do: initdb in a temp dir, Unix socket only).
Figures go into docs/performance.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import duckdb
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "results"))

import factories as f  # noqa: E402

from hangar_dagster.queue import budget  # noqa: E402
from hangar_dagster.queue.retries import breaker_note, plan_retries  # noqa: E402
from hangar_dagster.queue.starts import blocker  # noqa: E402
from hangar_dagster.results.lake import LakeStore  # noqa: E402
from hangar_dagster.results.schema import BY_NAME  # noqa: E402
from hangar_dagster.results.store import Store  # noqa: E402
from hangar_dagster.settings import HangarPaths, Settings, StoreConfig  # noqa: E402

EXP = "exp-bench"
VARIANTS = 4
NOW = f.T0 + dt.timedelta(days=30)  # after every loaded attempt (one a second)


def _trace() -> dict[str, Any]:
    events = [
        {"type": "tool_call", "id": f"c{i}", "tool": "bash", "input": {"cmd": "pytest -q " * 4}}
        for i in range(40)
    ]
    return {"events": events, "turns": 40, "tokens_in": 1000, "tokens_out": 100}


def _rows(n: int) -> pa.Table:
    """``n`` attempts of EXP, keys v<k%4>/t<k//4>/1, one a second. Every 25th key failed once
    (preempted) and passed on attempt 2; every 50th ended in drift (never retried) and every
    100th ran out of retries (rate_limit three times): both stay the highest attempt of their
    key, so they grow with ``n``; the last 3 keys end in a preemption not yet retried (open,
    counted toward the cap, and the breaker's streak)."""
    template = BY_NAME["trials"].to_row(f.trial(trace=_trace(), cost_usd=0.001))
    out = []
    i = key = 0

    def add(variant: str, task: str, attempt: int, reason: str | None) -> None:
        nonlocal i
        at = f.T0 + dt.timedelta(seconds=i)
        out.append(
            template
            | dict(
                experiment_id=EXP,
                trial_key=f"{variant}/{task}/1",
                variant=variant,
                task=task,
                attempt=attempt,
                run_id=f"run-{i}",
                started_at=at - dt.timedelta(seconds=30),
                finished_at=at,
                outcome_class="completed" if reason is None else "infra_error",
                infra_reason=reason,
            )
        )
        i += 1

    while len(out) + 7 <= n:  # room for a key's 3 attempts, a measurement and the open keys
        variant, task = f"v{key % VARIANTS}", f"t{key // VARIANTS}"
        if key % 100 == 13:
            reasons: list[str | None] = ["rate_limit"] * 3
        elif key % 50 == 7:
            reasons = ["drift"]
        elif key % 25 == 0:
            reasons = ["preempted", None]
        else:
            reasons = [None]
        for attempt, reason in enumerate(reasons, 1):
            add(variant, task, attempt, reason)
        key += 1
    while len(out) < n - 3:  # measurements: the last one ends any earlier streak
        add(f"v{key % VARIANTS}", f"t{key // VARIANTS}", 1, None)
        key += 1
    for j in range(3):
        add("v0", f"open{j}", 1, "preempted")
    return pa.Table.from_pylist(out, schema=BY_NAME["trials"].arrow_schema())


def load(con: duckdb.DuckDBPyConnection, n: int, chunk: int = 20_000) -> None:
    table = _rows(n)
    for lo in range(0, n, chunk):
        con.register("incoming", table.slice(lo, chunk))
        con.execute("INSERT INTO trials BY NAME SELECT * FROM incoming")
        con.unregister("incoming")


def median_ms(work: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def full_check(store: Store, settings: Settings) -> None:
    """The start check as it read before the tally: every attempt's full row."""
    budget.month_status(store, "ana", NOW, settings.caps)  # (the ledger's rows, below)
    store.month_spend(budget.month_of(NOW))
    attempts = store.trials(EXP, all_attempts=True)
    breaker_note(attempts, settings.breaker_streak)
    plan_retries(attempts, 10**6, settings.infra_retries)


def measure(store: Store, n: int, repeat: int, full_upto: int) -> dict[str, float]:
    settings = Settings.from_env({"HANGAR_EVAL_WINDOW": "always"})
    # blocker reads of the experiment only its id, author and planned trial count
    exp: Any = SimpleNamespace(
        experiment_id=EXP,
        author="ana",
        variants={v: SimpleNamespace(tasks=[None] * (n // VARIANTS + 1)) for v in "abcd"},
        # A cap far above the synthetic spend: the experiment's budget is read on every check.
        spec=SimpleNamespace(trials=1, budget=SimpleNamespace(max_cost_usd=1e12)),
    )
    assert blocker(exp, store, settings, NOW) is None  # nothing blocks: the whole check runs
    state = store.start_state(EXP, settings.infra_retries)
    assert (len(state.streak), state.open_counted) == (3, 3), state
    assert store.next_attempt(EXP, "v0/t0/1") == 3
    out = {
        "blocker_ms": median_ms(lambda: blocker(exp, store, settings, NOW), repeat),
        "next_attempt_ms": median_ms(lambda: store.next_attempt(EXP, "v1/t1/1"), repeat),
        "tokens_since_ms": median_ms(
            lambda: store.tokens_since(NOW - dt.timedelta(minutes=1)), repeat
        ),
    }
    counter = iter(range(10**6))
    early = f.T0 - dt.timedelta(days=1)  # before every loaded attempt: no rule's answer moves

    def put(on: Store) -> None:
        on.put(
            f.trial(
                "put",
                f"p{next(counter)}",
                experiment_id=EXP,
                trace=_trace(),
                started_at=early - dt.timedelta(seconds=30),
                finished_at=early,
            )
        )

    out["put_ms"] = median_ms(lambda: put(store), 9)
    # The check while another thread of the process stores trials (as a trials run's slots
    # do): it takes no lock a put holds, so it does not wait for the writes.
    stop = threading.Event()
    writer = Store(store.paths)

    def write() -> None:
        while not stop.is_set():
            put(writer)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        time.sleep(0.5)
        out["blocker_ms_during_puts"] = median_ms(
            lambda: blocker(exp, store, settings, NOW), repeat
        )
    finally:
        stop.set()
        thread.join()
        if isinstance(writer, LakeStore):
            writer.close()
    assert blocker(exp, store, settings, NOW) is None
    if n <= full_upto:
        out["full_recompute_ms"] = median_ms(lambda: full_check(store, settings), 3)
    return out


def run_embedded(n: int, repeat: int, full_upto: int, tmp: Path) -> dict[str, float]:
    paths = HangarPaths(tmp / f"embedded-{n}")
    store = Store(paths)
    store.put(f.experiment(experiment_id=EXP))
    con = duckdb.connect(str(paths.duckdb))
    load(con, n)
    con.close()
    t0 = time.perf_counter()
    store.rebuild_tally()
    built = time.perf_counter() - t0
    return {"tally_build_s": built, **measure(store, n, repeat, full_upto)}


def run_lake(n: int, repeat: int, full_upto: int, tmp: Path, catalog: str) -> dict[str, float]:
    paths = HangarPaths(tmp / f"home-{n}", StoreConfig("ducklake", catalog, str(tmp / f"lake-{n}")))
    store = Store(paths)
    assert isinstance(store, LakeStore)
    store.put(f.experiment(experiment_id=EXP))
    with store._db() as con:
        load(con, n)
    store.compact()
    t0 = time.perf_counter()
    store.rebuild_tally()
    built = time.perf_counter() - t0
    try:
        return {"tally_build_s": built, **measure(store, n, repeat, full_upto)}
    finally:
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,10000,100000")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--mode", choices=["embedded", "ducklake", "both"], default="both")
    ap.add_argument("--full-upto", type=int, default=10_000)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[str, dict[int, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="hangar-start-bench-") as d:
        tmp = Path(d)
        if args.mode in ("embedded", "both"):
            results["embedded"] = {
                n: run_embedded(n, args.repeat, args.full_upto, tmp) for n in sizes
            }
        if args.mode in ("ducklake", "both"):
            from conftest import Cluster  # the tests' private Postgres cluster

            root = Path(tempfile.mkdtemp(prefix="hangar-pg-"))
            root.chmod(0o755)
            cluster = Cluster(root)
            cluster.start()
            try:
                results["ducklake"] = {
                    n: run_lake(n, args.repeat, args.full_upto, tmp, cluster.new_database())
                    for n in sizes
                }
            finally:
                cluster.stop()
    print(f"median of {args.repeat} calls (put: of 9); ms unless _s")
    for mode, by_size in results.items():
        print(f"[{mode}]")
        keys = list(next(iter(by_size.values())))
        print(f"  {'':22s}" + "".join(f"{n:>12,}" for n in by_size))
        for k in keys:
            cells = "".join(
                f"{by_size[n][k]:12.2f}" if k in by_size[n] else f"{'-':>12}" for n in by_size
            )
            print(f"  {k:22s}{cells}")


if __name__ == "__main__":
    main()
