"""`hangar experiment get`'s state is one consistent view while grades land beside it.

The bug it pins: `get --json` read the summary and the trials first and the queue last, so a
grade stored between those reads was printed as "complete" beside a summary without it (the
Docker deployment's test polls for "complete" and took that stale summary: one trial graded
None). Grades only land, so reading the queue first makes every later read see what it counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hangar_dagster.cli.experiment import experiment_state
from hangar_dagster.results.store import Store
from tests.results.reports import graded_record, spec_file, stored

pytestmark = pytest.mark.integration

LATE = "skill/median/1"  # its grade lands while `get` reads
ONE = {"plain": {"median": [True]}, "skill": {"median": [True]}}  # one trial per variant


def small(example_dir: Path, name: str) -> tuple[Any, Store]:
    """The example cut to one task and one trial per variant, stored but for LATE's grade."""
    tasks = yaml.safe_load((example_dir / "experiment.yaml").read_text())["tasks"]
    edit = {"trials": 1, "tasks": [t for t in tasks if t["id"] == "median"]}
    return stored(spec_file(example_dir, name, edit), ONE, ungraded=[LATE])


class GradeLandsAtRead:
    """The real store; at its ``at``-th read a grader stores LATE's grade (as another process
    would between two of `get`'s reads)."""

    def __init__(self, store: Store, at: int, eid: str) -> None:
        self._store, self._at, self._eid, self.reads = store, at, eid, 0

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._store, name)
        if not callable(real) or name == "put":
            return real

        def read(*args: Any, **kw: Any) -> Any:
            self.reads += 1
            if self.reads == self._at:
                self._store.put(graded_record(self._eid, LATE, 1, True))
            return real(*args, **kw)

        return read


def test_complete_is_never_shown_beside_a_summary_read_before_the_last_grade(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    exp, store = small(example_dir, "get-race")
    record = store.find_experiment(exp.experiment_id)
    counted = GradeLandsAtRead(store, 10**6, exp.experiment_id)
    experiment_state(exp, counted, record, None)
    assert counted.reads > 3  # the moments below cover every read of one `get`
    seen_complete = 0
    for at in range(1, counted.reads + 2):
        # A fresh experiment each round: the grade must be missing when `get` starts.
        exp, store = small(example_dir, f"get-race-{at}")
        record = store.find_experiment(exp.experiment_id)
        out, _ = experiment_state(exp, GradeLandsAtRead(store, at, exp.experiment_id), record, None)
        graded = sum(s["graded"] for s in out["summary"])
        rows = {t["trial_key"]: t for t in out["trials"]}
        if out["queue"]["complete"]:
            seen_complete += 1
            assert graded == len(rows) and rows[LATE]["passed"] is not None, (at, out["summary"])
        else:
            assert out["queue"]["waiting_grades"] == 1, at
    # Stored before the first read, the grade is seen by all of them: complete.
    assert seen_complete >= 1
