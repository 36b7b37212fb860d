"""The price table's unknown-model rule (trials/agents/prices.py): unknown is not free."""

from __future__ import annotations

import pytest

from hangar_dagster.trials.agents import AgentRun, prices
from hangar_dagster.trials.trial import known_cost

pytestmark = pytest.mark.unit


def test_an_unpriced_model_is_estimated_at_the_highest_listed_prices_not_at_zero() -> None:
    tables = [prices.ANTHROPIC, prices.OPENAI]
    every = [p for t in tables for p in t.values()]
    top_in = max(p.input for p in every)
    top_cached = max(p.cached_input for p in every)
    top_out = max(p.output for p in every)
    est = prices.upper_estimate(tables, "qwen-local-7b", 3_000_000, 1_000_000, 1_000_000)
    assert est.estimate_usd == pytest.approx(2 * top_in + 1 * top_cached + 1 * top_out)
    # It bounds every listed model's cost of the same tokens from above.
    for table in tables:
        for model in table:
            listed = prices.cost(table, model, 3_000_000, 1_000_000, 1_000_000)
            assert listed is not None and listed <= est.estimate_usd
    assert "no list price for 'qwen-local-7b'" in est.basis
    assert "3000000 in, 1000000 of them cached, 1000000 out" in est.basis


def test_a_listed_model_keeps_its_list_price_and_budgets_count_either() -> None:
    listed = prices.priced(prices.OPENAI, "gpt-5-mini-2025-08-07", 1_000_000, 0)
    assert listed == pytest.approx(0.25) and prices.amount(listed) == pytest.approx(0.25)
    unknown = prices.priced(prices.OPENAI, "some-local-model", 1_000_000, 0)
    assert isinstance(unknown, prices.UnknownCost)
    assert prices.amount(unknown) == unknown.estimate_usd > 0.25


def _run(cost_usd: float, cost_unknown: str | None) -> AgentRun:
    return AgentRun(
        exit_code=0,
        timed_out=False,
        events=[],
        turns=1,
        tokens_in=10,
        tokens_out=10,
        cost_usd=cost_usd,
        fingerprint={},
        output_tail="",
        cost_unknown=cost_unknown,
    )


def test_a_trial_stores_an_unknown_cost_as_null_never_as_zero() -> None:
    assert known_cost(_run(0.5, "no list price for 'x'")) is None
    assert known_cost(_run(0.5, None)) == 0.5
    assert known_cost(None) == 0.0  # no agent ran: nothing was spent
