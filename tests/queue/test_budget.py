"""The monthly eval budget: the ledger's months, submit refusals with the numbers, start blocking."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import factories as f
import pytest

from hangar_dagster.experiment.spec import Budget, SpecError, load_spec
from hangar_dagster.experiment.submit import submit
from hangar_dagster.queue.budget import (
    AUTHOR_CAP_VAR,
    TEAM_CAP_VAR,
    BudgetConfigError,
    month_status,
    projected_cost,
    start_blocker,
    submit_problems,
)
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings, paths
from tests.conftest import hangar
from tests.experiment.test_submit import edited_spec

pytestmark = pytest.mark.unit

NOV = dt.datetime(2026, 11, 15, 12, tzinfo=dt.UTC)
NY = dt.timezone(dt.timedelta(hours=-5))  # New York in November (EST)


def spec_json(**extra: object) -> str:
    """A stored experiment's spec (the ledger's report reads its budget fields)."""
    spec = {
        "name": "x",
        "tasks": [{"id": "t1", "instructions": "fix it", "repo": "r", "base": "main"}],
        "variants": {"base": {"harness_lock": "x@sha256:" + "1" * 64}},
    }
    return json.dumps(spec | extra)


def spend(
    store: Store, experiment_id: str, author: str, costs: list[tuple[dt.datetime, float]]
) -> None:
    """An experiment by ``author`` with one attempt of one key per (finished_at, cost)."""
    store.put(f.experiment(experiment_id=experiment_id, author=author, spec_json=spec_json()))
    for attempt, (finished, cost) in enumerate(costs, start=1):
        store.put(
            f.trial(
                experiment_id=experiment_id,
                attempt=attempt,
                started_at=finished - dt.timedelta(minutes=5),
                finished_at=finished,
                cost_usd=cost,
                # every attempt counts, the excluded infra errors too
                outcome_class="infra_error" if attempt < len(costs) else "completed",
                infra_reason="rate_limit" if attempt < len(costs) else None,
            )
        )


@pytest.fixture
def new_york_session() -> Iterator[None]:
    """DuckDB takes its session time zone from TZ; the ledger's UTC months must not move with it."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = before
        time.tzset()


def test_ledger_sums_per_author_and_team_within_the_utc_month(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, new_york_session: None
) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    spend(store, "a1", "ana", [(NOV, 10.0), (NOV + dt.timedelta(days=3), 5.5)])
    # 2026-11-30 20:30 in New York is already December in UTC: it counts in December
    spend(store, "a2", "ana", [(dt.datetime(2026, 11, 30, 20, 30, tzinfo=NY), 7.0)])
    spend(store, "b1", "bo", [(dt.datetime(2026, 10, 31, 23, 59, tzinfo=dt.UTC), 100.0)])
    spend(store, "b2", "bo", [(dt.datetime(2026, 11, 1, 0, 0, tzinfo=dt.UTC), 2.25)])

    nov = month_status(store, "ana", NOV, f.settings().caps)
    assert nov.month == "2026-11"
    assert (nov.team.cap_usd, nov.team.spent_usd, nov.team.left_usd) == (1500.0, 17.75, 1482.25)
    assert (nov.author_budget.spent_usd, nov.author_budget.left_usd) == (15.5, 384.5)
    assert month_status(store, "bo", NOV, f.settings().caps).author_budget.spent_usd == 2.25
    dec = month_status(store, "ana", dt.datetime(2026, 12, 2, tzinfo=dt.UTC), f.settings().caps)
    assert (dec.team.spent_usd, dec.author_budget.spent_usd) == (7.0, 7.0)
    oct_ = month_status(store, "bo", dt.datetime(2026, 10, 2, tzinfo=dt.UTC), f.settings().caps)
    assert (oct_.team.spent_usd, oct_.author_budget.spent_usd) == (100.0, 100.0)
    assert month_status(store, "cy", NOV, f.settings().caps).author_budget.spent_usd == 0.0

    rows = store.month_spend("2026-11")
    assert [(r["author"], r["experiment_id"], r["attempts"], r["spent_usd"]) for r in rows] == [
        ("ana", "a1", 2, 15.5),
        ("bo", "b2", 1, 2.25),
    ]


def test_caps_come_from_the_environment_and_bad_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(TEAM_CAP_VAR, raising=False)
    monkeypatch.delenv(AUTHOR_CAP_VAR, raising=False)
    assert (f.settings().caps.team_usd, f.settings().caps.author_usd) == (1500.0, 400.0)
    monkeypatch.setenv(AUTHOR_CAP_VAR, "250.5")
    assert f.settings().caps.author_usd == 250.5
    for bad in ("lots", "-3", "nan"):
        monkeypatch.setenv(TEAM_CAP_VAR, bad)
        with pytest.raises(BudgetConfigError, match=TEAM_CAP_VAR) as info:
            _ = f.settings().caps
        assert info.value.variable == TEAM_CAP_VAR


def test_projection_is_the_experiment_budget_else_trials_times_the_trial_cap_else_zero(
    example_dir: Path,
) -> None:
    spec = load_spec(example_dir / "experiment.yaml")
    assert projected_cost(spec, 18) == 0.0
    per_trial = spec.model_copy(update={"trial_job_budget": Budget(max_cost_usd=3)})
    assert projected_cost(per_trial, 18) == 54.0
    own = per_trial.model_copy(update={"budget": Budget(max_cost_usd=40)})
    assert projected_cost(own, 18) == 40.0


def _tree(home: Path) -> list[str]:
    return sorted(str(p.relative_to(home)) for p in home.rglob("*") if ".lock" not in p.name)


def test_submit_over_the_team_budget_is_refused_with_the_numbers_and_writes_nothing(
    example_dir: Path, hangar_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TEAM_CAP_VAR, "100")
    monkeypatch.setenv("USER", "ana")
    store = Store(paths())
    spend(store, "earlier", "bo", [(dt.datetime.now(dt.UTC), 60.0)])
    before = _tree(hangar_home)
    # 2 variants x 3 tasks x 3 trials x 3.00 = 54.00 > 40.00 left of the team's 100
    spec = edited_spec(example_dir, tmp_path, {"trial_job_budget": {"max_cost_usd": 3}})

    with pytest.raises(SpecError) as info:
        submit(spec, Settings.from_env())

    [problem] = info.value.problems
    assert problem.path == "trial_job_budget.max_cost_usd"
    for number in (
        "spent 60.00 of 100.00, left 40.00",
        "projected 54.00 (18 trials x trial_job_budget.max_cost_usd 3.00)",
        "author ana: spent 0.00 of 400.00, left 400.00",
    ):
        assert number in problem.message
    assert TEAM_CAP_VAR in problem.fix and "at most 40.00" in problem.fix
    assert _tree(hangar_home) == before, "a refused experiment must write nothing"
    assert not (hangar_home / "experiments").exists()
    assert store.experiment("earlier") is not None
    assert store.find_experiment("skills-ab") is None


def test_submit_over_the_author_cap_is_refused_in_a_fresh_home_that_stays_absent(
    example_dir: Path, hangar_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(AUTHOR_CAP_VAR, "50")
    spec = edited_spec(
        example_dir,
        tmp_path,
        {"author": "ana", "trial_job_budget": {"max_cost_usd": 3}, "budget": {"max_cost_usd": 75}},
    )
    with pytest.raises(SpecError) as info:
        submit(spec, Settings.from_env())
    [problem] = info.value.problems
    assert problem.path == "budget.max_cost_usd"
    assert "author ana eval budget" in problem.message
    assert "spent 0.00 of 50.00, left 50.00" in problem.message
    assert "projected 75.00 (its budget.max_cost_usd)" in problem.message
    assert "team: spent 0.00 of 1500.00, left 1500.00" in problem.message
    assert AUTHOR_CAP_VAR in problem.fix
    assert not hangar_home.exists(), "a refused experiment must write nothing"


def test_within_budget_submits_and_an_uncapped_experiment_gets_a_note(
    example_dir: Path, hangar_home: Path, tmp_path: Path
) -> None:
    capped = submit(
        edited_spec(example_dir, tmp_path, {"trial_job_budget": {"max_cost_usd": 3}}),
        Settings.from_env(),
    )
    uncapped = submit(example_dir / "experiment.yaml", Settings.from_env())
    store = Store(paths())
    assert store.notes(capped.experiment_id) == []
    [note] = store.notes(uncapped.experiment_id)
    assert note.kind == "budget" and "projects 0" in note.message


def test_a_spent_budget_blocks_starts_and_refuses_even_an_uncapped_experiment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, example_dir: Path
) -> None:
    monkeypatch.setenv(TEAM_CAP_VAR, "30")
    monkeypatch.setenv(AUTHOR_CAP_VAR, "20")
    store = f.make_store(tmp_path, monkeypatch)
    spend(store, "a1", "ana", [(NOV, 19.99)])
    assert start_blocker(store, "ana", NOV, f.settings().caps) is None
    spend(store, "a2", "ana", [(NOV, 0.01)])
    assert (
        start_blocker(store, "ana", NOV, f.settings().caps)
        == "budget: author ana month 2026-11 spent 20.00 of 20.00"
    )
    assert start_blocker(store, "bo", NOV, f.settings().caps) is None
    spend(store, "b1", "bo", [(NOV, 10.0)])
    assert (
        start_blocker(store, "bo", NOV, f.settings().caps)
        == "budget: team month 2026-11 spent 30.00 of 30.00"
    )
    assert (
        start_blocker(store, "bo", dt.datetime(2026, 12, 1, tzinfo=dt.UTC), f.settings().caps)
        is None
    )

    uncapped = load_spec(example_dir / "experiment.yaml")
    [team] = submit_problems(store, uncapped, "cy", 18, NOV, f.settings())
    assert "team eval budget for 2026-11 (UTC) is spent" in team.message
    assert "projects 0" in team.message and "wait for 2026-12" in team.fix


def test_submit_names_a_bad_cap_variable(
    example_dir: Path, hangar_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(AUTHOR_CAP_VAR, "four hundred")
    with pytest.raises(SpecError) as info:
        submit(example_dir / "experiment.yaml", Settings.from_env())
    assert [p.path for p in info.value.problems] == [AUTHOR_CAP_VAR]
    assert not hangar_home.exists()


@pytest.mark.integration
def test_cli_eval_budget_shows_the_month_per_author_and_experiment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    spend(store, "a1", "ana", [(NOV, 10.0), (NOV, 5.0)])
    store.put(
        f.experiment(
            experiment_id="b1",
            author="bo",
            trials_planned=4,
            spec_json=spec_json(trial_job_budget={"max_cost_usd": 2.5}),
        )
    )
    store.put(f.trial(experiment_id="b1", finished_at=NOV, cost_usd=4.0))
    store.put(f.trial(experiment_id="b1", replicate=2, finished_at=NOV.replace(month=10)))
    home = store.paths.home

    result = hangar("eval", "budget", "--month", "2026-11", "--json", home=home)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["month"] == "2026-11" and out["timezone"] == "UTC"
    assert out["team"] == {
        "cap_usd": 1500.0,
        "spent_usd": 19.0,
        "left_usd": 1481.0,
        "exhausted": False,
    }
    assert [(a["author"], a["spent_usd"], a["left_usd"]) for a in out["authors"]] == [
        ("ana", 15.0, 385.0),
        ("bo", 4.0, 396.0),
    ]
    # b1 projects 4 trials x 2.50 = 10.00; it spent 4.00 in November and 0.25 in October
    assert [
        (e["experiment_id"], e["attempts"], e["spent_usd"], e["projected_usd"], e["left_usd"])
        for e in out["experiments"]
    ] == [("a1", 2, 15.0, 0.0, None), ("b1", 1, 4.0, 10.0, 5.75)]

    text = hangar("eval", "budget", "--month", "2026-11", home=home)
    assert text.returncode == 0, text.stderr
    assert "team: spent 19.00 of 1500.00, left 1481.00 USD" in text.stdout
    assert "bo" in text.stdout and "396.00" in text.stdout and "5.75" in text.stdout

    october = json.loads(hangar("eval", "budget", "--month", "2026-10", "--json", home=home).stdout)
    assert october["team"]["spent_usd"] == 0.25
    bad = hangar("eval", "budget", "--month", "2026-13", home=home)
    assert bad.returncode == 2 and "--month" in bad.stderr
