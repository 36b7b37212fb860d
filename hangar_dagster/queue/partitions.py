"""Which trial keys a trials or grades run works on, which it keeps, and which it skips.

A run covers every partition of its stage (one run per stage), so each key is
sorted into exactly one of three: **run** (this stage's work for the key is
due), **kept** (a finished result exists and is reported as it is: a resumed
run loses and repeats nothing) or **skipped** (with why: the task is not in
this variant, or the key has nothing for this stage). The trials and grades
bodies both ask this one function.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
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
