"""Where a partitioned run's cost goes in Dagster: per partition of the run's range, not per trial.

One asset shaped like hangar's trials (variant x task_rep, single-run backfill policy, metadata
per partition), with no work in its body, executed in-process on a fresh SQLite instance over
ranges of growing size. Per range it reports the three places a partition costs:

- planned: creating the run, which writes one ASSET_MATERIALIZATION_PLANNED event per partition
  of the range (or one event for the whole range with Dagster's
  DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS),
- body: from run start to the body's first line (execution plan, partition keys of the range),
- end: from the body's return to the run's end: one ASSET_MATERIALIZATION event per partition,
  written one by one (or in batches with DAGSTER_EVENT_BATCH_SIZE).

    .venv/bin/python benchmarks/partition_cost.py [--sizes 100,1000,5000] [--env ...]

Run without --env it measures each size under Dagster's defaults and under both switches.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

VARIANTS = 10
TASK_REPS = 5000  # 500 tasks x 10 trials: the 50,000-partition experiment

CHILD = r"""
import json, os, sys, time
import dagster as dg

size, n_variants, n_reps = (int(a) for a in sys.argv[1:4])
variants = dg.StaticPartitionsDefinition([f"v{i}" for i in range(n_variants)])
task_reps = dg.StaticPartitionsDefinition(
    [f"task{t:03d}.r{r}" for t in range(n_reps // 10) for r in range(1, 11)]
)
parts = dg.MultiPartitionsDefinition({"variant": variants, "task_rep": task_reps})
marks = {}

@dg.asset(partitions_def=parts, backfill_policy=dg.BackfillPolicy.single_run())
def trials(context: dg.AssetExecutionContext) -> None:
    marks["body"] = time.perf_counter()
    for pk in context.partition_keys:
        context.add_asset_metadata({"outcome": "ok", "attempt": 1, "duration_s": 1.0},
                                   partition_key=pk)
    marks["body_end"] = time.perf_counter()

job = dg.define_asset_job("trials_job", selection=[trials], executor_def=dg.in_process_executor)
defs = dg.Definitions(assets=[trials], jobs=[job])
keys = parts.get_partition_keys()
with dg.instance_for_test() as instance:
    job_def = defs.resolve_job_def("trials_job")
    t0 = time.perf_counter()
    result = job_def.execute_in_process(
        instance=instance,
        tags={"dagster/asset_partition_range_start": keys[0],
              "dagster/asset_partition_range_end": keys[size - 1]},
    )
    t_end = time.perf_counter()
    assert result.success
    planned = len(instance.get_records_for_run(
        result.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED, limit=100000
    ).records)
    mats = len(instance.get_records_for_run(
        result.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION, limit=100000
    ).records)
print(json.dumps({
    "size": size, "total_s": t_end - t0,
    "to_body_s": marks["body"] - t0, "body_s": marks["body_end"] - marks["body"],
    "end_s": t_end - marks["body_end"], "planned_events": planned, "materializations": mats,
}))
"""

SWITCHES = {
    "defaults": {},
    "subset-planned": {"DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS": "1"},
    "subset-planned+batch": {
        "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS": "1",
        "DAGSTER_EVENT_BATCH_SIZE": "1000",
    },
}


def measure(size: int, env: dict[str, str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as home:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(size), str(VARIANTS), str(TASK_REPS)],
            env=os.environ | env | {"DAGSTER_HOME": home},
            capture_output=True,
            text=True,
            check=True,
        )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000,5000")
    ap.add_argument("--switches", default=",".join(SWITCHES))
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    print(
        "| switches | partitions | planned events | run total s | start to body s | "
        "body s | body end to run end s | ms per partition |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for size in sizes:
        for name in args.switches.split(","):
            m = measure(size, SWITCHES[name])
            print(
                f"| {name} | {size} | {m['planned_events']:.0f} | {m['total_s']:.2f} | "
                f"{m['to_body_s']:.2f} | {m['body_s']:.2f} | {m['end_s']:.2f} | "
                f"{1000 * m['total_s'] / size:.1f} |",
                flush=True,
            )
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
