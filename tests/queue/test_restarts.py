"""Attempts cut off by a restart, every attempt readable in `get`, queue notes stored once."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from pathlib import Path

import duckdb
import pytest

from hangar_dagster.experiment.plan import ResolvedExperiment, TrialKey
from hangar_dagster.experiment.submit import submit
from hangar_dagster.queue.restarts import StartedMarker, close_interrupted, started_markers
from hangar_dagster.queue.starts import pending, record_queue_notes
from hangar_dagster.results.records import TrialRecord
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings, paths
from hangar_dagster.trials.trial import RAW_PATCH, STARTED_MARKER, TrialRequest, mark_started
from tests import factories as f
from tests.conftest import hangar

pytestmark = pytest.mark.unit

AT = dt.datetime(2026, 11, 29, 2, 0, tzinfo=dt.UTC)


@pytest.fixture
def exp(example_dir: Path, hangar_home: Path) -> ResolvedExperiment:
    return submit(example_dir / "experiment.yaml", Settings.from_env())


def attempt(exp: ResolvedExperiment, key: str, n: int, **kw: object) -> TrialRecord:
    return f.attempt_of(exp.experiment_id, key, n, **{"finished_at": AT, **kw})


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped (a killed run's, say)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def mark(exp: ResolvedExperiment, key: str, attempt_no: int, run_id: str, pid: int) -> Path:
    """A started marker as run_trial leaves it, with ``pid`` as the process that ran it."""
    req = TrialRequest(
        experiment=exp, key=TrialKey.parse(key), attempt=attempt_no, retry_of=None, run_id=run_id
    )
    mark_started(req, paths(), AT)
    art = paths().trial_artifacts(exp.experiment_id, key, attempt_no)
    data = json.loads((art / STARTED_MARKER).read_text())
    (art / STARTED_MARKER).write_text(json.dumps(data | {"pid": pid}))
    return art


def by_process(marker: StartedMarker) -> bool:
    return marker.process_alive()


def test_attempt_cut_off_by_a_restart_leaves_no_trace(exp: ResolvedExperiment) -> None:
    """Regression: a killed run's attempt in flight left no row and ran again as attempt 1."""
    store = Store(paths())
    gone = dead_pid()
    art = mark(exp, "plain/median/1", 1, "run-dead", gone)
    closed = close_interrupted(exp, store, Settings.from_env(), "run-now", by_process)

    assert [(t.trial_key, t.attempt) for t in closed] == [("plain/median/1", 1)]
    row = store.trials(exp.experiment_id, all_attempts=True)[0]
    # unknown is not free: no cost (NULL), an estimate and its basis beside it
    assert (row.outcome_class, row.infra_reason, row.cost_usd) == (
        "infra_error",
        "control_plane_restart",
        None,
    )
    assert row.cost_estimate_usd == 0.0 and row.cost_basis is not None
    assert "no known cost of variant plain, no trial_job_budget and no budget" in row.cost_basis
    assert row.run_id == "run-dead" and row.error is not None and "run-dead" in row.error
    assert row.started_at == AT and row.finished_at >= AT
    assert (art / RAW_PATCH).read_text() == ""  # the grades asset can read it
    retry = pending(exp, store, f.settings()).retries["plain/median/1"]
    assert (retry.attempt, retry.retry_of, retry.counts_toward_cap) == (2, "run-dead", False)
    # closing again finds nothing to close: one record per attempt
    assert close_interrupted(exp, store, Settings.from_env(), "run-later", by_process) == []


def test_an_unknown_cost_is_estimated_from_the_variants_known_costs_and_the_budget_counts_it(
    exp: ResolvedExperiment,
) -> None:
    store = Store(paths())
    for n, cost in ((1, 0.10), (2, 0.30), (3, 0.20)):
        store.put(attempt(exp, f"plain/median/{n}", 1, cost_usd=cost))
    mark(exp, "plain/slugify/1", 1, "run-dead", dead_pid())
    (closed,) = close_interrupted(exp, store, Settings.from_env(), "run-now", by_process)
    assert closed.cost_usd is None
    assert closed.cost_estimate_usd == pytest.approx(0.20)
    assert closed.cost_basis == "median of 3 known attempt cost(s) of variant plain"
    assert closed.trace["cost_usd"] is None and closed.trace["cost_estimate_usd"] == 0.2
    # stored NULL in DuckDB and Parquet, and the monthly budget counts the estimate
    row = store.trials(exp.experiment_id, all_attempts=True)
    assert [t.cost_usd for t in row if t.trial_key == "plain/slugify/1"] == [None]
    (spend,) = store.month_spend(closed.finished_at.strftime("%Y-%m"))  # the known ones: AT
    assert spend["attempts"] == 1 and spend["spent_usd"] == pytest.approx(0.20)
    assert spend["spent_total_usd"] == pytest.approx(0.80)


def test_with_no_known_cost_the_estimate_is_the_per_trial_cap(exp: ResolvedExperiment) -> None:
    from hangar_dagster.experiment.spec import Budget
    from hangar_dagster.queue.restarts import estimate_cost

    capped = exp.model_copy(
        update={"spec": exp.spec.model_copy(update={"trial_job_budget": Budget(max_cost_usd=2.5)})}
    )
    assert estimate_cost(capped, [], "plain") == (
        2.5,
        "trial_job_budget.max_cost_usd (no known cost of variant plain yet)",
    )
    assert estimate_cost(capped, [1.0, 3.0], "plain")[0] == 2.0
    # With only the experiment's own budget: what one of its planned trials may spend.
    budgeted = exp.model_copy(
        update={"spec": exp.spec.model_copy(update={"budget": Budget(max_cost_usd=6.0)})}
    )
    planned = len(budgeted.trial_keys())
    assert estimate_cost(budgeted, [], "plain") == (
        pytest.approx(6.0 / planned),
        f"budget.max_cost_usd over its {planned} planned trials (no known cost of variant "
        "plain yet, no trial_job_budget)",
    )


def test_finished_current_and_live_attempts_are_not_closed(exp: ResolvedExperiment) -> None:
    store = Store(paths())
    gone = dead_pid()
    mark(exp, "plain/median/1", 1, "run-old", gone)
    store.put(attempt(exp, "plain/median/1", 1, run_id="run-old"))  # it finished and was stored
    mark(exp, "plain/median/2", 1, "run-now", gone)  # this very run's own attempt
    mark(exp, "plain/median/3", 1, "run-other", os.getpid())  # process still alive
    assert len(started_markers(paths(), exp.experiment_id)) == 3

    assert close_interrupted(exp, store, Settings.from_env(), "run-now", by_process) == []
    assert [(t.trial_key, t.outcome_class) for t in store.trials(exp.experiment_id)] == [
        ("plain/median/1", "completed")
    ]
    # the run's status decides for a process on another host, or a run Dagster saw finish
    assert close_interrupted(exp, store, Settings.from_env(), "run-now", lambda m: False)[
        0
    ].trial_key == ("plain/median/3")


def test_a_torn_marker_names_its_file(exp: ResolvedExperiment) -> None:
    art = paths().trial_artifacts(exp.experiment_id, "plain/median/1", 1)
    art.mkdir(parents=True)
    (art / STARTED_MARKER).write_text("{")
    with pytest.raises(ValueError, match=r"started\.json: not a started marker"):
        started_markers(paths(), exp.experiment_id)


def test_queue_notes_are_written_not_only_shown(exp: ResolvedExperiment) -> None:
    """Regression: 'retries stopped' / 'no retry left' / breaker notes were only computed."""
    store = Store(paths())
    # 18 trials allow 1 counted retry: v/median/1 used it, so v/median/2's failure is stopped.
    store.put(attempt(exp, "plain/median/1", 1, outcome_class="infra_error", infra_reason="clone"))
    store.put(attempt(exp, "plain/median/1", 2, finished_at=AT + dt.timedelta(minutes=1)))
    for n, minute in ((1, 2), (2, 3), (3, 4)):
        store.put(
            attempt(
                exp,
                "plain/median/3",
                n,
                outcome_class="infra_error",
                infra_reason="power_down",
                finished_at=AT + dt.timedelta(minutes=minute),
            )
        )
    for i, rep in enumerate(("plain/median/2", "skill/median/1", "skill/median/2")):
        store.put(
            attempt(
                exp,
                rep,
                1,
                outcome_class="infra_error",
                infra_reason="sandbox_create",
                finished_at=AT + dt.timedelta(minutes=10 + i),
            )
        )
    first = record_queue_notes(exp, store, f.settings())
    said = sorted(n.message.split(":")[0] for n in first)
    assert said == ["no retry left for plain/median/3", "retries stopped"]
    assert (
        record_queue_notes(exp, store, f.settings()) == []
    )  # once per distinct message, not every tick

    for i, rep in enumerate(("skill/median/3", "plain/durations/1")):
        store.put(
            attempt(
                exp,
                rep,
                1,
                outcome_class="infra_error",
                infra_reason="provider_5xx",
                finished_at=AT + dt.timedelta(minutes=20 + i),
            )
        )
    tripped = record_queue_notes(exp, store, f.settings())
    assert any(n.message.startswith("outage breaker tripped: 5 systemic") for n in tripped)
    stored = [n for n in store.notes(exp.experiment_id) if n.kind == "queue"]
    assert len(stored) == len({n.message for n in stored}) >= 3
    con = duckdb.connect(str(paths().duckdb), read_only=True)
    try:
        in_sql = con.execute(
            "select count(*) from notes where experiment_id = ? and kind = 'queue'",
            [exp.experiment_id],
        ).fetchone()
    finally:
        con.close()
    assert in_sql == (len(stored),)


@pytest.mark.integration
def test_get_shows_every_attempt_not_only_the_highest(
    exp: ResolvedExperiment, hangar_home: Path
) -> None:
    """Regression: `hangar experiment get` showed only the highest attempt of a key."""
    store = Store(paths())
    store.put(
        attempt(exp, "plain/median/1", 1, outcome_class="infra_error", infra_reason="preempted")
    )
    store.put(attempt(exp, "plain/median/1", 2, retry_of="run-plain-median-1-1"))
    store.put(attempt(exp, "plain/median/2", 1))

    got = hangar("experiment", "get", exp.experiment_id, "--json", home=hangar_home)
    assert got.returncode == 0, got.stderr
    out = json.loads(got.stdout)
    rows = [(a["trial_key"], a["attempt"], a["counts"], a["retried_by"]) for a in out["attempts"]]
    assert rows == [
        ("plain/median/1", 1, False, "run-plain-median-1-2"),
        ("plain/median/1", 2, True, None),
        ("plain/median/2", 1, True, None),
    ]
    assert "manifest" not in out["attempts"][0]
    assert [t["attempt"] for t in out["trials"]] == [2, 1]  # the index still counts the highest

    text = hangar("experiment", "get", exp.experiment_id, home=hangar_home)
    assert text.returncode == 0, text.stderr
    lines = [ln for ln in text.stdout.splitlines() if "attempts of" in ln]
    assert len(lines) == 1 and "plain/median/1" in lines[0]
    assert "1 infra_error / preempted" in lines[0] and "excluded" in lines[0]
    assert "2 completed" in lines[0] and "counts" in lines[0]
