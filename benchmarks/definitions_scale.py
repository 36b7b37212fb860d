"""Definitions at scale: loading them with 1,000 stored experiments of which 10 are active.

    .venv/bin/python benchmarks/definitions_scale.py [--stored 1000] [--active 10] [--repeat 5]

Submits the bundled example (examples/skills-ab, cut to three tasks x three trials as the
tests run it) once, for real, then copies its resolved experiment (resolved.json and its store
row) under fresh ids into a new HANGAR_HOME until ``--stored`` experiments exist, oldest first, and archives all
but the newest ``--active``. The archive markers are written with
``catalog.write_archived``, what ``hangar experiment archive`` writes once its
checks pass (the copies never ran, so the command itself would refuse them).

Each measurement is a fresh Python process that imports Dagster and hangar's
orchestration package (reported apart, as "import"), then builds the definitions
and validates them as the webserver does (``dg.Definitions.validate_loadable``).
The reference is the same with ``--active`` stored experiments and none archived;
the ratio says what the archived ones cost. Prints medians of ``--repeat`` runs (wall
and CPU seconds: CPU is what a loaded machine does not inflate),
and the time of ``hangar experiment list`` on the large home. The figures go into
docs/performance.md ("Definitions at scale").
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import copy_example  # noqa: E402

# Run in a fresh process per measurement. The definitions module is imported against an
# empty home first, so whatever it builds at import is not counted as the load.
CHILD = """
import json, os, sys, time
t0 = time.perf_counter()
import dagster as dg
import hangar_dagster.orchestration.assets, hangar_dagster.orchestration.jobs
import hangar_dagster.orchestration.schedules, hangar_dagster.orchestration.sensors
home = os.environ["HANGAR_HOME"]
os.environ["HANGAR_HOME"] = sys.argv[1]
import hangar_dagster.orchestration.definitions as d
t1, c1 = time.perf_counter(), time.process_time()
os.environ["HANGAR_HOME"] = home
defs = d.build_definitions()
dg.Definitions.validate_loadable(defs)
t2, c2 = time.perf_counter(), time.process_time()
groups = {k.path[0] for k in defs.resolve_all_asset_keys()}
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "cpu_s": c2 - c1, "groups": len(groups)}))
"""


def env_for(home: Path) -> dict[str, str]:
    env = {**os.environ, "HANGAR_HOME": str(home), "HANGAR_EVAL_WINDOW": "always"}
    env["DAGSTER_HOME"] = str(home / "dagster")
    env["PYTHONWARNINGS"] = "ignore"
    return env


def template(work: Path) -> tuple[Path, str]:
    """A home with the example submitted once, for real; returns it and the experiment id."""
    # Cut to 3 tasks x 3 trials (18 partitions per experiment), as the tests run it: the size
    # the figures in docs/performance.md were measured at.
    example = copy_example(work / "example")
    home = work / "template-home"
    hangar = Path(sys.executable).with_name("hangar")
    done = subprocess.run(
        [str(hangar), "experiment", "run", str(example / "experiment.yaml")],
        env=env_for(home),
        check=True,
        capture_output=True,
        text=True,
    )
    return home, done.stdout.split("submitted ", 1)[1].split()[0]


def populate(src_home: Path, src_id: str, home: Path, stored: int, active: int) -> float:
    """``stored`` copies of the template experiment under fresh ids, all but ``active`` archived.

    Each row is written as the Parquet file ``Store.put`` would write, and one ``sync`` at the
    end brings them into DuckDB: the same store, without a DuckDB open and two fsyncs per row
    (seconds each on a loaded machine). Returns the seconds spent on the rows.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hangar_dagster.experiment.catalog import Archived, write_archived
    from hangar_dagster.experiment.plan import ResolvedExperiment
    from hangar_dagster.experiment.submit import RESOLVED, new_experiment_id
    from hangar_dagster.results.records import utcnow
    from hangar_dagster.results.schema import BY_MODEL
    from hangar_dagster.results.store import Store
    from hangar_dagster.settings import HangarPaths

    src_paths, paths = HangarPaths(src_home), HangarPaths(home)
    exp = ResolvedExperiment.model_validate_json(
        (src_paths.experiment_dir(src_id) / RESOLVED).read_text()
    )
    record = Store(src_paths).experiment(src_id)
    assert record is not None
    table = BY_MODEL[type(record)]
    start = exp.submitted_at - dt.timedelta(hours=stored)
    rows_s = 0.0
    for i in range(stored):
        eid = new_experiment_id(exp.name)
        at = start + dt.timedelta(hours=i)
        copy = exp.model_copy(update={"experiment_id": eid, "submitted_at": at})
        target = paths.experiment_dir(eid)
        target.mkdir(parents=True)
        (target / RESOLVED).write_text(copy.model_dump_json(indent=2))
        t0 = time.perf_counter()
        row = table.to_row(record.model_copy(update={"experiment_id": eid, "submitted_at": at}))
        path = paths.parquet / table.relpath(row)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist([row], schema=table.arrow_schema()), path)
        rows_s += time.perf_counter() - t0
        if i < stored - active:  # the oldest are archived, the newest stay active
            write_archived(paths, Archived(experiment_id=eid, at=utcnow(), by="benchmark"))
    t0 = time.perf_counter()
    Store(paths).sync()
    return rows_s + time.perf_counter() - t0


def measure(home: Path, empty: Path, repeat: int) -> list[dict[str, float]]:
    out = []
    for _ in range(repeat):
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(empty)],
            env=env_for(home),
            check=True,
            capture_output=True,
            text=True,
        )
        out.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


def time_list(home: Path, repeat: int) -> tuple[float, float]:
    """Median wall and CPU seconds of a whole ``hangar experiment list --json`` process."""
    hangar = Path(sys.executable).with_name("hangar")
    walls, cpus = [], []
    for _ in range(repeat):
        t0, before = time.perf_counter(), os.times()
        subprocess.run(
            [str(hangar), "experiment", "list", "--json"],
            env=env_for(home),
            check=True,
            capture_output=True,
        )
        after = os.times()
        walls.append(time.perf_counter() - t0)
        cpus.append(
            after.children_user
            + after.children_system
            - before.children_user
            - before.children_system
        )
    return statistics.median(walls), statistics.median(cpus)


def report(label: str, runs: list[dict[str, float]]) -> tuple[float, float]:
    load = statistics.median(r["load_s"] for r in runs)
    cpu = statistics.median(r["cpu_s"] for r in runs)
    imp = statistics.median(r["import_s"] for r in runs)
    groups = sorted({int(r["groups"]) for r in runs})
    each = ", ".join(f"{r['load_s']:.2f}" for r in runs)
    print(f"{label:<30}{load:>9.3f}{cpu:>9.3f}{imp:>10.3f}   groups {groups}  (load runs: {each})")
    return load, imp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stored", type=int, default=1000)
    parser.add_argument("--active", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--keep", type=Path, help="Build the homes here and keep them (to profile); must not exist."
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hangar-defs-bench-") as tmp:
        work = Path(tmp) if args.keep is None else args.keep
        work.mkdir(parents=True, exist_ok=args.keep is None)
        src_home, src_id = template(work)
        empty = work / "empty-home"
        big, ref = work / "big-home", work / "reference-home"
        t0 = time.perf_counter()
        rows_s = populate(src_home, src_id, big, args.stored, args.active)
        print(
            f"populated {args.stored} experiments ({args.active} active) in "
            f"{time.perf_counter() - t0:.1f} s ({rows_s:.1f} s of it store rows)"
        )
        populate(src_home, src_id, ref, args.active, args.active)
        print(f"{'case':<30}{'load s':>9}{'cpu s':>9}{'import s':>10}   (median of {args.repeat})")
        big_load, _ = report(
            f"{args.stored} stored / {args.active} active", measure(big, empty, args.repeat)
        )
        ref_load, _ = report(f"{args.active} stored / 0 archived", measure(ref, empty, args.repeat))
        print(f"ratio {args.stored} stored / {args.active} stored: {big_load / ref_load:.2f}")
        wall, cpu = time_list(big, 3)
        print(
            f"hangar experiment list --json, {args.stored} stored: {wall:.2f} s wall, "
            f"{cpu:.2f} s CPU (median of 3, whole process)"
        )


if __name__ == "__main__":
    main()
