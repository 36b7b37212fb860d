"""The driver sensor's decisions at chosen instants, against a real (test) Dagster instance."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from zoneinfo import ZoneInfo

import dagster as dg

from hangar_dagster.config import paths
from hangar_dagster.plan import ResolvedExperiment
from hangar_dagster.sensors import DAEMON_MARKER, decide
from hangar_dagster.store import Store
from hangar_dagster.submit import submit
from hangar_dagster.window import parse_window
from tests import factories as f

NY = ZoneInfo("America/New_York")
NIGHTLY = parse_window("20:00-00:15")


def finished_run(instance: dg.DagsterInstance, exp: ResolvedExperiment, stage: str) -> None:
    instance.add_run(
        dg.DagsterRun(
            job_name=f"{exp.experiment_id}__{stage}_job",
            run_id=str(uuid.uuid4()),
            status=dg.DagsterRunStatus.SUCCESS,
            tags={"hangar/experiment": exp.experiment_id, "hangar/stage": stage},
        )
    )


def test_trials_wait_for_the_window_then_start_and_retry(
    example_dir: Path, hangar_home: Path
) -> None:
    exp = submit(example_dir / "experiment.yaml", paths())
    (paths().experiment_dir(exp.experiment_id) / DAEMON_MARKER).touch()
    with dg.instance_for_test() as instance:
        for stage in ("spec", "pin_sets", "base_checks"):
            finished_run(instance, exp, stage)

        afternoon = decide(instance, paths(), NIGHTLY, dt.datetime(2026, 7, 1, 14, 0, tzinfo=NY))
        assert afternoon.requests == []
        assert len(afternoon.waiting) == 1 and "eval_window" in afternoon.waiting[0]

        evening = decide(instance, paths(), NIGHTLY, dt.datetime(2026, 7, 1, 20, 0, tzinfo=NY))
        assert [r.run_key for r in evening.requests] == [f"{exp.experiment_id}:trials:1"]
        assert evening.requests[0].tags["hangar/queue"] == "eval"

        # After a trials run: every key done but one drained -> the index, then a retry run.
        store = Store(paths())
        for key in exp.trial_keys():
            v, t, r = key.key.split("/")
            drained = key.key == "plain/median/1"
            store.put(
                f.trial(
                    v,
                    t,
                    int(r),
                    experiment_id=exp.experiment_id,
                    outcome_class="infra_error" if drained else "completed",
                    infra_reason="power_down" if drained else None,
                )
            )
        finished_run(instance, exp, "trials")
        late = decide(instance, paths(), NIGHTLY, dt.datetime(2026, 7, 2, 0, 20, tzinfo=NY))
        assert [r.run_key for r in late.requests] == [f"{exp.experiment_id}:index:1"]
        assert "eval_window" in late.waiting[0]
        finished_run(instance, exp, "index")
        next_night = decide(instance, paths(), NIGHTLY, dt.datetime(2026, 7, 2, 20, 5, tzinfo=NY))
        assert [r.run_key for r in next_night.requests] == [f"{exp.experiment_id}:trials:2"]
