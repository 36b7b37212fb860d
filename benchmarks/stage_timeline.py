"""One experiment's stage runs, each run's timeline from the Dagster instance's records.

    DAGSTER_HOME=... [HANGAR_PG_URL=...] .venv/bin/python benchmarks/stage_timeline.py EID [SUBMIT]

For every run tagged with the experiment (oldest first): its stage, and seconds from the
submit (SUBMIT, epoch seconds; default the first run's creation) to the run's creation, its queueing (RUN_ENQUEUED), the
daemon's launch (RUN_STARTING), the worker up (RUN_START), its first step and its end; then
the gap from the previous run's end (the first: from the submit) to this run's creation (the sensor tick, or the CLI's next
call under ``run --wait``). deploy_overhead.py prints it for each mode; docs/performance.md
holds the table.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import dagster as dg  # noqa: E402

from hangar_dagster.orchestration.stages import TAG_EXPERIMENT, TAG_STAGE  # noqa: E402

ET = dg.DagsterEventType
MARKS = {
    ET.RUN_ENQUEUED: "queued",
    ET.RUN_STARTING: "launched",
    ET.RUN_START: "worker",
    ET.STEP_START: "step",
    ET.RUN_SUCCESS: "end",
    ET.RUN_FAILURE: "end",
}


def timeline(
    instance: dg.DagsterInstance, eid: str, t0: float | None = None
) -> list[dict[str, float | str | None]]:
    """Seconds since ``t0`` (the submit; default: the first run's creation)."""
    records = sorted(
        instance.get_run_records(dg.RunsFilter(tags={TAG_EXPERIMENT: eid})),
        key=lambda r: r.create_timestamp,
    )
    rows: list[dict[str, float | str | None]] = []
    if not records:
        return rows
    t0 = records[0].create_timestamp.timestamp() if t0 is None else t0
    prev_end: float | None = t0
    for rec in records:
        created = rec.create_timestamp.timestamp()
        row: dict[str, float | str | None] = {
            "stage": rec.dagster_run.tags.get(TAG_STAGE, "?"),
            "created": created - t0,
            "gap": None if prev_end is None else created - prev_end,
        }
        for entry in instance.all_logs(rec.dagster_run.run_id):
            event = entry.dagster_event
            if event is None or event.event_type not in MARKS:
                continue
            mark = MARKS[event.event_type]
            if mark not in row:  # the first of each (the first step)
                row[mark] = entry.timestamp - t0
        end = row.get("end")
        prev_end = t0 + end if isinstance(end, float) else None
        rows.append(row)
    return rows


def render(rows: list[dict[str, float | str | None]]) -> str:
    cols = ("created", "queued", "launched", "worker", "step", "end", "gap")
    out = ["stage        " + " ".join(f"{c:>8}" for c in cols) + "   create->step  run"]
    for row in rows:
        cells = []
        for c in cols:
            v = row.get(c)
            cells.append(f"{v:8.1f}" if isinstance(v, float) else f"{'-':>8}")
        c0, step, end = row.get("created"), row.get("step"), row.get("end")
        lead = (
            f"{step - c0:6.1f}" if isinstance(step, float) and isinstance(c0, float) else "     -"
        )
        run = f"{end - c0:6.1f}" if isinstance(end, float) and isinstance(c0, float) else "     -"
        out.append(f"{row['stage']!s:12} " + " ".join(cells) + f"   {lead}        {run}")
    return "\n".join(out)


def driver_ticks(instance: dg.DagsterInstance, since: float) -> str:
    """The experiment_driver sensor's ticks since ``since``: how many, their spacing and how long
    each evaluation took (none under ``run --wait``, which runs no daemon)."""
    from dagster._core.scheduler.instigation import InstigatorType

    for state in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
        if state.instigator_name != "experiment_driver":
            continue
        ticks = sorted(
            instance.get_ticks(state.instigator_origin_id, state.selector_id, after=since),
            key=lambda t: t.timestamp,
        )
        took = [t.end_timestamp - t.timestamp for t in ticks if t.end_timestamp]
        gaps = [b.timestamp - a.timestamp for a, b in zip(ticks, ticks[1:], strict=False)]
        if not ticks:
            return "experiment_driver: no ticks"
        return (
            f"experiment_driver: {len(ticks)} ticks, spacing median "
            f"{statistics.median(gaps) if gaps else 0:.1f} s, evaluation median "
            f"{statistics.median(took) if took else 0:.2f} s, max {max(took, default=0):.2f} s, "
            f"{sum(bool(t.run_ids) for t in ticks)} requested runs"
        )
    return "experiment_driver: no sensor state"


if __name__ == "__main__":
    with dg.DagsterInstance.get() as inst:
        print(render(timeline(inst, sys.argv[1], float(sys.argv[2]) if sys.argv[2:] else None)))
        first = inst.get_run_records(
            dg.RunsFilter(tags={TAG_EXPERIMENT: sys.argv[1]}),
            order_by="create_timestamp",
            ascending=True,
            limit=1,
        )
        if first:
            print(driver_ticks(inst, first[0].create_timestamp.timestamp() - 30))
