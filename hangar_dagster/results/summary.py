"""The index stage's summary, without Dagster: per variant the pass rate, and why trials wait;
and the headline lines a terminal prints from the report."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.queue.starts import invalid_tasks, pending, waiting_grades_note, waiting_reason
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings
from hangar_dagster.util.fs import write_atomic

if TYPE_CHECKING:
    from hangar_dagster.results.report import Report


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
    unfinished: list[str] = field(default_factory=list)  # ``unfinished``: why it is not complete

    @property
    def complete(self) -> bool:
        """Every planned trial (of a valid task) has a counted attempt and a grade."""
        return not self.unfinished


def unfinished(
    exp: ResolvedExperiment, store: Store, settings: Settings, now: dt.datetime
) -> list[str]:
    """Why ``exp`` is not complete, one sentence per cause; empty when it is.

    Complete means every planned key of a valid task has a counted attempt (not an
    infra error) and that attempt has a grade. Keys of a task its base check found
    invalid never run by design (``queue.starts.pending``) and do not keep it open.
    """
    work = pending(exp, store, settings)
    out = []
    if work.keys:
        why = waiting_reason(exp, store, settings, now, work.keys) or "ready to start"
        out.append(f"{len(work.keys)} trial(s) not run: {why}")
    if work.grades:
        out.append(waiting_grades_note(len(work.grades)))
    invalid = invalid_tasks(exp, store)
    retried = set(work.retries)
    ended = sorted(
        t.trial_key
        for t in store.trials(exp.experiment_id)
        if t.outcome_class == "infra_error" and t.trial_key not in retried and t.task not in invalid
    )
    if ended:
        out.append(
            f"{len(ended)} trial(s) ended as infra_error with no retry: "
            + ("; ".join(work.notes) if work.notes else ", ".join(ended))
        )
    return out


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
            waiting_reason(exp, store, settings, now, work.keys)
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
        unfinished=unfinished(exp, store, settings, now),
    )


def headline(report: Report) -> list[str]:
    """The lines `run --wait` and `get` print under the summary table: each variant's points
    with interval and n, its paired difference against the baseline and the verdict, the
    invalid tasks by name, and the readback."""
    out = []
    for v in report.variants:
        name = f"{v.name} (baseline)" if v.is_baseline else v.name
        rate = v.rate.label if v.rate is not None else "no counted trial"
        line = f"{name}: {rate}"
        if v.difference is not None:
            line += f"; vs {report.baseline} {v.difference.label}"
            if v.verdict:
                line += f": {v.verdict}"
        if v.health.flagged_passes:
            line += f"; {v.health.flagged_passes} flagged pass(es) counted apart"
        out.append(line)
    if report.invalid_tasks:
        out.append(
            "invalid tasks, left out of every rate: "
            + "; ".join(
                f"{t} ({r or 'base check failed'})" for t, r in report.invalid_tasks.items()
            )
        )
    out += [f"readback: {line}" for line in report.readback]
    return out


def intervals(report: Report) -> dict[str, str]:
    """Variant -> its rate's 95% interval and n, for the summary table."""
    return {
        v.name: f"{v.rate.low_pts:.1f}-{v.rate.high_pts:.1f}; {v.rate.n_tasks}, {v.rate.n_trials}"
        for v in report.variants
        if v.rate is not None
    }


# What `run --wait` prints after the stages, as the index run computed it: the CLI reads it
# back instead of building the report a second time (the index step has just built it).
TERMINAL = "terminal.json"


@dataclass(frozen=True)
class Terminal:
    run_id: str  # the index run that wrote it: the CLI reads only its own run's
    intervals: dict[str, str]
    headline: list[str]
    unfinished: list[str]


def write_terminal(out_dir: Path, run_id: str, report: Report, summary: IndexSummary) -> Path:
    said = Terminal(run_id, intervals(report), headline(report), list(summary.unfinished))
    write_atomic(path := out_dir / TERMINAL, json.dumps(asdict(said)))
    return path


def read_terminal(out_dir: Path, run_id: str) -> Terminal | None:
    """What index run ``run_id`` wrote for the terminal; None if another run's, or unreadable."""
    try:
        said = Terminal(**json.loads((out_dir / TERMINAL).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return said if said.run_id == run_id else None
