"""The ``standin`` adapter: runs the scripted stand-in agent (no model) in the trial's sandbox.

The program itself is ``standin_main``; this side builds its sandbox request
(harness lock read-only at /harness, a writable /out for RESULT.md outside
the repo, a complete environment) and reads its JSON-lines trace back into an
``AgentRun``. Lines that are not JSON objects are kept as bounded ``raw``
events rather than failing the trial.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hangar_dagster.standins.agent_main import HARNESS_MOUNT, OUT_MOUNT
from hangar_dagster.trials.agents import NO_BYTECODE_ENV, Agent, AgentContext, AgentRun
from hangar_dagster.trials.sandbox import Mount, SandboxRequest, SandboxResult

MODULE = "hangar_dagster.standins.agent_main"
OUT_SUBDIR = "standin-out"  # under ctx.out_dir; mounted at /out, holds RESULT.md
MAX_EVENTS = 2000
MAX_RAW_EVENTS = 50
RAW_CHARS = 500
TAIL_CHARS = 4000


def result_file(out_dir: Path) -> Path:
    """Where the stand-in's RESULT.md lands on the host for a trial with this ``out_dir``."""
    return out_dir / OUT_SUBDIR / "RESULT.md"


def sandbox_path() -> str:
    # The venv's bin first: the visible check runs ``python -m pytest`` from it.
    return f"{Path(sys.prefix) / 'bin'}:/usr/local/bin:/usr/bin:/bin"


def request_for(ctx: AgentContext) -> SandboxRequest:
    out = result_file(ctx.out_dir).parent
    out.mkdir(parents=True, exist_ok=True)
    env = {
        "HANGAR_HARNESS_DIR": HARNESS_MOUNT,
        "HANGAR_TASK": ctx.task_id,
        "HANGAR_SEED": ctx.seed,
        "HANGAR_MODEL": ctx.model,
        "HANGAR_INSTRUCTIONS": ctx.instructions,
        "HANGAR_VERIFY": ctx.verify or "",
        "HOME": "/tmp",
        "PATH": sandbox_path(),
        **NO_BYTECODE_ENV,
        **ctx.egress.env,
    }
    return SandboxRequest(
        argv=ctx.egress.wrap([sys.executable, "-I", "-m", MODULE]),
        workdir=ctx.workdir,
        env=env,
        timeout_s=ctx.timeout_s,
        memory_mb=ctx.memory_mb,
        mounts=[
            Mount(ctx.harness.path, HARNESS_MOUNT),
            Mount(out, OUT_MOUNT, writable=True),
            *ctx.egress.mounts,
        ],
        cancel=ctx.cancel,
    )


def parse_trace(stdout: str) -> list[dict[str, Any]]:
    """The events in the stand-in's stdout; other lines become at most MAX_RAW_EVENTS raw events."""
    events: list[dict[str, Any]] = []
    raw = 0
    for line in stdout.splitlines():
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raw += 1
            if raw > MAX_RAW_EVENTS:
                continue
            event = {"type": "raw", "text": line[:RAW_CHARS]}
        events.append(event)
        if len(events) >= MAX_EVENTS:
            events.append({"type": "raw", "text": f"[trace cut at {MAX_EVENTS} events]"})
            break
    return events


def _number(event: dict[str, Any], key: str) -> float:
    value = event.get(key, 0)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def to_run(result: SandboxResult) -> AgentRun:
    """An ``AgentRun`` from the sandbox's result: trace, totals, turn-1 fingerprint, error."""
    events = parse_trace(result.stdout)
    usage = [e for e in events if e["type"] == "usage"]
    first_turn = next((e for e in events if e["type"] == "turn"), None)
    fingerprint = first_turn.get("fingerprint") if first_turn else None
    errors = [str(e.get("message", "")) for e in events if e["type"] == "error"]
    error = None
    if result.timed_out:
        error = "the stand-in agent ran out of time"
    elif errors:
        error = errors[-1]
    elif result.exit_code != 0:
        error = f"the stand-in agent exited with code {result.exit_code}"
    return AgentRun(
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        events=events,
        turns=sum(1 for e in events if e["type"] == "turn"),
        tokens_in=int(sum(_number(e, "tokens_in") for e in usage)),
        tokens_out=int(sum(_number(e, "tokens_out") for e in usage)),
        cost_usd=sum(_number(e, "cost_usd") for e in usage),
        fingerprint=fingerprint if isinstance(fingerprint, dict) else {},
        output_tail=(result.stdout + result.stderr)[-TAIL_CHARS:],
        error=error,
    )


class StandinAgent(Agent):
    name = "standin"
    is_standin = True

    def run(self, ctx: AgentContext) -> AgentRun:
        return to_run(ctx.sandbox.run(request_for(ctx)))
