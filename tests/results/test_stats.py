"""results/stats.py checked against scipy, statsmodels, t tables and hand enumerations."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest
from scipy.stats import binomtest, permutation_test, ttest_1samp
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.power import NormalIndPower, TTestPower
from statsmodels.stats.proportion import proportion_confint

from hangar_dagster.results.records import GradeTestRecord
from hangar_dagster.results.stats import (
    NoSharedTasks,
    compare,
    compare_experiments,
    hidden_test_flips,
    pair,
    paired_difference,
    pass_rate,
    power,
    sign_flip_can_reject,
    sign_flip_p,
    t_mde_sd,
    task_flips,
    wilson,
)

pytestmark = pytest.mark.unit

# The demo: 3 tasks x 3 trials, plain 4/9 and skill 7/9 (issue 13).
PLAIN = {"a": [True, False, False], "b": [True, False, False], "c": [True, True, False]}
SKILL = {"a": [True, True, False], "b": [True, True, True], "c": [True, True, False]}


def outcomes(*passes_of: tuple[int, int]) -> dict[str, list[bool]]:
    """{t0: [...], t1: [...]} from (passes, trials) per task."""
    return {f"t{i}": [True] * p + [False] * (k - p) for i, (p, k) in enumerate(passes_of)}


def sm_wilson_pts(count: float, n: float) -> tuple[float, float]:
    low, high = proportion_confint(count, n, alpha=0.05, method="wilson")
    return 100 * float(low), 100 * float(high)


# --- Wilson and the per-variant rate ----------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "n"), [(0, 9), (4, 9), (7, 9), (9, 9), (1, 1), (0.0, 2.59), (3.7, 5.5), (50, 200)]
)
def test_wilson_matches_statsmodels(count: float, n: float) -> None:
    low, high = wilson(count, n)
    assert (100 * low, 100 * high) == pytest.approx(sm_wilson_pts(count, n), abs=1e-9)


def test_the_demo_wilson_intervals_on_nine_trials_are_the_issues_numbers() -> None:
    assert [round(x, 1) for x in sm_wilson_pts(4, 9)] == [18.9, 73.3]
    assert [round(x, 1) for x in sm_wilson_pts(7, 9)] == [45.3, 93.7]


@pytest.mark.parametrize(
    ("rates", "naive"),
    [
        (PLAIN, (4, 9)),
        (outcomes((0, 3), (1, 3), (3, 3)), (4, 9)),
        (outcomes((0, 3), (2, 3), (2, 3)), (4, 9)),
        (SKILL, (7, 9)),
        (outcomes((1, 3), (3, 3), (3, 3)), (7, 9)),
    ],
)
def test_the_clustered_interval_contains_wilson_on_the_trials(
    rates: dict[str, list[bool]], naive: tuple[int, int]
) -> None:
    got = pass_rate(rates)
    low, high = sm_wilson_pts(*naive)
    assert got.pts == pytest.approx(100 * naive[0] / naive[1])
    assert got.low_pts <= low and got.high_pts >= high
    assert (got.n_tasks, got.n_trials) == (3, 9)


def test_the_effective_n_is_korn_graubards_by_hand() -> None:
    # tasks at 0, 2/4, 4/4: p = 0.5; Var of the mean of task means = s^2 / m = 0.25 / 3;
    # binomial Var = 0.25 / 12, so deff = 4; t(0.975, 11) = 2.2010 and t(0.975, 2) = 4.3027
    # from a t table.
    got = pass_rate(outcomes((0, 4), (2, 4), (4, 4)))
    n_eff = 12 / 4 * (2.2010 / 4.3027) ** 2
    assert got.n_eff == pytest.approx(n_eff, rel=1e-4)
    assert (got.low_pts, got.high_pts) == pytest.approx(sm_wilson_pts(0.5 * n_eff, n_eff), rel=1e-3)
    assert got.pts == 50.0


def test_no_clustering_and_many_tasks_is_nearly_wilson_on_the_trials() -> None:
    # 200 tasks, one trial each: the design effect is m / (m - 1) and t_199 / t_199 = 1.
    got = pass_rate(outcomes(*([(1, 1)] * 120 + [(0, 1)] * 80)))
    assert got.n_eff == pytest.approx(199.0)
    assert (got.low_pts, got.high_pts) == pytest.approx(sm_wilson_pts(120 * 199 / 200, 199))


@pytest.mark.parametrize("tasks", [2, 3, 5])
@pytest.mark.parametrize("passed", [False, True])
def test_zero_and_a_hundred_points_keep_a_width_and_stay_in_range(tasks: int, passed: bool) -> None:
    got = pass_rate({f"t{i}": [passed] * 3 for i in range(tasks)})
    assert got.pts == (100.0 if passed else 0.0)
    assert 0.0 <= got.low_pts < got.high_pts <= 100.0
    assert got.high_pts - got.low_pts > 20  # few tasks: far from certain
    assert (got.high_pts if not passed else got.low_pts) == pytest.approx(
        sm_wilson_pts(got.n_eff if passed else 0, got.n_eff)[1 if not passed else 0]
    )


def test_one_more_pass_does_not_jump_the_interval() -> None:
    # 60/60 and 59/60 on two tasks: the intervals at the edge and next to it are alike.
    full = pass_rate(outcomes((30, 30), (30, 30)))
    one_less = pass_rate(outcomes((30, 30), (29, 30)))
    assert abs(full.low_pts - one_less.low_pts) < 3


def test_one_task_is_wilson_on_its_trials() -> None:
    got = pass_rate(outcomes((5, 10)))
    assert (got.low_pts, got.high_pts) == pytest.approx(sm_wilson_pts(5, 10))
    assert (got.n_tasks, got.n_trials) == (1, 10)
    assert "1 task, 10 trials" in got.label and "one task" in got.method


def test_unequal_trials_weigh_each_task_once() -> None:
    got = pass_rate({"a": [True] * 8, "b": [False, False], "c": [], "d": [True, False]})
    assert got.pts == pytest.approx(100 * (1 + 0 + 0.5) / 3)  # c has no counted trial
    assert (got.n_tasks, got.n_trials) == (3, 12)


def test_no_counted_trial_is_an_error() -> None:
    with pytest.raises(ValueError, match="no counted trials"):
        pass_rate({"a": []})


def test_labels_are_points_with_interval_and_n() -> None:
    label = pass_rate(PLAIN).label
    assert re.fullmatch(r"44\.4 pts \(95% CI \d+\.\d-\d+\.\d; 3 tasks, 9 trials\)", label), label
    assert not re.search(r"(?<![\d.])0\.\d", label)  # no fraction anywhere


# --- the paired difference --------------------------------------------------------------------


def test_sign_flip_on_four_tasks_by_hand_and_by_scipy() -> None:
    d = [0.5, 0.25, -0.25, 1.0]
    # |sum| >= 1.5 over the 16 sign patterns of (1, .5, .25, .25): with +1 and +.5 the four
    # +-.25 patterns give 2.0, 1.5, 1.5, 1.0 (three hits), with +1 and -.5 none; times two for
    # the mirror image: 6 of 16.
    p, draws = sign_flip_p(d)
    assert (p, draws) == (6 / 16, None)
    ref = permutation_test(
        (np.array(d),),
        lambda x, axis: np.mean(x, axis=axis),
        permutation_type="samples",
        vectorized=True,
        n_resamples=np.inf,
    )
    assert p == pytest.approx(float(ref.pvalue))


def test_sign_flip_exact_matches_scipy_on_twelve_tasks() -> None:
    rng = np.random.default_rng(7)
    d = rng.integers(-3, 4, size=12) / 3  # ties and zeros as three trials per task give them
    ref = permutation_test(
        (d,), lambda x, axis: np.mean(x, axis=axis), permutation_type="samples",
        vectorized=True, n_resamples=np.inf,
    )  # fmt: skip
    assert sign_flip_p(d)[0] == pytest.approx(float(ref.pvalue))


def test_sign_flip_monte_carlo_past_twenty_tasks_is_seeded_and_says_so() -> None:
    rng = np.random.default_rng(3)
    d = (rng.integers(-1, 3, size=24) / 2).tolist()
    p1, draws = sign_flip_p(d, seed=11, resamples=20_000)
    assert draws == 20_000 and sign_flip_p(d, seed=11, resamples=20_000)[0] == p1
    ref = permutation_test(
        (np.array(d),), lambda x, axis: np.mean(x, axis=axis), permutation_type="samples",
        vectorized=True, n_resamples=200_000, rng=np.random.default_rng(5),
    )  # fmt: skip
    assert p1 == pytest.approx(float(ref.pvalue), abs=0.01)
    base = {f"t{i}": [True, False] for i in range(24)}
    variant = {f"t{i}": [x >= 0.5, x >= 1.0] for i, x in enumerate(d)}
    got = paired_difference(base, variant, seed=11, resamples=20_000)
    assert got.test == "sign-flip Monte Carlo (20000 draws, seed 11)"


def test_one_trial_per_task_is_mcnemar_exact() -> None:
    # 12 tasks, one trial each: 6 fixed, 1 broken, 3 pass in both, 2 fail in both.
    base = {f"t{i}": [v] for i, v in enumerate([False] * 6 + [True] + [True] * 3 + [False] * 2)}
    var = {f"t{i}": [v] for i, v in enumerate([True] * 6 + [False] + [True] * 3 + [False] * 2)}
    got = paired_difference(base, var)
    table = [[3, 1], [6, 2]]  # rows: baseline pass / fail; columns: variant pass / fail
    assert got.test == "McNemar exact"
    assert got.p_value == pytest.approx(float(binomtest(6, 7, 0.5).pvalue))
    assert got.p_value == pytest.approx(float(mcnemar(table, exact=True).pvalue))
    # with one trial per task the exact sign flip is the same test
    assert sign_flip_p(pair(base, var).diffs)[0] == pytest.approx(got.p_value)
    assert got.pts == pytest.approx(100 * 5 / 12)


def test_the_paired_interval_is_students_t_on_task_differences() -> None:
    # 20 trials a task: the task-level spread dominates the binomial floor.
    base = outcomes((10, 20), (4, 20), (16, 20), (10, 20), (2, 20))
    var = outcomes((10, 20), (14, 20), (20, 20), (5, 20), (17, 20))
    d = [(vb[0] - vb[1]) / 20 for vb in [(10, 10), (14, 4), (20, 16), (5, 10), (17, 2)]]
    pr = pair(base, var)
    assert np.var(d, ddof=1) / 5 > pr.within_var
    ci = ttest_1samp(d, 0.0).confidence_interval(0.95)
    got = paired_difference(base, var)
    assert (got.low_pts, got.high_pts) == pytest.approx((100 * ci.low, 100 * ci.high))
    assert got.pts == pytest.approx(100 * float(np.mean(d)))
    assert (got.n_tasks, got.baseline_trials, got.variant_trials) == (5, 100, 100)
    assert got.test == "sign-flip exact"


def test_equal_moves_still_leave_a_width_and_the_range_holds() -> None:
    base = {f"t{i}": [False] * 3 for i in range(4)}
    var = {f"t{i}": [True] * 3 for i in range(4)}
    got = paired_difference(base, var)
    assert got.pts == 100.0
    assert -100.0 <= got.low_pts < 100.0 and got.high_pts == 100.0
    assert got.p_value == pytest.approx(2 / 16)  # all up: 2 of 16 flips as extreme
    same = paired_difference(base, base)
    assert same.pts == 0 and same.low_pts < 0 < same.high_pts and same.p_value == 1.0


def test_the_demo_difference_is_not_a_finding() -> None:
    got = paired_difference(PLAIN, SKILL)
    assert got.pts == pytest.approx(100 * 3 / 9)
    assert got.low_pts < 0 < got.high_pts
    # diffs (1/3, 2/3, 0): |sum| >= 1 in 4 of the 8 flips
    assert got.p_value == pytest.approx(4 / 8)
    assert "+33.3 pts" in got.label and "3 tasks, 9 vs 9 trials" in got.label


def test_one_shared_task_excludes_nothing() -> None:
    got = paired_difference({"a": [True, False]}, {"a": [True, True], "b": [True]})
    assert (got.low_pts, got.high_pts) == (-100.0, 100.0)
    assert got.only_variant == ("b",) and got.n_tasks == 1


def test_no_shared_task_is_a_clear_error() -> None:
    with pytest.raises(NoSharedTasks, match="no task has counted trials in both"):
        paired_difference({"a": [True]}, {"b": [True]})
    with pytest.raises(NoSharedTasks, match="no variant of the two experiments shares a task"):
        compare_experiments({"plain": {"a": [True]}}, {"plain": {"b": [True]}})


def test_two_experiments_compare_variant_by_variant_over_shared_tasks() -> None:
    last_night = {"plain": PLAIN, "skill": SKILL, "gone": PLAIN}
    tonight = {"plain": {**PLAIN, "d": [True]}, "skill": PLAIN}
    got = compare_experiments(last_night, tonight)
    assert sorted(got) == ["plain", "skill"]
    assert got["plain"].difference.pts == 0 and got["plain"].difference.only_variant == ("d",)
    assert got["skill"].difference.pts == pytest.approx(-100 * 3 / 9)
    assert [f.direction for f in got["skill"].flips] == ["broken", "broken"]


# --- power ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 6, 10, 40])
def test_the_t_mde_matches_statsmodels(n: int) -> None:
    ref = TTestPower().solve_power(nobs=n, alpha=0.05, power=0.8, alternative="two-sided")
    assert t_mde_sd(n) == pytest.approx(float(ref), rel=1e-6)


def test_the_mde_is_the_standardized_mde_times_the_task_sd() -> None:
    base = outcomes(*[(p, 10) for p in (2, 5, 8, 3, 6, 9, 1, 4)])
    var = outcomes(*[(p, 10) for p in (6, 5, 10, 3, 9, 9, 4, 8)])
    got = power(base, var, min_effect_pts=20)
    ref = TTestPower().solve_power(nobs=8, alpha=0.05, power=0.8)
    assert got.mde_pts == pytest.approx(float(ref) * got.sd_task_diff_pts, rel=1e-6)
    # the same design analysed as a z test (statsmodels' one-sample normal power) detects less
    z_ref = NormalIndPower().solve_power(nobs1=8, alpha=0.05, power=0.8, ratio=0)
    assert got.mde_pts > float(z_ref) * got.sd_task_diff_pts
    need = TTestPower().solve_power(effect_size=20 / got.sd_task_diff_pts, alpha=0.05, power=0.8)
    assert got.tasks_needed == max(6, math.ceil(float(need)))
    assert got.sign_flip_can_reject and got.n_tasks == 8 and got.trials_per_task == 10
    assert got.label == (
        f"8 tasks x 10 trials detect {got.mde_pts:.1f} pts at 80% power; "
        f"20.0 pts needs {got.tasks_needed} tasks"
    )


def test_more_trials_help_only_the_binomial_part() -> None:
    got = power(PLAIN, SKILL, min_effect_pts=10)
    tasks = [p.tasks for p in got.plans]
    assert [p.trials_per_task for p in got.plans] == [1, 3, 5, 10]
    assert None not in tasks and tasks == sorted(tasks, key=lambda t: -(t or 0))
    assert got.tasks_needed == dict((p.trials_per_task, p.tasks) for p in got.plans)[3]
    # three tasks: no sign-flip p-value can reach 0.05, so more trials alone cannot answer it
    assert not got.sign_flip_can_reject and got.trials_needed is None
    assert got.label.startswith("3 tasks x 3 trials cannot detect any effect at 80% power; ")
    assert "no sign-flip test over 3 tasks can reach p < 0.05" in got.label


def test_trials_needed_is_the_first_that_reaches_the_power() -> None:
    base = outcomes(*[(1, 2)] * 10)
    var = outcomes(*[(2, 2)] * 10)
    got = power(base, var, min_effect_pts=30)
    assert got.trials_needed is not None and got.trials_needed >= 1
    assert got.between_sd_pts == 0.0  # every task moved the same: the spread is the trials'


@pytest.mark.parametrize(("n", "can"), [(1, False), (5, False), (6, True), (20, True)])
def test_sign_flip_can_reject_from_six_tasks(n: int, can: bool) -> None:
    assert sign_flip_can_reject(n) is can


# --- flips ------------------------------------------------------------------------------------


def test_task_flips_largest_move_first_with_both_rates() -> None:
    got = task_flips(PLAIN, SKILL)
    assert [(f.task, f.direction) for f in got] == [("b", "fixed"), ("a", "fixed")]
    assert (got[0].baseline_pts, got[0].variant_pts) == pytest.approx((100 / 3, 100.0))
    assert got[0].label == "b: fixed, 33.3 to 100.0 pts (3 vs 3 trials)"
    back = task_flips(SKILL, PLAIN)
    assert [(f.task, f.direction, round(f.move_pts, 1)) for f in back] == [
        ("b", "broken", -66.7),
        ("a", "broken", -33.3),
    ]


def grade_test_row(variant: str, task: str, rep: int, test_id: str, outcome: Any, msg: str | None = None) -> dict[str, Any]:  # fmt: skip
    """A row as a query over grade_tests returns it: every column of GradeTestRecord."""
    return GradeTestRecord(
        experiment_id="e1", trial_key=f"{variant}/{task}/{rep}", variant=variant, task=task,
        replicate=rep, attempt=1, test_id=test_id, outcome=outcome, duration_s=0.1,
        message=msg, on_base="fail_to_pass",
    ).model_dump()  # fmt: skip


def test_hidden_test_flips_by_name_with_the_graders_reason() -> None:
    base = [
        grade_test_row("plain", "t1", r, "test_x.py::test_a", o, m)
        for r, (o, m) in enumerate([("failed", "assert 1 == 2"), ("failed", "assert 1 == 2")])
    ] + [
        grade_test_row("plain", "t1", r, "test_x.py::test_b", "passed") for r in range(2)
    ] + [
        grade_test_row("plain", "t2", r, "test_x.py::test_a", "passed") for r in range(2)
    ] + [grade_test_row("plain", "t2", 0, "test_x.py::test_skip", "skipped")]  # fmt: skip
    var = [
        grade_test_row("skill", "t1", 0, "test_x.py::test_a", "passed"),
        grade_test_row("skill", "t1", 1, "test_x.py::test_a", "passed"),
        grade_test_row("skill", "t1", 0, "test_x.py::test_b", "passed"),
        grade_test_row("skill", "t1", 1, "test_x.py::test_b", "error", "ImportError: nope"),
        grade_test_row("skill", "t2", 0, "test_x.py::test_a", "passed"),
        grade_test_row("skill", "t2", 1, "test_x.py::test_a", "passed"),
        grade_test_row("skill", "t2", 0, "test_x.py::test_skip", "failed", "boom"),
    ]
    got = hidden_test_flips(base, var)
    assert [(f.task, f.test_id, f.direction, f.move_pts) for f in got] == [
        ("t1", "test_x.py::test_a", "fixed", 100.0),
        ("t1", "test_x.py::test_b", "broken", -50.0),
    ]  # t2's test_a passed in both; a skip is neither a pass nor a fail
    assert got[0].message == "assert 1 == 2"  # why it failed before it was fixed
    assert got[1].message == "ImportError: nope" and got[1].variant_runs == 2
    assert got[1].label == "t1 test_x.py::test_b: broken, 100.0 to 50.0 pts: ImportError: nope"


def test_compare_bundles_everything_for_one_variant() -> None:
    got = compare(PLAIN, SKILL, min_effect_pts=10)
    assert got.baseline.pts == pytest.approx(400 / 9) and got.variant.pts == pytest.approx(700 / 9)
    assert got.difference.n_tasks == 3 and got.power.min_effect_pts == 10
    assert [f.task for f in got.flips] == ["b", "a"]
