"""What a relaunch of a few keys costs the trials and grades steps of a large experiment.

An experiment of --variants x --tasks x --trials keys (scale.py's widened copy of the example)
whose every key has a stored, graded attempt (synthetic records, put in one batch: a labelled
shortcut, the records are what a finished experiment holds) except --due scattered keys. The
relaunch is the run ``stages.stage_tags`` would make for those keys: its partition range
(``queue.partitions.run_range``), handed to the trials step body (``trials.stage.run_trials``)
and the grades step body (``grading.stage.run_grades``), as the trials run calls them. The due
keys' trials are not run (the step is asked only for its range's finished keys, all kept), so
what is measured is the steps' own reading and planning: process CPU seconds and the rows the
store returned to them. Run it from two checkouts (PYTHONPATH) for a before/after.

    .venv/bin/python benchmarks/relaunch_cost.py [--variants 10 --tasks 100 --trials 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", type=int, default=10)
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--due", type=int, default=5, help="scattered keys without a finished attempt")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hangar-relaunch-"))
    os.environ.update(HANGAR_HOME=str(tmp / "home"), HANGAR_EVAL_WINDOW="always")
    sys.path += [str(ROOT / "benchmarks"), str(ROOT)]  # after PYTHONPATH: a checkout to compare
    import scale

    scale.VARIANTS, scale.TASKS, scale.TRIALS = args.variants, args.tasks, args.trials
    import duckdb
    import pyarrow as pa

    import hangar_dagster
    from hangar_dagster.experiment.plan import TrialKey
    from hangar_dagster.experiment.submit import submit
    from hangar_dagster.grading.stage import run_grades
    from hangar_dagster.orchestration.stages import partitions
    from hangar_dagster.queue.partitions import run_range
    from hangar_dagster.results.schema import BY_MODEL
    from hangar_dagster.results.store import Store
    from hangar_dagster.settings import Settings
    from hangar_dagster.trials.stage import run_trials
    from tests import factories as f

    print(f"code: {Path(hangar_dagster.__file__).parents[1]}")
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    settings = Settings.from_env()
    exp = submit(scale.make_spec(tmp, 1), settings)
    eid = exp.experiment_id
    keys = exp.trial_keys()
    # Scattered over the first task_reps of every variant: the relaunch's range is a few hundred
    # partitions, most of them finished (a resume after a drain, retries of a few infra errors).
    reps = [f"{t}.r{r}" for t in exp.tasks for r in range(1, exp.spec.trials + 1)]
    names = list(exp.variants)
    due = sorted(
        {TrialKey.from_partition(names[i % len(names)], reps[7 * i]) for i in range(args.due)}
    )
    store = Store(settings.paths)
    t = time.perf_counter()
    done = [k for k in keys if k not in set(due)]
    pin = exp.variants[keys[0].variant].pin_set
    common: dict[str, Any] = dict(experiment_id=eid, run_id="run-old")
    records: list[Any] = [f.base_check(task, experiment_id=eid) for task in exp.tasks]
    records += [f.trial(k.variant, k.task, k.replicate, pin_set=pin, **common) for k in done]
    records += [f.grade(k.variant, k.task, k.replicate, **common) for k in done]
    # Straight into the engine in one batch per table (as start_check.py loads), then the tally.
    con = duckdb.connect(str(settings.paths.duckdb))
    for table in {BY_MODEL[type(r)] for r in records}:
        rows = [table.to_row(r) for r in records if BY_MODEL[type(r)] is table]
        con.register("incoming", pa.Table.from_pylist(rows, schema=table.arrow_schema()))
        con.execute(f"INSERT INTO {table.name} BY NAME SELECT * FROM incoming")
        con.unregister("incoming")
    con.close()
    store.rebuild_tally()
    print(f"stored {len(done)} graded trials in {time.perf_counter() - t:.1f} s")

    _, _, trials_def = partitions(exp)
    dims = {d.name: d.partitions_def.get_partition_keys() for d in trials_def.partitions_defs}
    span = run_range(dims["task_rep"], dims["variant"], due)
    assert span is not None
    reps = dims["task_rep"]
    rows = reps[reps.index(span.task_reps[0]) : reps.index(span.task_reps[1]) + 1]
    variants = dims["variant"]
    cols = variants[variants.index(span.variants[0]) : variants.index(span.variants[1]) + 1]
    ran = [TrialKey.from_partition(v, r) for r in rows for v in cols]
    # The due keys' trials would run; the finished ones of the range are what the step keeps.
    kept = [k for k in ran if k not in set(due)]
    read = {"rows": 0, "queries": 0}
    query = store._query

    def counted(sql: str, params: list[Any]) -> list[dict[str, Any]]:
        got = query(sql, params)
        read["rows"] += len(got)
        read["queries"] += 1
        return got

    store._query = counted  # type: ignore[method-assign]

    class Quiet:
        def info(self, msg: str) -> None: ...
        def warning(self, msg: str) -> None: ...

    print(
        f"trial keys: {len(keys)}; relaunch for {len(due)} due keys: range of {span.size} "
        f"partitions, {len(kept)} of them finished"
    )
    print("| step | CPU s | wall s | store queries | rows read |")
    print("|---|---|---|---|---|")
    for name, body in (
        (
            "trials",
            lambda: run_trials(
                exp, store, settings, "run-relaunch", kept, in_flight=lambda m: False, log=Quiet()
            ),
        ),
        ("grades", lambda: run_grades(exp, store, settings.paths, "run-relaunch", kept, settings)),
    ):
        read.update(rows=0, queries=0)
        c0, w0 = time.process_time(), time.perf_counter()
        out = body()
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        assert len(out) == len(kept)
        print(f"| {name} | {cpu:.2f} | {wall:.2f} | {read['queries']} | {read['rows']} |")
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
