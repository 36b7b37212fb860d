"""The statistics a result is read by: pass rates in points with clustered intervals, paired
differences against a baseline, power, and flips. Pure functions over plain data, no Dagster.

The input is, per variant, ``{task: [passed?, ...]}``: the 0/1 outcomes of that task's counted
trials. Every returned rate is in points (0-100); fractions stay inside this module. The formulas
and the reasons for them are in docs/report.md. scipy is imported inside the functions that
need it, since the CLI imports results/.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

Outcomes = Mapping[str, Sequence[bool]]  # task -> 0/1 outcomes of its counted trials

ALPHA = 0.05
POWER = 0.8
MAX_EXACT_TASKS = 20  # up to 2**20 sign flips are enumerated; beyond, a seeded Monte Carlo
RESAMPLES = 100_000
# A test's outcome as grade_tests stores it: these count as a pass or a fail; skipped, xfailed
# and xpassed say nothing about whether the patch fixed or broke it and are left out.
_TEST_PASS = frozenset({"passed"})
_TEST_FAIL = frozenset({"failed", "error"})


class NoSharedTasks(ValueError):
    """Two sets of outcomes have no task in common, so nothing can be paired."""


def _pts(fraction: float) -> float:
    return 100.0 * fraction


def _fmt(pts: float) -> str:
    return f"{pts:.1f}"


def _signed(pts: float) -> str:
    return f"{pts:+.1f}"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _z(confidence: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(0.5 + confidence / 2))


def _counted(outcomes: Outcomes) -> dict[str, list[bool]]:
    """The tasks with at least one counted trial (a task with none carries no information)."""
    return {task: [bool(o) for o in out] for task, out in sorted(outcomes.items()) if len(out)}


def _task_means(outcomes: Mapping[str, Sequence[bool]]) -> dict[str, float]:
    return {task: sum(out) / len(out) for task, out in outcomes.items()}


# --- one variant ------------------------------------------------------------------------------


def wilson(successes: float, n: float, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion, as fractions; n may be an effective (real) n."""
    if n <= 0:
        raise ValueError("wilson: n must be positive")
    z = _z(confidence)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Rate:
    """A variant's pass rate in points with its clustered 95% interval and its n."""

    pts: float
    low_pts: float
    high_pts: float
    n_tasks: int
    n_trials: int
    n_eff: float  # the effective number of independent trials the interval used
    design_effect: float  # n_trials / n_eff: how much clustering within tasks widens it
    method: str

    @property
    def label(self) -> str:
        return (
            f"{_fmt(self.pts)} pts (95% CI {_fmt(self.low_pts)}-{_fmt(self.high_pts)}; "
            f"{_n(self.n_tasks, 'task')}, {_n(self.n_trials, 'trial')})"
        )


def pass_rate(outcomes: Outcomes, confidence: float = 0.95) -> Rate:
    """Mean of the task pass rates, with a Wilson interval on the clustered effective n.

    Korn and Graubard's effective n: n_eff = N / deff, with the design effect deff = Var_tasks(p)
    / (p(1-p)/N) from the cluster-robust variance of the mean of task means (tasks as the
    independent units), never below 1; then scaled by (t_{N-1} / t_{m-1})**2 for having only m
    tasks to estimate that variance from. At 0 or 100 points the variance says nothing about
    clustering and deff is 1. With one task the interval is about that task alone.
    """
    from scipy.stats import t as student_t

    tasks = _counted(outcomes)
    if not tasks:
        raise ValueError("pass_rate: no counted trials")
    means = list(_task_means(tasks).values())
    m = len(means)
    n_trials = sum(len(o) for o in tasks.values())
    p = sum(means) / m
    if m < 2:
        n_eff = float(n_trials)
        method = "Wilson on the trials of the one task (about this task only, not tasks like it)"
    else:
        var = float(np.var(means, ddof=1)) / m
        deff = 1.0 if p in (0.0, 1.0) else max(1.0, var / (p * (1 - p) / n_trials))
        q = 0.5 + confidence / 2
        few = (float(student_t.ppf(q, n_trials - 1)) / float(student_t.ppf(q, m - 1))) ** 2
        n_eff = n_trials / deff * few
        method = "Wilson on the clustered effective n (Korn-Graubard, tasks as clusters)"
    low, high = wilson(p * n_eff, n_eff, confidence)
    return Rate(
        pts=_pts(p),
        low_pts=_pts(low),
        high_pts=_pts(high),
        n_tasks=m,
        n_trials=n_trials,
        n_eff=n_eff,
        design_effect=n_trials / n_eff,
        method=method,
    )


# --- a variant against its baseline -----------------------------------------------------------


@dataclass(frozen=True)
class Paired:
    """Task-level differences (variant minus baseline) over the tasks both ran, as fractions."""

    tasks: tuple[str, ...]
    diffs: tuple[float, ...]
    # Var(mean diff) from the binomial noise of the trials alone, add-one smoothed so that 0/k and
    # k/k still count as uncertain: the floor under the task-level variance.
    within_var: float
    per_trial_within: float  # mean over tasks of pA(1-pA) + pB(1-pB), smoothed
    trials_per_task: float  # mean trials per task and arm
    only_baseline: tuple[str, ...]
    only_variant: tuple[str, ...]
    baseline_trials: int
    variant_trials: int
    one_trial_each: bool

    @property
    def n(self) -> int:
        return len(self.diffs)

    @property
    def mean(self) -> float:
        return sum(self.diffs) / self.n

    def se(self) -> float:
        """Standard error of the mean difference: task-level, never under the trials' own noise."""
        task_var = float(np.var(self.diffs, ddof=1)) / self.n if self.n > 1 else 0.0
        return math.sqrt(max(task_var, self.within_var))


def pair(baseline: Outcomes, variant: Outcomes) -> Paired:
    a, b = _counted(baseline), _counted(variant)
    shared = tuple(t for t in a if t in b)
    if not shared:
        raise NoSharedTasks(
            "no task has counted trials in both: nothing to pair "
            f"(baseline: {sorted(a) or 'none'}; variant: {sorted(b) or 'none'})"
        )
    diffs, within, per_trial, ks = [], 0.0, 0.0, []
    for t in shared:
        ka, kb = len(a[t]), len(b[t])
        pa, pb = sum(a[t]) / ka, sum(b[t]) / kb
        diffs.append(pb - pa)
        sa, sb = (sum(a[t]) + 1) / (ka + 2), (sum(b[t]) + 1) / (kb + 2)
        within += sa * (1 - sa) / ka + sb * (1 - sb) / kb
        per_trial += sa * (1 - sa) + sb * (1 - sb)
        ks += [ka, kb]
    m = len(shared)
    return Paired(
        tasks=shared,
        diffs=tuple(diffs),
        within_var=within / (m * m),
        per_trial_within=per_trial / m,
        trials_per_task=sum(ks) / len(ks),
        only_baseline=tuple(t for t in a if t not in b),
        only_variant=tuple(t for t in b if t not in a),
        baseline_trials=sum(len(a[t]) for t in shared),
        variant_trials=sum(len(b[t]) for t in shared),
        one_trial_each=all(len(a[t]) == 1 and len(b[t]) == 1 for t in shared),
    )


def sign_flip_p(
    diffs: Sequence[float],
    *,
    seed: int = 0,
    max_exact: int = MAX_EXACT_TASKS,
    resamples: int = RESAMPLES,
) -> tuple[float, int | None]:
    """Two-sided sign-flip permutation p-value for mean(diffs) = 0.

    Returns (p, resamples): resamples is None when all 2**n flips were enumerated (exact), else
    the number of seeded Monte Carlo draws, with p = (1 + hits) / (1 + draws).
    """
    d = np.asarray(diffs, dtype=float)
    n = len(d)
    if n == 0:
        raise ValueError("sign_flip_p: no differences")
    observed = abs(float(d.sum()))
    tol = 1e-9 * max(1.0, observed)  # ties within float noise count as as-extreme
    if n <= max_exact:
        sums = np.zeros(1)
        for x in d:  # every signed sum, 2**n of them
            sums = np.concatenate([sums + x, sums - x])
        return float(np.mean(np.abs(sums) >= observed - tol)), None
    rng = np.random.default_rng(seed)
    hits, done, chunk = 0, 0, 10_000
    while done < resamples:
        size = min(chunk, resamples - done)
        signs = rng.choice(np.array([-1.0, 1.0]), size=(size, n))
        hits += int(np.sum(np.abs(signs @ d) >= observed - tol))
        done += size
    return (1 + hits) / (1 + resamples), resamples


def mcnemar_exact_p(discordant_up: int, discordant_down: int) -> float:
    """McNemar's exact test: the discordant pairs against Binomial(up + down, 1/2), two-sided."""
    from scipy.stats import binomtest

    n = discordant_up + discordant_down
    if n == 0:
        return 1.0
    return float(binomtest(discordant_up, n, 0.5).pvalue)


@dataclass(frozen=True)
class Difference:
    """Variant minus baseline in points, paired by task, with its interval and a paired test."""

    pts: float
    low_pts: float
    high_pts: float
    p_value: float
    test: str  # "sign-flip exact", "sign-flip Monte Carlo (N draws, seed S)", "McNemar exact"
    n_tasks: int  # tasks both ran
    baseline_trials: int  # over the shared tasks
    variant_trials: int
    only_baseline: tuple[str, ...]  # tasks left out of the pairing, by name
    only_variant: tuple[str, ...]

    @property
    def label(self) -> str:
        return (
            f"{_signed(self.pts)} pts (95% CI {_signed(self.low_pts)} to {_signed(self.high_pts)}; "
            f"p = {self.p_value:.3g}, {self.test}; {_n(self.n_tasks, 'task')}, "
            f"{self.baseline_trials} vs {self.variant_trials} trials)"
        )


def paired_difference(
    baseline: Outcomes,
    variant: Outcomes,
    *,
    confidence: float = 0.95,
    seed: int = 0,
    max_exact: int = MAX_EXACT_TASKS,
    resamples: int = RESAMPLES,
) -> Difference:
    """The mean over shared tasks of (variant rate - baseline rate), a t interval on the task
    differences (df = tasks - 1), and an exact paired p-value.

    Raises NoSharedTasks when the two have no task in common.
    """
    from scipy.stats import t as student_t

    pr = pair(baseline, variant)
    if pr.n < 2:
        low, high = -1.0, 1.0  # one task: no spread to estimate, so nothing is excluded
    else:
        half = float(student_t.ppf(0.5 + confidence / 2, pr.n - 1)) * pr.se()
        low, high = max(-1.0, pr.mean - half), min(1.0, pr.mean + half)
    if pr.one_trial_each:
        up = sum(1 for x in pr.diffs if x > 0)
        down = sum(1 for x in pr.diffs if x < 0)
        p, test = mcnemar_exact_p(up, down), "McNemar exact"
    else:
        p, draws = sign_flip_p(pr.diffs, seed=seed, max_exact=max_exact, resamples=resamples)
        test = (
            "sign-flip exact"
            if draws is None
            else f"sign-flip Monte Carlo ({draws} draws, seed {seed})"
        )
    return Difference(
        pts=_pts(pr.mean),
        low_pts=_pts(low),
        high_pts=_pts(high),
        p_value=p,
        test=test,
        n_tasks=pr.n,
        baseline_trials=pr.baseline_trials,
        variant_trials=pr.variant_trials,
        only_baseline=pr.only_baseline,
        only_variant=pr.only_variant,
    )


# --- power ------------------------------------------------------------------------------------


def t_power(effect_sd: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided one-sample t test at a standardized effect, by the noncentral t."""
    from scipy.stats import nct
    from scipy.stats import t as student_t

    if n < 2:
        return 0.0
    df = n - 1
    crit = float(student_t.ppf(1 - alpha / 2, df))
    nc = effect_sd * math.sqrt(n)
    upper, lower = float(nct.sf(crit, df, nc)), float(nct.cdf(-crit, df, nc))
    # scipy's nct gives NaN far out in a tail, where the tail is 1 (upper) or 0 (lower)
    return (1.0 if math.isnan(upper) else upper) + (0.0 if math.isnan(lower) else lower)


def t_mde_sd(n: int, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The standardized effect the two-sided one-sample t test detects with this power."""
    from scipy.optimize import brentq

    if n < 2:
        return None
    hi = 1.0
    while t_power(hi, n, alpha) < power:  # bracket the root without straying into NaN tails
        hi *= 2
    return float(brentq(lambda e: t_power(e, n, alpha) - power, 1e-9, hi, xtol=1e-12))


def sign_flip_can_reject(n_tasks: int, alpha: float = ALPHA) -> bool:
    """The smallest two-sided sign-flip p-value over n tasks is 2 / 2**n: at n <= 5 it is > 0.05."""
    return n_tasks >= 1 and 2.0 / 2**n_tasks <= alpha


@dataclass(frozen=True)
class Plan:
    trials_per_task: int
    tasks: int | None  # None: not within 10 000 tasks


@dataclass(frozen=True)
class Power:
    """What this design can detect, and what a given effect would need."""

    n_tasks: int
    trials_per_task: float
    sd_task_diff_pts: float  # SD of one task's difference at this many trials per task
    between_sd_pts: float  # SD of the true task differences (the part more trials cannot remove)
    mde_pts: float | None  # None with fewer than 2 tasks
    sign_flip_can_reject: bool  # False: no p-value below alpha at this n, whatever the effect
    min_effect_pts: float | None
    tasks_needed: int | None  # at the current trials per task
    trials_needed: int | None  # at the current tasks; None: more trials alone do not get there
    plans: tuple[Plan, ...]  # tasks needed at other trials per task

    @property
    def label(self) -> str:
        design = f"{_n(self.n_tasks, 'task')} x {self.trials_per_task:g} trials"
        if self.mde_pts is None or self.mde_pts >= 100:
            text = f"{design} cannot detect any effect at 80% power"
        else:
            text = f"{design} detect {_fmt(self.mde_pts)} pts at 80% power"
        if not self.sign_flip_can_reject:
            text += f"; no sign-flip test over {_n(self.n_tasks, 'task')} can reach p < 0.05"
        if self.min_effect_pts is not None:
            text += f"; {_fmt(self.min_effect_pts)} pts needs {self.tasks_needed or '>10000'} tasks"
        return text


def _tasks_needed(effect: float, sd: float, alpha: float, power: float) -> int | None:
    if sd == 0:
        return 6  # the sign-flip floor below still applies
    lo = 6  # fewer tasks: the sign-flip test cannot reject at 0.05
    if t_power(effect / sd, lo, alpha) >= power:
        return lo
    hi = lo
    while t_power(effect / sd, hi, alpha) < power:
        hi *= 2
        if hi > 10_000:
            return None
    while hi - lo > 1:  # power rises with n: bisect for the first n that reaches it
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if t_power(effect / sd, mid, alpha) >= power else (mid, hi)
    return hi


def power(
    baseline: Outcomes,
    variant: Outcomes,
    *,
    min_effect_pts: float | None = None,
    alpha: float = ALPHA,
    target_power: float = POWER,
) -> Power:
    """MDE of the paired task-level test at this n, and the tasks / trials a given effect needs.

    The variance of one task's difference is split into the true between-task part and the
    binomial part, which shrinks as 1 / trials per task.
    """
    pr = pair(baseline, variant)
    m = pr.n
    var_d = m * pr.se() ** 2  # the per-task variance the interval used (floored)
    within_now = m * pr.within_var
    between = max(0.0, var_d - within_now)
    between = 0.0 if between < 1e-12 else between  # float noise, not a between-task spread
    sd = math.sqrt(var_d)
    e = t_mde_sd(m, alpha, target_power)
    mde = None if e is None else min(1.0, e * sd)

    def sd_at(k: int) -> float:
        return math.sqrt(between + pr.per_trial_within / k)

    k_now = max(1, round(pr.trials_per_task))
    tasks_needed = trials_needed = None
    plans: tuple[Plan, ...] = ()
    if min_effect_pts is not None:
        effect = abs(min_effect_pts) / 100
        tasks_needed = _tasks_needed(effect, sd, alpha, target_power)
        if sign_flip_can_reject(m, alpha):
            for k in range(1, 201):
                if t_power(effect / sd_at(k), m, alpha) >= target_power:
                    trials_needed = k
                    break
        ks = sorted({1, 3, 5, 10, k_now})
        plans = tuple(Plan(k, _tasks_needed(effect, sd_at(k), alpha, target_power)) for k in ks)
    return Power(
        n_tasks=m,
        trials_per_task=pr.trials_per_task,
        sd_task_diff_pts=_pts(sd),
        between_sd_pts=_pts(math.sqrt(between)),
        mde_pts=None if mde is None else _pts(mde),
        sign_flip_can_reject=sign_flip_can_reject(m, alpha),
        min_effect_pts=min_effect_pts,
        tasks_needed=tasks_needed,
        trials_needed=trials_needed,
        plans=plans,
    )


# --- flips ------------------------------------------------------------------------------------

Direction = Literal["fixed", "broken"]


@dataclass(frozen=True)
class TaskFlip:
    task: str
    direction: Direction
    baseline_pts: float
    variant_pts: float
    move_pts: float  # variant - baseline
    baseline_trials: int
    variant_trials: int

    @property
    def label(self) -> str:
        return (
            f"{self.task}: {self.direction}, {_fmt(self.baseline_pts)} to "
            f"{_fmt(self.variant_pts)} pts ({self.baseline_trials} vs {self.variant_trials} trials)"
        )


def _by_move(flip: TaskFlip | HiddenTestFlip) -> tuple[float, bool, str, str]:
    # largest move first; at equal size broken before fixed (failures first), then by name
    test_id = flip.test_id if isinstance(flip, HiddenTestFlip) else ""
    return (-abs(flip.move_pts), flip.direction != "broken", flip.task, test_id)


def task_flips(baseline: Outcomes, variant: Outcomes) -> list[TaskFlip]:
    """Shared tasks whose pass rate moved: fixed (up) or broken (down), largest move first."""
    a, b = _counted(baseline), _counted(variant)
    out = []
    for t in (t for t in a if t in b):
        pa, pb = sum(a[t]) / len(a[t]), sum(b[t]) / len(b[t])
        if pa != pb:
            out.append(
                TaskFlip(
                    task=t,
                    direction="fixed" if pb > pa else "broken",
                    baseline_pts=_pts(pa),
                    variant_pts=_pts(pb),
                    move_pts=_pts(pb - pa),
                    baseline_trials=len(a[t]),
                    variant_trials=len(b[t]),
                )
            )
    return sorted(out, key=_by_move)


@dataclass(frozen=True)
class HiddenTestFlip:
    task: str
    test_id: str
    direction: Direction
    baseline_pts: float  # share of the baseline's trials in which this test passed
    variant_pts: float
    move_pts: float
    baseline_runs: int  # trials in which the test passed or failed (skips left out)
    variant_runs: int
    message: str | None  # the grader's reason from a trial where it failed, in the worse arm

    @property
    def label(self) -> str:
        why = f": {self.message}" if self.message else ""
        return (
            f"{self.task} {self.test_id}: {self.direction}, {_fmt(self.baseline_pts)} to "
            f"{_fmt(self.variant_pts)} pts{why}"
        )


def _test_table(
    rows: Iterable[Mapping[str, Any]],
) -> dict[tuple[str, str], tuple[int, int, str | None]]:
    """(task, test_id) -> (passes, runs, first failure message), from grade_tests rows."""
    acc: dict[tuple[str, str], tuple[int, int, str | None]] = {}
    for r in rows:
        outcome = r["outcome"]
        if outcome not in _TEST_PASS and outcome not in _TEST_FAIL:
            continue
        key = (str(r["task"]), str(r["test_id"]))
        passes, runs, msg = acc.get(key, (0, 0, None))
        failed = outcome in _TEST_FAIL
        acc[key] = (passes + (not failed), runs + 1, msg or (r.get("message") if failed else None))
    return acc


def hidden_test_flips(
    baseline_rows: Iterable[Mapping[str, Any]], variant_rows: Iterable[Mapping[str, Any]]
) -> list[HiddenTestFlip]:
    """Hidden tests whose pass rate moved between two variants, largest move first.

    Rows are grade_tests rows (at least task, test_id, outcome; message if there), one per test
    per counted trial. A test is keyed by (task, test_id) since ids repeat across tasks; only
    tests both variants ran to a pass or a fail are compared.
    """
    a, b = _test_table(baseline_rows), _test_table(variant_rows)
    out = []
    for key in sorted(k for k in a if k in b):
        (pa_n, ra, ma), (pb_n, rb, mb) = a[key], b[key]
        pa, pb = pa_n / ra, pb_n / rb
        if pa == pb:
            continue
        out.append(
            HiddenTestFlip(
                task=key[0],
                test_id=key[1],
                direction="fixed" if pb > pa else "broken",
                baseline_pts=_pts(pa),
                variant_pts=_pts(pb),
                move_pts=_pts(pb - pa),
                baseline_runs=ra,
                variant_runs=rb,
                message=mb if pb < pa else ma,
            )
        )
    return sorted(out, key=_by_move)


# --- the whole comparison ---------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    baseline: Rate
    variant: Rate
    difference: Difference
    power: Power
    flips: tuple[TaskFlip, ...]


def compare(
    baseline: Outcomes,
    variant: Outcomes,
    *,
    min_effect_pts: float | None = None,
    seed: int = 0,
) -> Comparison:
    """Everything a variant's line against its baseline needs. Raises NoSharedTasks."""
    return Comparison(
        baseline=pass_rate(baseline),
        variant=pass_rate(variant),
        difference=paired_difference(baseline, variant, seed=seed),
        power=power(baseline, variant, min_effect_pts=min_effect_pts),
        flips=tuple(task_flips(baseline, variant)),
    )


def compare_experiments(
    before: Mapping[str, Outcomes],
    after: Mapping[str, Outcomes],
    *,
    min_effect_pts: float | None = None,
    seed: int = 0,
) -> dict[str, Comparison]:
    """Two experiments over shared tasks (e.g. last night and tonight), variant by variant.

    Each input is {variant: {task: outcomes}}; a variant is compared with the same-named one in
    the other experiment, over the tasks both ran. Variants without shared tasks are left out;
    NoSharedTasks when no variant pairs at all.
    """
    out: dict[str, Comparison] = {}
    for name in sorted(set(before) & set(after)):
        try:
            out[name] = compare(before[name], after[name], min_effect_pts=min_effect_pts, seed=seed)
        except NoSharedTasks:
            continue
    if not out:
        raise NoSharedTasks(
            f"no variant of the two experiments shares a task (before: {sorted(before)}; "
            f"after: {sorted(after)})"
        )
    return out
