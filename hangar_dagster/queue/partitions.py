"""Which trial keys a trials or grades run works on, which it keeps, and which it skips.

A run covers a range of its stage's partitions (a slice of the experiment's keys, or the few
a relaunch is for: docs/architecture.md, "Runs over pending work"), and each key in it is
sorted into exactly one of three: **run** (this stage's work for the key is
due), **kept** (a finished result exists and is reported as it is: a resumed
run loses and repeats nothing) or **skipped** (with why: the task is not in
this variant, or the key has nothing for this stage). The trials and grades
bodies both ask this one function.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from hangar_dagster.experiment.plan import ResolvedExperiment, TrialKey

T = TypeVar("T")

NOT_IN_VARIANT = "task not in this variant"
NOT_PENDING = "not pending"  # no finished attempt and not due: e.g. the retry rules refused it
NO_TRIAL = "no trial"


@dataclass(frozen=True)
class PartitionPlan(Generic[T]):
    run: list[TrialKey] = field(default_factory=list)
    kept: dict[TrialKey, T] = field(default_factory=dict)  # key -> its finished result
    skipped: dict[TrialKey, str] = field(default_factory=dict)  # key -> why


def plan_partitions(
    exp: ResolvedExperiment,
    keys: Iterable[TrialKey],
    due: Collection[str],
    finished: Mapping[str, T],
    missing: str,
) -> PartitionPlan[T]:
    """Sort ``keys``: skipped if the task is not in the key's variant, else run if due (trial
    keys in ``due``), else kept if ``finished`` has a result for it, else skipped as ``missing``.

    Due wins over finished: a key whose latest attempt is an infra error the retry rules allow
    again is run, not kept.
    """
    plan: PartitionPlan[T] = PartitionPlan()
    for key in keys:
        if key.task not in exp.variants[key.variant].tasks:
            plan.skipped[key] = NOT_IN_VARIANT
        elif key.key in due:
            plan.run.append(key)
        elif key.key in finished:
            plan.kept[key] = finished[key.key]
        else:
            plan.skipped[key] = missing
    return plan


# At most this many partitions in one trials run: what a run costs in Dagster grows with its
# partition range (planned and materialization events, metadata per partition; measured in
# docs/architecture.md, "Runs over pending work"), so a run covers a slice of the pending work.
RUN_PARTITIONS = 500


@dataclass(frozen=True)
class RunRange:
    """A rectangle of the trials partitions: task_reps ``first..last`` x variants ``low..high``.

    Dagster reads a range of a two-dimensional partitioning as a rectangle (each dimension's
    own range), so a run's partitions are named by its corners.
    """

    task_reps: tuple[str, str]
    variants: tuple[str, str]
    size: int  # partitions in the rectangle, due or not
    last: bool = True  # every due key is inside: no slice follows this one


def run_range(
    task_reps: Sequence[str],
    variants: Sequence[str],
    due: Iterable[TrialKey],
    limit: int = RUN_PARTITIONS,
) -> RunRange | None:
    """The next run's rectangle: from the first task_rep with due work, as many task_reps as keep
    the rectangle within ``limit`` partitions (at least one), over the variants those rows need.

    None when nothing is due. A relaunch over a few scattered keys thus costs a narrow range,
    never the experiment's whole partition count.
    """
    row_of = {t: i for i, t in enumerate(task_reps)}
    col_of = {v: i for i, v in enumerate(variants)}
    rows: dict[int, list[int]] = {}
    for key in due:
        rows.setdefault(row_of[key.task_rep], []).append(col_of[key.variant])
    if not rows:
        return None
    order = sorted(rows)
    first = order[0]
    low, high = min(rows[first]), max(rows[first])
    last = first
    for row in order[1:]:
        lo, hi = min(low, *rows[row]), max(high, *rows[row])
        if (row - first + 1) * (hi - lo + 1) > limit:
            break
        last, low, high = row, lo, hi
    return RunRange(
        (task_reps[first], task_reps[last]),
        (variants[low], variants[high]),
        (last - first + 1) * (high - low + 1),
        last == order[-1],  # every row with due keys, each one's columns all inside
    )


class Grid:
    """The trials partitions as rows (task_reps) x columns (variants), in partition order: which
    keys a run's rectangle covers, and whether two rectangles share a partition."""

    def __init__(self, task_reps: Sequence[str], variants: Sequence[str]) -> None:
        self.task_reps, self.variants = list(task_reps), list(variants)
        self.row = {t: i for i, t in enumerate(task_reps)}
        self.col = {v: i for i, v in enumerate(variants)}

    def _bounds(self, span: RunRange) -> tuple[int, int, int, int]:
        return (
            self.row[span.task_reps[0]],
            self.row[span.task_reps[1]],
            self.col[span.variants[0]],
            self.col[span.variants[1]],
        )

    def keys(self, span: RunRange) -> list[TrialKey]:
        """Every partition of ``span``, as trial keys."""
        top, bottom, left, right = self._bounds(span)
        return [
            TrialKey.from_partition(self.variants[c], self.task_reps[r])
            for r in range(top, bottom + 1)
            for c in range(left, right + 1)
        ]

    def covers(self, span: RunRange, key: TrialKey) -> bool:
        top, bottom, left, right = self._bounds(span)
        return top <= self.row[key.task_rep] <= bottom and left <= self.col[key.variant] <= right

    def overlap(self, a: RunRange, b: RunRange) -> bool:
        a_top, a_bottom, a_left, a_right = self._bounds(a)
        b_top, b_bottom, b_left, b_right = self._bounds(b)
        rows = a_top <= b_bottom and b_top <= a_bottom
        return rows and a_left <= b_right and b_left <= a_right


def longest_first(keys: Iterable[TrialKey], expected: Mapping[TrialKey, float]) -> list[TrialKey]:
    """``keys`` with the longest expected work first (a trial and its grade, from earlier runs of
    the same pin set and task): longest-processing-time order, which keeps a pool of slots from
    ending on one long trial started last. A key with no history counts as the median of those
    with one; with no history at all the order is kept (the sort is stable).
    """
    keys = list(keys)
    known = sorted(expected[k] for k in keys if k in expected)
    if not known:
        return keys
    middle = known[len(known) // 2]
    return sorted(keys, key=lambda k: -expected.get(k, middle))
