"""What the tally answers, checked against the full recomputation over the stored trial rows
(the way the start check read them before the tally): shared by the embedded and DuckLake tests
and the start-check benchmark."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import factories as f

from hangar_dagster.queue.retries import (
    BREAKER_NEUTRAL,
    CAP_EXEMPT,
    NEVER_RETRIED,
    breaker_note,
    plan_retries,
)
from hangar_dagster.queue.starts import cap_reached
from hangar_dagster.results.records import TrialRecord
from hangar_dagster.results.store import Store

REASONS = sorted(NEVER_RETRIED | CAP_EXEMPT | BREAKER_NEUTRAL | {"preempted", "provider_5xx"})


def mixed_attempts(experiment_id: str, keys: int, seed: int) -> list[TrialRecord]:
    """Attempts of ``keys`` trial keys: measurements, infra errors of every kind and their
    retries, finishing out of order across two UTC months, some costs unknown (estimated)."""
    rng = random.Random(seed)
    out = []
    for k in range(keys):
        key = f"v{k % 3}/t{k}/1"
        for n in range(1, rng.choice([2, 2, 3, 4])):
            infra = rng.random() < 0.4
            finished = f.T0.replace(month=3) + dt.timedelta(days=rng.randint(0, 40), seconds=k)
            kw: dict[str, Any] = dict(
                finished_at=finished,
                started_at=finished - dt.timedelta(seconds=30),
                tokens_in=rng.randint(0, 5000),
                tokens_out=rng.randint(0, 900),
                cost_usd=None if rng.random() < 0.2 else round(rng.random(), 4),
            )
            if kw["cost_usd"] is None:
                kw["cost_estimate_usd"] = 0.5
            if infra:
                kw |= dict(outcome_class="infra_error", infra_reason=rng.choice(REASONS))
            out.append(f.attempt_of(experiment_id, key, n, **kw))
            if not infra:
                break
    return out


def recomputed(attempts: list[TrialRecord], planned: int, per_key: int, streak: int) -> Any:
    """Breaker note, retry cap and the open keys from every full trial row (the old start
    check's reads)."""
    latest: dict[str, TrialRecord] = {}
    for t in sorted(attempts, key=lambda t: t.attempt):
        latest[t.trial_key] = t
    open_keys = sorted(
        (t.finished_at, t.trial_key, t.attempt)
        for t in latest.values()
        if t.outcome_class == "infra_error"
        and t.infra_reason not in NEVER_RETRIED | CAP_EXEMPT
        and t.attempt <= per_key
    )
    return (
        breaker_note(attempts, streak),
        plan_retries(attempts, planned, per_key).cap_reached,
        open_keys,
    )


def tallied(store: Store, experiment_id: str, planned: int, per_key: int, streak: int) -> Any:
    """The same from the tally, as queue/starts.py ``blocker`` reads it."""
    state = store.start_state(experiment_id, per_key)
    open_keys = [
        (a.finished_at, a.trial_key, a.attempt) for a in store.open_infra(experiment_id, per_key)
    ]
    assert state.open_counted == len(open_keys)
    return (
        breaker_note(state.streak, streak),
        cap_reached(store, experiment_id, state, planned, per_key),
        open_keys,
    )


def ledger(store: Store, month: str) -> dict[str, float]:
    """Author -> spend in ``month`` from the budget_ledger view, over every trial row."""
    out: dict[str, float] = {}
    for r in store.month_spend(month):
        out[r["author"]] = out.get(r["author"], 0.0) + r["spent_usd"]
    return out


def assert_agrees(store: Store, experiments: list[str], planned: int = 40) -> None:
    """Every answer the start check takes from the tally equals the full recomputation."""
    every: list[TrialRecord] = []
    for eid in experiments:
        rows = store.trials(eid, all_attempts=True)
        every += rows
        for per_key, streak in ((2, 5), (1, 2), (3, 1)):
            assert tallied(store, eid, planned, per_key, streak) == recomputed(
                rows, planned, per_key, streak
            ), (eid, per_key, streak)
        keys = {t.trial_key for t in rows} | {"v9/none/1"}
        for key in keys:
            expected = max((t.attempt for t in rows if t.trial_key == key), default=0) + 1
            assert store.next_attempt(eid, key) == expected, key
        narrow = [(a.trial_key, a.attempt, a.outcome_class) for a in store.attempts(eid)]
        assert narrow == [(t.trial_key, t.attempt, t.outcome_class) for t in rows]
    for month in ("2025-03", "2025-04", "2025-05"):
        want = ledger(store, month)
        got = store.spent_by_author(month)
        assert set(got) == set(want), month
        for author, spent in want.items():
            assert round(got[author], 6) == round(spent, 6), (month, author)
    for t in every[:: max(1, len(every) // 7)]:
        since = t.finished_at - dt.timedelta(microseconds=1)
        want_tokens = sum(u.tokens_in + u.tokens_out for u in every if u.finished_at > since)
        assert store.tokens_since(since) == want_tokens


def assert_live_tokens_count_once(store: Store) -> None:
    """A running attempt's model answers count toward the TPM throttle as they come; its own
    row, once stored, replaces them (never both); an answer logged after it is not counted."""
    at = dt.datetime.now(dt.UTC)
    since = at - dt.timedelta(minutes=1)
    before = store.tokens_since(since)
    store.add_live_tokens("live-exp", "v/t/1", 1, 700, at)
    store.add_live_tokens("live-exp", "v/t/1", 1, 300, at)
    store.add_live_tokens("live-exp", "v/t/2", 1, 50, at)
    assert store.tokens_since(since) == before + 1050
    assert store.tokens_since(at) == before  # answers at ``at`` are not after it
    # Finished: its row says 1,200 tokens in all (what the agent reported), counted once.
    store.put(f.attempt_of("live-exp", "v/t/1", 1, finished_at=at, tokens_in=1000, tokens_out=200))
    assert store.tokens_since(since) == before + 1200 + 50
    store.add_live_tokens("live-exp", "v/t/1", 1, 999, at)  # logged after the end
    assert store.tokens_since(since) == before + 1200 + 50
    # Live rows an hour old (an attempt whose run died) go as new ones come.
    store.add_live_tokens("live-exp", "v/t/3", 1, 5, at + dt.timedelta(hours=2))
    assert store.tokens_since(since) == before + 1200 + 5
