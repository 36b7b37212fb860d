"""The ``command`` adapter: runs any agent CLI given as a shell command in ``harness.yaml``.

``agent.command`` runs with ``/bin/sh -c`` in the sandbox, in the trial's
clone. Everything else reaches it through the environment and files:

- ``HANGAR_INSTRUCTIONS_FILE``: the task's instructions followed by the
  harness's instructions file, in a read-only directory (``/hangar-in``);
- ``HANGAR_HARNESS_DIR``: the harness lock, read-only at ``/harness``;
- ``HANGAR_TRACE_OUT``: a JSON-lines file in the writable ``/out`` the command
  may append events to; ``turn`` events count turns and ``usage`` events
  (``tokens_in``, ``tokens_out``, ``cost_usd``) the spend;
- ``HANGAR_MODEL``, ``HANGAR_TASK``, ``HANGAR_SEED``, ``HANGAR_VERIFY``, and
  the context's extra variables (API endpoints).

The turn-1 fingerprint is what the adapter launched (CLI and version from
``harness.yaml``, model, instructions and skills digests), overridden by
whatever the command itself reported in its first ``turn`` event's
``fingerprint`` (kept whole under ``reported``): the drift check compares it
with the pin set. The trace file is followed while the command runs, so a
trial budget (``ctx.max_cost_usd``) stops it once its ``usage`` events pass it.
"""

from __future__ import annotations

from typing import Any

from hangar_dagster.experiment.drift import HARNESS_KEYS, harness_fingerprint
from hangar_dagster.experiment.harness import HarnessError, HarnessLock
from hangar_dagster.standins.agent import parse_trace, sandbox_path
from hangar_dagster.trials.agents import NO_BYTECODE_ENV, Agent, AgentContext, AgentRun
from hangar_dagster.trials.agents.live import LiveUsage
from hangar_dagster.trials.agents.run_common import agent_run, ending_error
from hangar_dagster.trials.sandbox import Mount, SandboxRequest, SandboxResult
from hangar_dagster.trials.sandbox._common import read_sandbox_file

HARNESS_MOUNT = "/harness"
IN_MOUNT = "/hangar-in"
OUT_MOUNT = "/out"
INSTRUCTIONS_NAME = "INSTRUCTIONS.md"
TRACE_NAME = "trace.jsonl"
TRACE_LIMIT = 5_000_000  # bytes of the trace file read back


def command_of(harness: HarnessLock) -> str:
    command = harness.config["agent"].get("command")
    if not isinstance(command, str) or not command.strip():
        raise HarnessError(
            f"harness lock {harness.ref}: harness.yaml agent.command is missing; "
            "the command adapter needs the shell command that starts the agent"
        )
    return command


def instructions_text(ctx: AgentContext) -> str:
    """The task's instructions, then the harness's instructions file (if it names one)."""
    parts = [ctx.instructions.rstrip("\n")]
    file = ctx.harness.instructions_file
    if file is not None:
        if not file.is_file():
            raise HarnessError(
                f"harness lock {ctx.harness.ref}: instructions file {file.name} is missing"
            )
        parts.append(file.read_text().rstrip("\n"))
    return "\n\n".join(parts) + "\n"


def fingerprint(ctx: AgentContext) -> dict[str, Any]:
    """What was launched: every contract key, None where the lock leaves it open."""
    return dict.fromkeys(HARNESS_KEYS) | harness_fingerprint(ctx.harness, ctx.model)


def request_for(ctx: AgentContext) -> SandboxRequest:
    command = command_of(ctx.harness)
    in_dir = ctx.out_dir / "in"
    out_dir = ctx.out_dir / "out"
    in_dir.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (in_dir / INSTRUCTIONS_NAME).write_text(instructions_text(ctx))
    (out_dir / TRACE_NAME).touch()
    env = {
        "PATH": sandbox_path(),
        "HOME": "/tmp",
        **ctx.env,
        # Set last: the context's extras cannot redirect hangar's own variables.
        **NO_BYTECODE_ENV,
        "HANGAR_INSTRUCTIONS_FILE": f"{IN_MOUNT}/{INSTRUCTIONS_NAME}",
        "HANGAR_HARNESS_DIR": HARNESS_MOUNT,
        "HANGAR_TRACE_OUT": f"{OUT_MOUNT}/{TRACE_NAME}",
        "HANGAR_MODEL": ctx.model,
        "HANGAR_TASK": ctx.task_id,
        "HANGAR_SEED": ctx.seed,
        "HANGAR_VERIFY": ctx.verify or "",
        **ctx.egress.env,
    }
    return SandboxRequest(
        argv=ctx.egress.wrap(["/bin/sh", "-c", command]),
        workdir=ctx.workdir,
        env=env,
        timeout_s=ctx.timeout_s,
        memory_mb=ctx.memory_mb,
        mounts=[
            Mount(ctx.harness.path, HARNESS_MOUNT),
            Mount(in_dir, IN_MOUNT),
            Mount(out_dir, OUT_MOUNT, writable=True),
            *ctx.egress.mounts,
        ],
        cancel=ctx.cancel,
    )


def _total(events: list[dict[str, Any]], key: str) -> float:
    values = (e.get(key) for e in events if e["type"] == "usage")
    return sum(float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool))


def to_run(
    ctx: AgentContext, result: SandboxResult, trace_text: str, budget_stopped: bool = False
) -> AgentRun:
    events = parse_trace(trace_text)
    first_turn = next((e for e in events if e["type"] == "turn"), None)
    launched = fingerprint(ctx)
    reported = first_turn.get("fingerprint") if first_turn else None
    if isinstance(reported, dict):
        launched["reported"] = reported
        # What the command says it ran wins over what was launched (the adapter contract).
        launched.update({k: v for k, v in reported.items() if k in HARNESS_KEYS})
    return agent_run(
        result,
        events=events,
        turns=sum(1 for e in events if e["type"] == "turn"),
        tokens=(int(_total(events, "tokens_in")), int(_total(events, "tokens_out"))),
        cost_usd=_total(events, "cost_usd"),
        fingerprint=launched,
        # The command's usage events are its own report of what it spent.
        error=ending_error(
            "the agent command",
            ctx,
            result,
            budget_stopped=budget_stopped,
            spend="reported cost",
        ),
        budget_stopped=budget_stopped,
    )


class CommandAgent(Agent):
    name = "command"

    def run(self, ctx: AgentContext) -> AgentRun:
        request = request_for(ctx)
        trace = ctx.out_dir / "out" / TRACE_NAME
        watcher = LiveUsage(ctx)
        with watcher.follow(trace):
            result = ctx.sandbox.run(request)
        trace_text = read_sandbox_file(trace, TRACE_LIMIT)
        return to_run(ctx, result, trace_text or "", budget_stopped=watcher.stopped)
