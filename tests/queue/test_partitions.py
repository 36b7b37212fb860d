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
    RUN_PARTITIONS,
    Grid,
    PartitionPlan,
    RunRange,
    longest_first,
    plan_partitions,
    run_range,
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


REPS = [f"t{t:03d}.r{r}" for t in range(500) for r in range(1, 11)]  # 500 tasks x 10 trials
VARIANTS = [f"v{i}" for i in range(10)]


def _key(rep: str, variant: str) -> TrialKey:
    return TrialKey.from_partition(variant, rep)


def test_a_fresh_50000_partition_experiment_runs_in_slices_of_at_most_the_limit() -> None:
    due = [_key(r, v) for r in REPS for v in VARIANTS]
    span = run_range(REPS, VARIANTS, due)
    assert span == RunRange((REPS[0], REPS[49]), (VARIANTS[0], VARIANTS[9]), 500, last=False)
    assert span.size == RUN_PARTITIONS
    rest = [k for k in due if REPS.index(k.task_rep) >= 50]
    after = run_range(REPS, VARIANTS, rest)
    assert after is not None and after.task_reps == (REPS[50], REPS[99]) and not after.last
    tail = [k for k in due if REPS.index(k.task_rep) >= len(REPS) - 50]
    assert run_range(REPS, VARIANTS, tail) == RunRange(
        (REPS[-50], REPS[-1]), (VARIANTS[0], VARIANTS[9]), 500, last=True
    )


def test_a_relaunch_over_scattered_keys_covers_a_narrow_range_not_the_partition_count() -> None:
    # Three retries far apart: the next run covers the first and the rows it can reach.
    due = [_key(REPS[7], "v3"), _key(REPS[9], "v5"), _key(REPS[4000], "v1")]
    span = run_range(REPS, VARIANTS, due)
    assert span == RunRange((REPS[7], REPS[9]), ("v3", "v5"), 9, last=False)
    one = run_range(REPS, VARIANTS, due[2:])
    assert one == RunRange((REPS[4000], REPS[4000]), ("v1", "v1"), 1)


def test_a_row_wider_than_the_limit_is_still_run_alone() -> None:
    due = [_key(REPS[0], v) for v in VARIANTS] + [_key(REPS[1], "v0")]
    span = run_range(REPS, VARIANTS, due, limit=4)
    assert span == RunRange((REPS[0], REPS[0]), ("v0", "v9"), 10, last=False)


def test_the_next_slice_planned_beside_a_running_one_shares_no_partition_with_it() -> None:
    """The driver plans the next slice without the keys of the one running (overlapping
    slices): a fresh experiment's next rectangle is disjoint, and a relaunch's ragged one that
    still reaches into the running rectangle is seen to overlap (it then waits)."""
    grid = Grid(REPS, VARIANTS)
    due = [_key(r, v) for r in REPS[:200] for v in VARIANTS]
    running = run_range(REPS, VARIANTS, due)
    assert running is not None
    rest = [k for k in due if not grid.covers(running, k)]
    assert len(rest) == len(due) - 500
    after = run_range(REPS, VARIANTS, rest)
    assert after is not None and not grid.overlap(running, after)
    assert after.task_reps[0] == REPS[50]

    narrow = RunRange((REPS[7], REPS[9]), ("v3", "v5"), 9, last=False)
    inside = grid.keys(narrow)  # an ended slice's keys, held back while another slice runs
    assert len(inside) == 9 and all(grid.covers(narrow, k) for k in inside)
    assert {(k.task_rep, k.variant) for k in inside} == {
        (r, v) for r in REPS[7:10] for v in ("v3", "v4", "v5")
    }
    assert grid.covers(narrow, _key(REPS[8], "v4")) and not grid.covers(narrow, _key(REPS[8], "v6"))
    # Keys outside it in rows it spans, on both sides of its columns: their rectangle crosses it.
    ragged = run_range(REPS, VARIANTS, [_key(REPS[8], "v1"), _key(REPS[9], "v8")])
    assert ragged is not None and grid.overlap(narrow, ragged) and grid.overlap(ragged, narrow)
    below = RunRange((REPS[10], REPS[12]), ("v0", "v9"), 30, last=True)
    assert not grid.overlap(narrow, below)


def test_nothing_due_has_no_range() -> None:
    assert run_range(REPS, VARIANTS, []) is None


def test_longest_expected_work_starts_first_and_unknown_keys_count_as_the_median() -> None:
    a, b, c, d = (_key(REPS[i], "v0") for i in range(4))
    assert longest_first([a, b, c, d], {a: 1.0, b: 10.0, c: 3.0}) == [b, c, d, a]
    assert longest_first([a, b, c], {}) == [a, b, c]  # no history: the given order
