"""What the Dagster instance says about experiments, in plain Python types for the CLI.

``hangar experiment list`` needs two facts only Dagster knows: which experiments have a
run in flight, and when each one's index was last written. Both come from three run
queries over the whole instance, however many experiments are stored.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import dagster as dg

from hangar_dagster.orchestration.instance import ensure_dagster_home
from hangar_dagster.orchestration.sensors import IN_FLIGHT, describe_run
from hangar_dagster.orchestration.stages import TAG_EXPERIMENT, TAG_INDEX, TAG_STAGE
from hangar_dagster.settings import Settings


@dataclass
class RunStatus:
    in_flight: dict[str, str] = field(default_factory=dict)  # experiment id -> its run, described
    indexed_at: dict[str, dt.datetime] = field(default_factory=dict)  # latest index run's end


def read_run_status(instance: dg.DagsterInstance) -> RunStatus:
    out = RunStatus()
    for record in instance.get_run_records(dg.RunsFilter(statuses=list(IN_FLIGHT))):
        exp = record.dagster_run.tags.get(TAG_EXPERIMENT)
        if exp is not None:
            out.in_flight.setdefault(exp, describe_run(record))
    # Index runs, and the runs that write the index besides (a regrade's trials run).
    records = [
        r
        for tags in ({TAG_STAGE: "index"}, {TAG_INDEX: "true"})
        for r in instance.get_run_records(
            dg.RunsFilter(tags=tags, statuses=[dg.DagsterRunStatus.SUCCESS])
        )
    ]
    for record in records:
        exp = record.dagster_run.tags.get(TAG_EXPERIMENT)
        if exp is None or record.end_time is None:
            continue
        ended = dt.datetime.fromtimestamp(record.end_time, dt.UTC)
        if exp not in out.indexed_at or ended > out.indexed_at[exp]:
            out.indexed_at[exp] = ended
    return out


def run_status(settings: Settings) -> RunStatus:
    """``read_run_status`` on the CLI's instance."""
    ensure_dagster_home(settings)
    with dg.DagsterInstance.get() as instance:
        return read_run_status(instance)
