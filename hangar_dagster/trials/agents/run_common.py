"""What the CLI adapters share around one run: its sandbox request, trace clipping, how it ended.

Each adapter lays out its own CLI's files and parses its own output into
trace events and totals; the sandbox request around the model forwarder, the
limits on trace text, the fingerprint's ``reported_by_cli``, the error a run
ended with and the ``AgentRun`` it becomes are the same for all of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hangar_dagster.trials.agents import AgentContext, AgentRun
from hangar_dagster.trials.agents.prices import UnknownCost
from hangar_dagster.trials.model_proxy import ModelAccess
from hangar_dagster.trials.sandbox import Mount, SandboxRequest, SandboxResult

TEXT_CHARS = 2000  # of one message, tool input or tool result kept in the trace
TAIL_CHARS = 4000  # of the CLI's stdout and stderr kept as the run's output tail


def cli_request(
    ctx: AgentContext,
    access: ModelAccess,
    argv: list[str],
    env: dict[str, str],
    install: list[Mount],
    scratch: list[Mount],
    *,
    stdin: bytes | None = None,
    on_stdout: Callable[[bytes], None] | None = None,
) -> SandboxRequest:
    """``argv`` under the model forwarder (and the egress grant's) in the trial's clone, with
    the trial's limits.

    Mounted in this order: the CLI's ``install``, the model proxy's socket,
    the egress proxy's, then the adapter's ``scratch`` directories. The grant's
    variables are set last: the adapter's cannot point the CLI past the proxy.
    """
    grant = ctx.egress
    return SandboxRequest(
        argv=grant.wrap(access.wrap(argv)),
        workdir=ctx.workdir,
        env={**env, **grant.env},
        timeout_s=ctx.timeout_s,
        memory_mb=ctx.memory_mb,
        mounts=[*install, *access.mounts, *grant.mounts, *scratch],
        stdin=stdin,
        cancel=access.cancel,  # the trial's cancel, or the proxy giving up on the provider
        on_stdout=on_stdout,
    )


def provider_retries(ctx: AgentContext) -> tuple[int | None, int | None]:
    """The lock's ``provider_retries``: (max_retries, timeout_s), None where it sets none (the
    CLI's own default then; the model proxy bounds a dead provider either way)."""
    raw = ctx.harness.config.get("provider_retries") or {}
    retries, timeout = raw.get("max_retries"), raw.get("timeout_s")
    return (
        retries if isinstance(retries, int) else None,
        timeout if isinstance(timeout, int) else None,
    )


def clip(value: Any) -> Any:
    """``value`` unchanged, or its text cut to ``TEXT_CHARS`` saying how much was cut."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if len(text) <= TEXT_CHARS:
        return value
    return text[:TEXT_CHARS] + f"... [{len(text) - TEXT_CHARS} characters cut]"


def as_int(value: Any) -> int:
    """A count from a CLI's JSON: 0 unless it is an integer (JSON ``true`` is not)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def reported_by_cli(**facts: Any) -> list[str]:
    """The fingerprint keys the CLI itself reported (a value given); the rest fell back to
    what was launched."""
    return sorted(key for key, value in facts.items() if value)


def ending_error(
    agent: str,
    ctx: AgentContext,
    result: SandboxResult,
    *,
    budget_stopped: bool,
    reported: str | None = None,
    no_result: bool = False,
    spend: str = "cost",
) -> str | None:
    """Why the run ended short, the first cause that applies; None when it ended cleanly.

    In order: the trial budget stopped it (``spend`` names what was counted),
    it was cancelled, it ran out of time, the CLI reported a failure of its
    own (``reported``, e.g. ``"ended with error_max_turns"``), or it exited
    non-zero (with its last stderr line). ``no_result`` counts a zero exit
    as a failure too: the CLI left nothing saying how it ended. Every message
    but the budget's starts with ``agent``, the CLI's name.
    """
    if budget_stopped:
        return (
            f"stopped: its {spend} passed trial_job_budget.max_cost_usd ({ctx.max_cost_usd:g} USD)"
        )
    if result.cancelled:
        return f"{agent} was cancelled"
    if result.timed_out:
        return f"{agent} ran out of time ({ctx.timeout_s:g}s)"
    if reported is not None:
        return f"{agent} {reported}"
    if result.exit_code != 0 or no_result:
        last = result.stderr.strip().splitlines()[-1:] or [""]
        return f"{agent} exited with code {result.exit_code}" + (f": {last[0]}" if last[0] else "")
    return None


def agent_run(
    result: SandboxResult,
    *,
    events: list[dict[str, Any]],
    turns: int,
    tokens: tuple[int, int] | tuple[int, int, int],
    cost_usd: float | UnknownCost,
    fingerprint: dict[str, Any],
    error: str | None,
    budget_stopped: bool,
) -> AgentRun:
    """The ``AgentRun`` of a finished sandbox run; ``tokens`` is (in, out[, cached in])."""
    if isinstance(cost_usd, UnknownCost):
        cost, unknown = cost_usd.estimate_usd, cost_usd.basis
    else:
        cost, unknown = cost_usd, None
    output = result.stdout + (f"\n--- stderr ---\n{result.stderr}" if result.stderr else "")
    return AgentRun(
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        events=events,
        turns=turns,
        tokens_in=tokens[0],
        tokens_out=tokens[1],
        cached_tokens_in=tokens[2] if len(tokens) > 2 else 0,
        cost_usd=cost,
        cost_unknown=unknown,
        fingerprint=fingerprint,
        output_tail=output[-TAIL_CHARS:],
        error=error,
        budget_stopped=budget_stopped,
    )


def turn_event(
    n: int, model: str | None, tokens_in: int, tokens_out: int, cached_in: int, **extra: Any
) -> dict[str, Any]:
    """One model response in the trace: ``tokens_in`` counts the cached input too,
    ``cached_tokens_in`` is that cached part."""
    return {
        "type": "turn",
        "n": n,
        "model": model,
        **extra,
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "cached_tokens_in": cached_in,
    }


def turn_totals(events: list[dict[str, Any]]) -> tuple[int, tuple[int, int, int]]:
    """(turns, (tokens in, out, cached in)) summed over the ``turn`` events: a trace's totals."""
    turns = [e for e in events if e.get("type") == "turn"]
    return len(turns), (
        sum(as_int(e.get("tokens_in")) for e in turns),
        sum(as_int(e.get("tokens_out")) for e in turns),
        sum(as_int(e.get("cached_tokens_in")) for e in turns),
    )
