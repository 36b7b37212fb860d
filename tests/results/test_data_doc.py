"""docs/data.md stays true: every column documented with its type, every example query answers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import duckdb
import factories as f
import pytest

from hangar_dagster.results.schema import TABLES
from hangar_dagster.results.store import Store

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[2] / "docs" / "data.md"


def _sql_blocks() -> list[str]:
    return re.findall(r"^```sql\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


def _populate(store: Store) -> None:
    store.put(f.experiment())
    # base: t1 passes on attempt 2 after a preemption; t2 fails
    store.put(
        f.trial(
            "base",
            "t1",
            attempt=1,
            outcome_class="infra_error",
            infra_reason="preempted",
            cost_usd=0.10,
        )
    )
    store.put(f.trial("base", "t1", attempt=2, cost_usd=0.25))
    store.put(f.grade("base", "t1", attempt=2, passed=True))
    store.put(f.trial("base", "t2", cost_usd=0.25))
    store.put(f.grade("base", "t2", passed=False))
    # skill: t1 passes with a conftest.py in the patch; t2 is rate-limited on both attempts
    store.put(f.trial("skill", "t1", cost_usd=0.75))
    store.put(
        f.grade(
            "skill",
            "t1",
            passed=True,
            tamper_signals=["conftest.py"],
            trust="low",
            touched_tests=["tests/test_app.py"],
        )
    )
    for attempt in (1, 2):
        store.put(
            f.trial(
                "skill",
                "t2",
                attempt=attempt,
                outcome_class="infra_error",
                infra_reason="rate_limit",
                cost_usd=0.05,
            )
        )


def _run(store: Store, sql: str) -> list[dict[str, Any]]:
    store.sync()
    con = duckdb.connect(str(store.paths.duckdb), read_only=True)  # as an analyst would
    try:
        cur = con.execute(sql)
        names = [d[0] for d in cur.description or []]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    finally:
        con.close()


def _pick(rows: list[dict[str, Any]], *cols: str) -> list[tuple[Any, ...]]:
    return [tuple(r[c] for c in cols) for r in rows]


def test_every_table_and_column_is_documented_with_its_type() -> None:
    text = DOC.read_text()
    for table in TABLES:
        section = text.split(f"### `{table.name}`\n", 1)
        assert len(section) == 2, f"docs/data.md lacks a `### `{table.name}`` section"
        body = section[1].split("\n### ", 1)[0]
        for col in table.columns:
            null = "yes" if col.nullable else "no"
            row = f"| `{col.name}` | {col.sql_type} | {null} |"
            assert row in body, f"docs/data.md, table {table.name}: missing row starting {row}"


def test_the_five_example_queries_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _sql_blocks()
    assert len(blocks) == 6, "docs/data.md should hold exactly six ```sql example blocks"
    store = f.make_store(tmp_path, monkeypatch)
    _populate(store)
    per_variant, per_task, infra, cost, tamper = (_run(store, sql) for sql in blocks[:5])

    # skill's t1 passed with a conftest.py: a flagged pass, counted apart (not in the rate),
    # and its t2 only ever hit infra errors, so skill has no counted trial and no rate
    assert _pick(
        per_variant,
        "variant",
        "trials",
        "graded",
        "passed",
        "pass_rate_pts",
        "flagged_passes",
        "infra_error",
    ) == [("base", 2, 2, 1, 50.0, 0, 0), ("skill", 2, 0, 0, None, 1, 1)]
    assert _pick(per_task, "task", "variant", "passed", "graded") == [
        ("t1", "base", 1, 1),
        ("t1", "skill", 1, 1),
        ("t2", "base", 0, 1),
        ("t2", "skill", 0, 0),
    ]
    assert _pick(infra, "infra_reason", "attempts", "trial_keys") == [
        ("rate_limit", 2, 1),
        ("preempted", 1, 1),
    ]
    assert _pick(cost, "variant", "attempts", "cost_usd", "tokens") == [
        ("base", 3, 0.6, 3600),
        ("skill", 3, 0.85, 3600),
    ]
    assert _pick(tamper, "trial_key", "attempt", "passed", "trust") == [
        ("skill/t1/1", 1, True, "low")
    ]
    assert "conftest.py" in tamper[0]["tamper_signals"]


def test_the_reuse_query_tells_fresh_from_reused_and_cost_leaves_reused_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f.make_store(tmp_path, monkeypatch)
    _populate(store)
    store.put(f.experiment(experiment_id="exp-2"))
    origin = {"experiment_id": f.EXP, "trial_key": "base/t2/1", "attempt": 1}
    store.put(f.trial("base", "t2", experiment_id="exp-2", cost_usd=0.25, reused_from=origin))
    store.put(f.trial("base", "t1", experiment_id="exp-2", cost_usd=0.5))
    *_, cost, _, reuse = (_run(store, sql) for sql in _sql_blocks())
    assert _pick([r for r in reuse if r["experiment_id"] == "exp-2"], "fresh", "reused") == [(1, 1)]
    assert [r["reused_from"] for r in reuse if r["experiment_id"] == "exp-2"] == [[f.EXP]]
    # exp-2 paid for its fresh trial only: the reused one was paid by exp-1
    assert [(r["attempts"], r["cost_usd"]) for r in cost if r["experiment_id"] == "exp-2"] == [
        (1, 0.5)
    ]
