"""The index stage's summary, without Dagster: per variant the pass rate, and why trials wait."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.queue.starts import pending, waiting_grades_note, waiting_reason
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings


@dataclass(frozen=True)
class IndexSummary:
    variants: list[dict[str, Any]]  # the variant_summary rows (variant, trials, passed, ...)
    trial_keys: int
    pending_trials: int
    waiting_for: str | None  # why pending trials are not started now (None: nothing waits)
    queue_notes: list[str]
    graded: int
    passed: int
    invalid_tasks: list[str]
    duckdb: Path
    waiting_grades: int = 0  # finished trials with no grade yet: the pass rate is not final

    @property
    def complete(self) -> bool:
        """Every trial that may run ran, and every finished one is graded."""
        return not self.pending_trials and not self.waiting_grades


def summarize(
    exp: ResolvedExperiment, store: Store, settings: Settings, now: dt.datetime
) -> IndexSummary:
    summary = store.summary(exp.experiment_id)
    work = pending(exp, store, settings)
    return IndexSummary(
        variants=summary,
        trial_keys=len(store.index(exp.experiment_id)),
        pending_trials=len(work.keys),
        # Why trials are still missing, if they are: the window, a spent budget, the breaker;
        # else why the pass rate is not final yet.
        waiting_for=(
            waiting_reason(exp, store, settings, now)
            if work.keys
            else waiting_grades_note(len(work.grades))
            if work.grades
            else None
        ),
        queue_notes=list(work.notes),
        graded=sum(int(s["graded"]) for s in summary),
        passed=sum(int(s["passed"]) for s in summary),
        invalid_tasks=[t for t, c in store.base_checks(exp.experiment_id).items() if c.invalid],
        duckdb=store.paths.duckdb,
        waiting_grades=len(work.grades),
    )
