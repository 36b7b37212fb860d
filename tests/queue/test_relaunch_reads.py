"""A relaunch for a few keys reads those keys, not the experiment (issue 16 item 2).

The trials and grades step bodies of a run over a few finished keys of a larger experiment
(the example widened to 60 trial keys, each stored with a grade) are given a store whose reads
are counted: every row they get back that names a trial key names one of the run's keys. (The
queue's plan still counts the experiment's attempts in the tally, narrow rows: not counted here.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.experiment.submit import submit
from hangar_dagster.grading.stage import run_grades
from hangar_dagster.queue.restarts import StartedMarker
from hangar_dagster.results.records import Record
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings, paths
from hangar_dagster.trials.stage import run_trials
from tests import factories as f
from tests.conftest import write_spec

pytestmark = pytest.mark.unit


class Quiet:
    def info(self, msg: str) -> None: ...

    def warning(self, msg: str) -> None: ...


def never_in_flight(marker: StartedMarker) -> bool:
    return False


class CountedReads:
    """The store's rows as the steps got them: the trial keys they named, per query."""

    def __init__(self, store: Store) -> None:
        self.keys: list[str] = []
        self.rows = 0
        query = store._query

        def counted(sql: str, params: list[Any]) -> list[dict[str, Any]]:
            got = query(sql, params)
            self.rows += len(got)
            self.keys += [r["trial_key"] for r in got if "trial_key" in r]
            return got

        store._query = counted  # type: ignore[method-assign]


def widened(example_dir: Path) -> ResolvedExperiment:
    spec: dict[str, Any] = yaml.safe_load((example_dir / "experiment.yaml").read_text())
    spec.update(name="relaunch-reads", trials=10)
    return submit(write_spec(example_dir, spec), Settings.from_env())


def test_a_relaunch_of_a_few_keys_reads_only_those_keys(
    example_dir: Path, hangar_home: Path
) -> None:
    exp = widened(example_dir)
    keys = exp.trial_keys()
    assert len(keys) >= 50
    eid = exp.experiment_id
    pin = exp.variants[keys[0].variant].pin_set
    store = Store(paths())
    records: list[Record] = [f.base_check(t, experiment_id=eid) for t in exp.tasks]
    for k in keys:
        common: dict[str, Any] = dict(experiment_id=eid, run_id="run-first")
        records += [
            f.trial(k.variant, k.task, k.replicate, pin_set=pin, **common),
            f.grade(k.variant, k.task, k.replicate, **common),
        ]
    store.put_many(records)
    # A relaunch over three finished keys (a resume after a drain: all kept).
    few = [keys[3], keys[17], keys[41]]
    # The queue's plan reads the experiment's narrow attempt rows from the tally (SQLite, the
    # start check's index, docs/data.md); its first read after these puts fills it: done here.
    assert len(store.attempts(eid)) == len(keys)
    reads = CountedReads(store)
    ran = run_trials(
        exp, store, f.settings(), "run-again", few, in_flight=never_in_flight, log=Quiet()
    )
    graded = run_grades(exp, store, paths(), "run-again", few, f.settings())

    assert {k: (p.reused, p.record and p.record.run_id) for k, p in ran.items()} == {
        k: (True, "run-first") for k in few
    }
    assert {k: (p.grade and p.grade.run_id, p.reused) for k, p in graded.items()} == {
        k: ("run-first", True) for k in few
    }
    # What they read names only the run's keys (the whole experiment read 60 keys a table).
    assert set(reads.keys) == {k.key for k in few}
    assert reads.rows < len(keys)


def test_the_store_reads_a_subset_of_trial_keys(hangar_home: Path) -> None:
    store = Store(paths())
    store.put_many([r for t in ("t1", "t2", "t3") for r in (f.trial(task=t), f.grade(task=t))])
    assert [t.trial_key for t in store.trials(f.EXP, keys=["base/t2/1", "base/t9/1"])] == [
        "base/t2/1"
    ]
    assert [g.trial_key for g in store.grades(f.EXP, all_attempts=True, keys=[])] == []
    assert len(store.trials(f.EXP)) == 3
