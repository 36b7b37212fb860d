"""experiment_index and variant_summary (results/schema.py) agree with their plain definitions:
``experiment_index`` (a table the store keeps, rebuilt here from the tables by the query a sync
and every put use, ``index_select``) with the highest attempt of each key picked by a window
over the joined rows and each hidden-test count read from the grade's JSON on its own,
``variant_summary`` with the per-variant counts and the mean of per-task rates computed as
written in docs/data.md. The queries are written for a million rows (a narrow aggregate joined
back, one JSON parse per grade, one pass per summary); this checks that speed changed no answer,
over a seeded mix of every case they tell apart. tests/results/test_index.py checks the table
is kept so by every put."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any, get_args

import duckdb
import factories as f
import pyarrow as pa
import pytest

from hangar_dagster.results.records import OutcomeClass, Record
from hangar_dagster.results.schema import BY_MODEL, INDEX_COLUMNS, index_select
from hangar_dagster.results.store import EmbeddedStore, rebuild_index

pytestmark = pytest.mark.unit

_HIDDEN = ("total", "passed", "failed", "errors", "skipped")
OUTCOMES: tuple[str, ...] = get_args(OutcomeClass)

# experiment_index as first written: a window over the joined rows, a JSON read per count.
PLAIN_INDEX = f"""
SELECT t.experiment_id, t.trial_key, t.variant, t.task, t.replicate,
  t.attempt, t.run_id, t.retry_of, t.outcome_class, t.infra_reason, t.drift, t.verify_passed,
  g.passed, g.trust, g.hidden_tests,
  {", ".join(f"CAST(g.hidden_tests->>'{k}' AS BIGINT) AS hidden_{k}" for k in _HIDDEN)},
  (coalesce(g.task_invalid, false) OR coalesce(b.invalid, false)) AS task_invalid,
  g.contamination, g.tamper_signals,
  t.cost_usd, t.cost_estimate_usd, t.duration_s, t.pin_set, t.model, t.agent_is_standin,
  t.reused_from, g.grader_digest, g.regrade_of,
  coalesce(t.source, 'experiment') AS source, t.shadow_of
FROM trials t
LEFT JOIN grades g
  ON g.experiment_id = t.experiment_id AND g.trial_key = t.trial_key AND g.attempt = t.attempt
LEFT JOIN base_checks b ON b.experiment_id = t.experiment_id AND b.task = t.task
QUALIFY row_number() OVER (
  PARTITION BY t.experiment_id, t.trial_key ORDER BY t.attempt DESC) = 1"""

# The summary's rules in Python, over the plain index's rows (docs/data.md, "variant_summary").


def _plain_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["experiment_id"], r["variant"]), []).append(r)
    out = []
    for (eid, variant), rs in sorted(by.items()):

        def execution(r: dict[str, Any]) -> bool:
            return bool(r["outcome_class"] == "infra_error")

        def evidence(r: dict[str, Any]) -> bool:
            ran = sum(r[f"hidden_{k}"] or 0 for k in ("passed", "failed", "errors"))
            return not execution(r) and (r["passed"] is None or r["task_invalid"] or ran == 0)

        def flagged(r: dict[str, Any]) -> bool:
            return bool(r["passed"]) and bool(r["tamper_signals"] and r["tamper_signals"] != "[]")

        def counted(r: dict[str, Any]) -> bool:
            return not execution(r) and not evidence(r) and not flagged(r)

        tasks: dict[str, list[bool]] = {}
        for r in rs:
            if counted(r):
                tasks.setdefault(r["task"], []).append(bool(r["passed"]))
        rates = [sum(v) / len(v) for v in tasks.values()]
        out.append(
            {
                "experiment_id": eid,
                "variant": variant,
                "trials": len(rs),
                "passed": sum(1 for r in rs if counted(r) and r["passed"]),
                "graded": sum(1 for r in rs if counted(r)),
                "pass_rate_pts": round(100 * sum(rates) / len(rates), 1) if rates else None,
                "invalid_task": sum(1 for r in rs if r["task_invalid"]),
                **{o: sum(1 for r in rs if r["outcome_class"] == o) for o in OUTCOMES},
                "execution_failures": sum(1 for r in rs if execution(r)),
                "evidence_failures": sum(1 for r in rs if evidence(r)),
                "admissible": sum(1 for r in rs if not execution(r) and not evidence(r)),
                "flagged_passes": sum(1 for r in rs if flagged(r)),
            }
        )
    return out


def _mix(seed: int) -> list[Record]:
    """Two experiments: retried keys (the last attempt an infra error or not), grades on some
    attempts only, passes with tamper signals, grades with no test run, invalid tasks by grade
    or by base check, keys with no grade."""
    rng = random.Random(seed)
    out: list[Record] = []
    for eid in ("exp-a", "exp-b"):
        tasks = [f"t{i}" for i in range(6)]
        for task in tasks[:4]:
            out.append(f.base_check(task, experiment_id=eid, invalid=rng.random() < 0.25))
        for variant in ("v0", "v1", "v2"):
            for task in tasks:
                for rep in (1, 2):
                    for n in range(1, rng.choice([2, 2, 3, 4])):
                        outcome = rng.choice([*OUTCOMES, "infra_error", "completed"])
                        infra = {"infra_reason": "preempted"} if outcome == "infra_error" else {}
                        at = f.T0 + dt.timedelta(minutes=rng.randint(0, 999))
                        out.append(
                            f.trial(
                                variant,
                                task,
                                rep,
                                n,
                                experiment_id=eid,
                                outcome_class=outcome,
                                finished_at=at,
                                **infra,
                            )
                        )
                        if outcome == "infra_error" or rng.random() < 0.15:
                            continue  # not graded
                        hidden = {k: rng.randint(0, 3) for k in _HIDDEN}
                        if rng.random() < 0.2:
                            hidden = {"total": 0}  # no test ran, a count missing
                        out.append(
                            f.grade(
                                variant,
                                task,
                                rep,
                                n,
                                experiment_id=eid,
                                passed=rng.random() < 0.5,
                                hidden_tests=hidden,
                                tamper_signals=["conftest.py"] if rng.random() < 0.15 else [],
                                task_invalid=rng.random() < 0.1,
                            )
                        )
    return out


def _loaded(records: list[Record]) -> duckdb.DuckDBPyConnection:
    """A DuckDB with the store's tables and views, the records inserted straight into it and
    the index rebuilt from them (as a sync does)."""
    con = duckdb.connect()
    EmbeddedStore._create_schema(con)
    by_table: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_table.setdefault(BY_MODEL[type(r)].name, []).append(BY_MODEL[type(r)].to_row(r))
    for name, rows in by_table.items():
        table = next(t for t in BY_MODEL.values() if t.name == name)
        con.register("incoming", pa.Table.from_pylist(rows, schema=table.arrow_schema()))
        con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM incoming")
        con.unregister("incoming")
    rebuild_index(con)
    return con


def _dicts(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_views_agree_with_their_plain_definitions(seed: int) -> None:
    con = _loaded(_mix(seed))
    index = _dicts(con, "SELECT * FROM experiment_index ORDER BY experiment_id, trial_key")
    plain = _dicts(con, f"SELECT * FROM ({PLAIN_INDEX}) ORDER BY experiment_id, trial_key")
    assert index == plain
    assert len(index) == 2 * 3 * 6 * 2  # one row per key, whatever its attempts
    # the mix reaches the cases the summary tells apart
    assert {r["outcome_class"] for r in index} >= {"infra_error", "completed"}
    assert any(r["task_invalid"] for r in index) and any(r["passed"] is None for r in index)
    summary = _dicts(con, "SELECT * FROM variant_summary ORDER BY experiment_id, variant")
    assert summary == _plain_summary(plain)
    assert any(s["flagged_passes"] for s in summary) and any(
        s["evidence_failures"] for s in summary
    )


def test_the_index_table_has_the_columns_of_its_query() -> None:
    con = _loaded([])
    names = [r[0] for r in con.execute(f"DESCRIBE {index_select()}").fetchall()]
    assert names == [c.name for c in INDEX_COLUMNS]
    stored = [r[0] for r in con.execute("DESCRIBE experiment_index").fetchall()]
    assert stored == names
