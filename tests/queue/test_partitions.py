"""Which trial keys a trials or grades run runs, keeps or skips: one pure rule for both stages."""

from __future__ import annotations

from pathlib import Path

import pytest

from hangar_dagster.experiment.plan import ResolvedExperiment, TrialKey
from hangar_dagster.experiment.submit import submit
from hangar_dagster.queue.partitions import (
    NO_TRIAL,
    NOT_IN_VARIANT,
    NOT_PENDING,
    PartitionPlan,
    plan_partitions,
)
from hangar_dagster.settings import Settings

pytestmark = pytest.mark.unit

A = TrialKey("plain", "median", 1)
B = TrialKey("plain", "median", 2)
C = TrialKey("skill", "median", 1)
OUTSIDE = TrialKey("skill", "slugify", 1)  # skill runs only median below


@pytest.fixture
def exp(example_dir: Path, hangar_home: Path) -> ResolvedExperiment:
    """The example with its skill variant narrowed to the median task."""
    exp = submit(example_dir / "experiment.yaml", Settings.from_env())
    skill = exp.variants["skill"].model_copy(update={"tasks": ("median",)})
    return exp.model_copy(update={"variants": {**exp.variants, "skill": skill}})


def test_each_key_lands_in_exactly_one_place(exp: ResolvedExperiment) -> None:
    plan = plan_partitions(
        exp, [A, B, C, OUTSIDE], due={B.key}, finished={A.key: "a1"}, missing=NOT_PENDING
    )
    assert plan == PartitionPlan(
        run=[B], kept={A: "a1"}, skipped={C: NOT_PENDING, OUTSIDE: NOT_IN_VARIANT}
    )


def test_due_wins_over_a_finished_result(exp: ResolvedExperiment) -> None:
    # An infra error the retry rules allow again is the latest attempt, and it is run again.
    plan = plan_partitions(exp, [A], due={A.key}, finished={A.key: "infra_error"}, missing=NO_TRIAL)
    assert (plan.run, plan.kept, plan.skipped) == ([A], {}, {})


def test_a_task_outside_the_variant_is_skipped_even_when_due_or_finished(
    exp: ResolvedExperiment,
) -> None:
    plan = plan_partitions(
        exp, [OUTSIDE], due={OUTSIDE.key}, finished={OUTSIDE.key: 1}, missing=NO_TRIAL
    )
    assert (plan.run, plan.kept, plan.skipped) == ([], {}, {OUTSIDE: NOT_IN_VARIANT})


def test_keys_to_run_keep_the_order_they_were_given(exp: ResolvedExperiment) -> None:
    plan: PartitionPlan[int] = plan_partitions(
        exp, [C, A, B], due={A.key, B.key, C.key}, finished={}, missing=NO_TRIAL
    )
    assert plan.run == [C, A, B]


def test_nothing_due_nothing_finished_is_skipped_with_the_stage_reason(
    exp: ResolvedExperiment,
) -> None:
    plan: PartitionPlan[int] = plan_partitions(exp, [A, C], due=(), finished={}, missing=NO_TRIAL)
    assert plan.skipped == {A: NO_TRIAL, C: NO_TRIAL} and not plan.run and not plan.kept
