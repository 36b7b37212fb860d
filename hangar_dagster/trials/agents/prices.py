"""Provider list prices, for the adapters whose CLI reports tokens but no cost.

USD per million tokens, by model id prefix (longest prefix wins). Input tokens
are counted with the cached ones included, as the providers report them to
hangar (``tokens_in``); the cached part (``cached_tokens_in``) is priced at the
provider's cached-input price instead of the input price, and Anthropic's cache
writes (``cache_write_tokens_in``) at its cache-write price.

Sources: the providers' pricing pages (OpenAI https://platform.openai.com/docs/pricing,
"Cached input" column; Anthropic https://docs.anthropic.com/en/docs/about-claude/pricing,
cache hits 0.1x the base input price, 5-minute cache writes 1.25x). Those pages cannot be
reached from where this was written; the table was checked on 2026-12-01 against litellm's
bundled price map (model_prices_and_context_window_backup.json in the litellm that
mini-swe-agent 2.4.6 installs): every entry that map has agrees on input, cached input,
output and cache-write prices; claude-opus-4 (the pre-4.5 one) and claude-3-5-haiku are not
in it and stay unchecked.
An unknown model has no list price. Unknown is not free: its cost is recorded as unknown
(null), with an estimate beside it, its tokens priced at the highest prices of the adapter's
table (``upper_estimate``), and budgets count that estimate (docs/data.md, "Unknown costs").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Price:
    input: float
    cached_input: float
    output: float
    cache_write: float | None = None  # None: cache writes cost the input price


OPENAI = {
    "gpt-5-mini": Price(0.25, 0.025, 2.0),
    "gpt-5-nano": Price(0.05, 0.005, 0.4),
    "gpt-5": Price(1.25, 0.125, 10.0),
    "gpt-4.1-mini": Price(0.4, 0.1, 1.6),
    "gpt-4.1": Price(2.0, 0.5, 8.0),
    "gpt-4o-mini": Price(0.15, 0.075, 0.6),
    "gpt-4o": Price(2.5, 1.25, 10.0),
    "o4-mini": Price(1.1, 0.275, 4.4),
    "o3": Price(2.0, 0.5, 8.0),
}
ANTHROPIC = {
    "claude-opus-4-5": Price(5.0, 0.5, 25.0, 6.25),
    "claude-opus-4": Price(15.0, 1.5, 75.0, 18.75),
    "claude-sonnet-4": Price(3.0, 0.3, 15.0, 3.75),
    "claude-haiku-4-5": Price(1.0, 0.1, 5.0, 1.25),
    "claude-3-5-haiku": Price(0.8, 0.08, 4.0, 1.0),
}


def price_of(table: dict[str, Price], model: str) -> Price | None:
    for prefix in sorted(table, key=len, reverse=True):
        if model.startswith(prefix):
            return table[prefix]
    return None


def cost(
    table: dict[str, Price],
    model: str,
    tokens_in: int,
    tokens_out: int,
    cached_in: int = 0,
    cache_write_in: int = 0,
) -> float | None:
    """USD for one model's tokens (``tokens_in`` includes the cached and cache-written ones), or
    None when ``model`` is not in ``table``."""
    price = price_of(table, model)
    if price is None:
        return None
    write = price.input if price.cache_write is None else price.cache_write
    plain = max(tokens_in - cached_in - cache_write_in, 0)
    return (
        plain * price.input
        + cached_in * price.cached_input
        + cache_write_in * write
        + tokens_out * price.output
    ) / 1_000_000


@dataclass(frozen=True)
class UnknownCost:
    """An estimate of a cost no list price gives, and what it rests on (stored beside a null
    ``cost_usd``: ``cost_estimate_usd``, ``cost_basis``)."""

    estimate_usd: float
    basis: str


def upper_estimate(
    tables: list[dict[str, Price]],
    model: str,
    tokens_in: int,
    tokens_out: int,
    cached_in: int = 0,
    cache_write_in: int = 0,
) -> UnknownCost:
    """``model``'s tokens at the highest price of each kind in ``tables``.

    An upper estimate rather than 0 or a guess at the family: a budget that counts it stops a
    run of a model nobody priced before it overspends, not after.
    """
    prices = [p for table in tables for p in table.values()]
    top = Price(
        input=max(p.input for p in prices),
        cached_input=max(p.cached_input for p in prices),
        output=max(p.output for p in prices),
        cache_write=max(p.input if p.cache_write is None else p.cache_write for p in prices),
    )
    estimate = cost({model: top}, model, tokens_in, tokens_out, cached_in, cache_write_in)
    assert estimate is not None  # priced by the one-entry table just built
    return UnknownCost(
        round(estimate, 6),
        f"no list price for {model!r}: its tokens ({tokens_in} in, {cached_in} of them cached,"
        f" {tokens_out} out) at the highest prices hangar lists (${top.input:g} in,"
        f" ${top.cached_input:g} cached, ${top.output:g} out per million tokens)",
    )


def priced(
    table: dict[str, Price],
    model: str,
    tokens_in: int,
    tokens_out: int,
    cached_in: int = 0,
    cache_write_in: int = 0,
) -> float | UnknownCost:
    """USD at ``model``'s list price in ``table``, or, for a model it does not list, the
    upper estimate over it."""
    listed = cost(table, model, tokens_in, tokens_out, cached_in, cache_write_in)
    if listed is not None:
        return listed
    return upper_estimate([table], model, tokens_in, tokens_out, cached_in, cache_write_in)


def amount(c: float | UnknownCost) -> float:
    """What a budget counts: the cost, or the estimate of an unknown one."""
    return c.estimate_usd if isinstance(c, UnknownCost) else c
