"""The monthly eval budget: caps, what a month has spent, and who may still spend.

Every trial attempt's ``cost_usd`` counts against the UTC calendar month its
``finished_at`` falls in (the ``budget_ledger`` view; docs/queue.md says why
UTC), against both the team's cap and its experiment author's cap. Submit
refuses an experiment whose projected cost exceeds what is left of either
(``submit_problems``); once either is spent, no new trial starts
(``start_blocker``), while trials already running finish.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass
from typing import Any

from hangar_dagster.experiment.spec import ExperimentSpec, Problem
from hangar_dagster.results.store import Store
from hangar_dagster.settings import AUTHOR_CAP_VAR, TEAM_CAP_VAR, Settings

DEFAULT_TEAM_CAP_USD = 1500.0
DEFAULT_AUTHOR_CAP_USD = 400.0
_MONTH = re.compile(r"^\d{4}-(0[1-9]|1[0-2])$")


class BudgetConfigError(ValueError):
    """A cap's environment variable holds something that is not an amount of dollars."""

    def __init__(self, variable: str, message: str, fix: str) -> None:
        self.variable = variable
        self.message = message
        self.fix = fix
        super().__init__(f"{message} -> {fix}")


def _cap(variable: str, raw: str, default: float) -> float:
    raw = raw.strip()
    if not raw:
        return default
    fix = f"set {variable} to a whole or decimal number of US dollars (unset: {default:g})"
    try:
        value = float(raw)
    except ValueError:
        raise BudgetConfigError(variable, f"{variable}={raw!r} is not a number", fix) from None
    if not math.isfinite(value) or value < 0:
        raise BudgetConfigError(variable, f"{variable}={raw!r} is not an amount >= 0", fix)
    return value


@dataclass(frozen=True)
class Caps:
    team_usd: float
    author_usd: float


def parse_caps(team: str, author: str) -> Caps:
    """The monthly caps as written in their variables (empty: the default); raises
    BudgetConfigError naming a bad variable. ``Settings.caps`` is the caller."""
    return Caps(
        team_usd=_cap(TEAM_CAP_VAR, team, DEFAULT_TEAM_CAP_USD),
        author_usd=_cap(AUTHOR_CAP_VAR, author, DEFAULT_AUTHOR_CAP_USD),
    )


def month_of(at: dt.datetime) -> str:
    """``YYYY-MM`` of the UTC month ``at`` falls in (the ledger's months)."""
    if at.tzinfo is None:
        raise ValueError(f"{at!r} is a naive datetime; give it a timezone (e.g. records.utcnow())")
    return f"{at.astimezone(dt.UTC):%Y-%m}"


def check_month(month: str) -> str:
    """``month`` itself if it is ``YYYY-MM``; else a ValueError saying so."""
    if not _MONTH.match(month):
        raise ValueError(f"month {month!r} is not YYYY-MM (e.g. 2026-11)")
    return month


def _next_month(month: str) -> str:
    year, mon = (int(p) for p in month.split("-"))
    return f"{year + mon // 12}-{mon % 12 + 1:02d}"


@dataclass(frozen=True)
class Spend:
    """One budget in one month: the team's, or one author's."""

    scope: str  # "team" or "author <name>"
    cap_usd: float
    spent_usd: float

    @property
    def left_usd(self) -> float:
        # running trials finish after a budget is spent, so spent can pass the cap
        return max(self.cap_usd - self.spent_usd, 0.0)

    @property
    def exhausted(self) -> bool:
        return self.spent_usd >= self.cap_usd

    def numbers(self) -> str:
        return f"spent {self.spent_usd:.2f} of {self.cap_usd:.2f}, left {self.left_usd:.2f}"


@dataclass(frozen=True)
class BudgetStatus:
    month: str
    author: str
    team: Spend
    author_budget: Spend


def _spent(value: Any) -> float:
    # a sum of many float costs carries noise below a cent; keep it from tipping a comparison
    return round(float(value or 0.0), 6)


def month_status(store: Store, author: str, at: dt.datetime, limits: Caps) -> BudgetStatus:
    """The team's and ``author``'s spend in the UTC month of ``at``, against ``limits``."""
    month = month_of(at)
    # the tally's sums (results/tally.py): a start check reads no ledger rows
    spent = store.spent_by_author(month)
    return BudgetStatus(
        month=month,
        author=author,
        team=Spend("team", limits.team_usd, _spent(sum(spent.values()))),
        author_budget=Spend(f"author {author}", limits.author_usd, _spent(spent.get(author, 0.0))),
    )


UNCAPPED = (
    "the spec sets neither budget.max_cost_usd nor trial_job_budget.max_cost_usd, "
    "so it projects 0; only the monthly caps stop its trials"
)


def projected_cost(spec: ExperimentSpec, n_trials: int, paid: int | None = None) -> float:
    """What an experiment may cost: its own ``budget.max_cost_usd``, else ``n_trials`` x
    ``trial_job_budget.max_cost_usd``, else 0 (it sets no cap, so nothing bounds it).

    ``paid``: how many of the ``n_trials`` will run (the rest are reused, experiment/reuse.py);
    the projection is then that share of it: only what will be paid counts."""
    if spec.budget is not None:
        full = spec.budget.max_cost_usd
    elif spec.trial_job_budget is not None:
        full = n_trials * spec.trial_job_budget.max_cost_usd
    else:
        return 0.0
    if paid is None or paid >= n_trials:
        return full
    return full * paid / n_trials if n_trials else 0.0


def _basis(spec: ExperimentSpec, n_trials: int, paid: int | None = None) -> tuple[str, str]:
    """(the spec field the projection comes from, how it was computed)."""
    share = (
        f" x {paid} paid of {n_trials} planned ({n_trials - paid} reused)"
        if paid is not None and paid < n_trials
        else ""
    )
    if spec.budget is not None:
        return "budget.max_cost_usd", f"its budget.max_cost_usd{share}"
    if spec.trial_job_budget is not None:
        return (
            "trial_job_budget.max_cost_usd",
            f"{n_trials} trials x trial_job_budget.max_cost_usd "
            f"{spec.trial_job_budget.max_cost_usd:.2f}{share}",
        )
    return "budget", UNCAPPED


def submit_problems(
    store: Store,
    spec: ExperimentSpec,
    author: str,
    n_trials: int,
    at: dt.datetime,
    settings: Settings,
    paid: int | None = None,
) -> list[Problem]:
    """Why the budget refuses this experiment at ``at`` (empty: it may be submitted).

    Refused when its projection exceeds what is left of the team's or the author's
    month, or when either is already spent (not even an uncapped experiment could start).
    """
    try:
        status = month_status(store, author, at, settings.caps)
    except BudgetConfigError as e:
        return [Problem(path=e.variable, message=e.message, fix=e.fix)]
    projected = projected_cost(spec, n_trials, paid)
    field, how = _basis(spec, n_trials, paid)
    problems: list[Problem] = []
    for spend, other, variable in (
        (status.team, status.author_budget, TEAM_CAP_VAR),
        (status.author_budget, status.team, AUTHOR_CAP_VAR),
    ):
        if projected <= spend.left_usd and not spend.exhausted:
            continue
        what = "is spent" if spend.exhausted else "has too little left"
        problems.append(
            Problem(
                path=field,
                message=(
                    f"the {spend.scope} eval budget for {status.month} (UTC) {what}: "
                    f"{spend.numbers()}; projected {projected:.2f} ({how}); "
                    f"{other.scope}: {other.numbers()}"
                ),
                fix=(
                    f"wait for {_next_month(status.month)}, or raise {variable}"
                    if spend.exhausted
                    else f"bring the projection to at most {spend.left_usd:.2f} "
                    "(lower budget.max_cost_usd, trial_job_budget.max_cost_usd or the trials), "
                    f"wait for {_next_month(status.month)}, or raise {variable}"
                ),
            )
        )
    return problems


def projection_note(spec: ExperimentSpec, n_trials: int) -> str | None:
    """A note for an accepted experiment whose projection is 0 because it sets no cap."""
    if spec.budget is not None or spec.trial_job_budget is not None:
        return None
    return UNCAPPED


def start_blocker(store: Store, author: str, at: dt.datetime, limits: Caps) -> str | None:
    """Why no new trial of ``author``'s may start at ``at`` (a budget is spent), else None."""
    status = month_status(store, author, at, limits)
    for spend in (status.team, status.author_budget):
        if spend.exhausted:
            return (
                f"budget: {spend.scope} month {status.month} "
                f"spent {spend.spent_usd:.2f} of {spend.cap_usd:.2f}"
            )
    return None


# ---- the month's report (`hangar eval budget`) --------------------------------------------


@dataclass(frozen=True)
class ExperimentSpend:
    experiment_id: str
    author: str
    attempts: int  # attempts that finished in the month, infra errors included
    spent_usd: float  # in the month
    spent_total_usd: float  # over all months
    projected_usd: float  # 0: the experiment sets no cap

    @property
    def left_usd(self) -> float | None:
        """What is left of its projection over all months; None when it has none."""
        if self.projected_usd <= 0:
            return None
        return max(self.projected_usd - self.spent_total_usd, 0.0)


@dataclass(frozen=True)
class MonthReport:
    month: str
    team: Spend
    authors: dict[str, Spend]  # every author with spend in the month
    experiments: list[ExperimentSpend]

    def as_dict(self) -> dict[str, Any]:
        def spend(s: Spend) -> dict[str, Any]:
            return {
                "cap_usd": s.cap_usd,
                "spent_usd": round(s.spent_usd, 2),
                "left_usd": round(s.left_usd, 2),
                "exhausted": s.exhausted,
            }

        return {
            "month": self.month,
            "timezone": "UTC",
            "team": spend(self.team),
            "authors": [{"author": name} | spend(s) for name, s in self.authors.items()],
            "experiments": [
                {
                    "experiment_id": e.experiment_id,
                    "author": e.author,
                    "attempts": e.attempts,
                    "spent_usd": round(e.spent_usd, 2),
                    "spent_total_usd": round(e.spent_total_usd, 2),
                    "projected_usd": round(e.projected_usd, 2),
                    "left_usd": None if e.left_usd is None else round(e.left_usd, 2),
                }
                for e in self.experiments
            ],
        }


def month_report(store: Store, month: str, limits: Caps) -> MonthReport:
    """The month (``YYYY-MM``, UTC) per author and per experiment, with the team's totals."""
    rows = store.month_spend(check_month(month))
    experiments = []
    for r in rows:
        record = store.experiment(r["experiment_id"])
        assert record is not None  # the ledger joins experiments: every row has one
        spec = ExperimentSpec.model_validate_json(record.spec_json)
        experiments.append(
            ExperimentSpend(
                experiment_id=r["experiment_id"],
                author=r["author"],
                attempts=int(r["attempts"]),
                spent_usd=_spent(r["spent_usd"]),
                spent_total_usd=_spent(r["spent_total_usd"]),
                projected_usd=projected_cost(
                    spec, record.trials_planned, record.trials_planned - (record.trials_reused or 0)
                ),
            )
        )
    authors = sorted({e.author for e in experiments})
    return MonthReport(
        month=month,
        team=Spend("team", limits.team_usd, _spent(sum(e.spent_usd for e in experiments))),
        authors={
            a: Spend(
                f"author {a}",
                limits.author_usd,
                _spent(sum(e.spent_usd for e in experiments if e.author == a)),
            )
            for a in authors
        },
        experiments=experiments,
    )
