"""The ``mini-swe-agent`` adapter: the real ``mini`` CLI (PyPI ``mini-swe-agent``) in the trial's sandbox.

It runs ``mini --yolo --exit-immediately`` in the trial's clone with:

- ``-c`` the lock's own mini config (``mini-swe-agent: {config: FILE}`` in
  ``harness.yaml``, a file in the lock) or the CLI's built-in ``mini.yaml``,
  then hangar's layer (``/hangar-in/hangar.yaml``): the task text
  (``run.task``: the task's instructions, the lock's instructions file, and
  the list of the lock's skills, which are read-only under
  ``/harness/skills``) and the model API (``model.model_kwargs.api_base``);
- ``-m openai/<model>``: litellm's name for the variant's concrete model
  (a model id already prefixed ``openai/`` is taken as it is), reached through
  ``model_api.model_access("openai", ctx)`` (a placeholder key in
  ``OPENAI_API_KEY``; the host proxy adds the real one);
- ``-l`` the trial budget (``ctx.max_cost_usd``, else 0: no limit; the
  built-in default of 3 USD would otherwise stop long trials): mini-swe-agent
  enforces it itself from the cost litellm computes, and ends with
  ``LimitsExceeded``, which the adapter reports as ``budget_stopped``;
- ``-o /out/trajectory.json``: the trajectory mini writes after every step;
- the CLI found on the orchestrator (``HANGAR_AGENT_BIN_DIR``, else
  ``PATH``): ``mini`` of a virtualenv, whose directory is mounted read-only at
  the same path (and its base interpreter, when the sandbox does not show it).

The trace is the trajectory: per model response a ``turn`` (the model the API
reported, its tokens with the cached ones apart, litellm's cost), its
``reasoning`` and ``message`` text, a ``tool_call`` per bash action and its
``tool_result``, format errors, and the ``exit`` status. A response without
a tool call is a turn too (mini keeps it in the ``FormatError`` message it
answers with), and the calls of a response mini refused are ``tool_call``
events marked ``refused``; the run's totals are the sum of the turns. The cost is mini-swe-agent's own
(``info.model_stats.instance_cost``); when litellm has no price for the model the cost is
unknown, estimated at the highest prices hangar lists, with a note (mini's own ``-l`` limit
then counts nothing: a trial budget does not stop it). The turn-1 fingerprint takes ``cli_version`` from the
trajectory's ``mini_version``, the model from the first response, the tools
from the first request the proxy logged, and the instructions and skills
digests from the lock's files, with whether the first prompt carried them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hangar_dagster.experiment.harness import HarnessError, tree_digest
from hangar_dagster.settings import Settings
from hangar_dagster.standins.agent import sandbox_path
from hangar_dagster.trials.agents import NO_BYTECODE_ENV, Agent, AgentContext, AgentRun, prices
from hangar_dagster.trials.agents.install import (
    find_cli,
    lock_instructions,
    prompt,
    scratch_dir,
    venv_cli,
    venv_mounts,
)
from hangar_dagster.trials.agents.run_common import (
    agent_run,
    as_int,
    cli_request,
    clip,
    ending_error,
    provider_retries,
    reported_by_cli,
    turn_event,
)
from hangar_dagster.trials.model_proxy import (
    EGRESS_NAME,
    ModelAccess,
    first_request_tools,
    model_access,
)
from hangar_dagster.trials.sandbox import Mount, SandboxResult
from hangar_dagster.trials.sandbox._common import read_sandbox_file

ADAPTER = "mini-swe-agent"
CLI = "mini-swe-agent"  # the lock's agent.cli; the binary is ``mini``
BINARY = "mini"
INSTALL_HINT = "pip install mini-swe-agent==<the lock's agent.version>"
HARNESS_MOUNT = "/harness"
IN_MOUNT = "/hangar-in"
OUT_MOUNT = "/out"
HOME_MOUNT = "/hangar-home"
TRAJECTORY = "trajectory.json"
HANGAR_CONFIG = "hangar.yaml"
BUILTIN_CONFIG = "mini.yaml"
SETTINGS = ("config",)  # keys of the lock's ``mini-swe-agent:`` section
TRAJECTORY_LIMIT = 50_000_000
EGRESS_LIMIT = 5_000_000


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# ---- what mini-swe-agent recorded: its trajectory file --------------------------------


@dataclass
class Trajectory:
    events: list[dict[str, Any]] = field(default_factory=list)
    mini_version: str | None = None
    exit_status: str | None = None
    cost_usd: float = 0.0
    api_calls: int = 0
    model_name: str | None = None  # as configured (litellm's name)
    first_model: str | None = None  # as the API reported it in the first response
    turns: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cached_in: int = 0
    first_prompt: str = ""  # the first user message: the task as mini rendered it


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _turn(traj: Trajectory, message: dict[str, Any] | None, extra: dict[str, Any]) -> None:
    """One model response: its ``turn`` (tokens, cached ones apart, and litellm's cost),
    ``reasoning``, ``message`` and a ``tool_call`` per action. ``message`` is the assistant
    message, or None for a response mini refused (no tool call: a FormatError), whose message
    is only in ``extra.response``."""
    response = _dict(extra.get("response"))
    model = response.get("model") if isinstance(response.get("model"), str) else None
    usage = _dict(response.get("usage"))
    tokens_in, tokens_out = (
        as_int(usage.get("prompt_tokens")),
        as_int(usage.get("completion_tokens")),
    )
    cached_in = as_int(_dict(usage.get("prompt_tokens_details")).get("cached_tokens"))
    traj.turns += 1
    traj.tokens_in += tokens_in
    traj.tokens_out += tokens_out
    traj.cached_in += cached_in
    if traj.first_model is None:
        traj.first_model = model
    traj.events.append(
        turn_event(
            traj.turns, model, tokens_in, tokens_out, cached_in, cost_usd=_number(extra.get("cost"))
        )
    )
    choices = _list(response.get("choices"))
    answered = _dict(_dict(choices[0]).get("message")) if choices else {}
    refused = message is None
    message = answered if message is None else message
    reasoning = message.get("reasoning_content") or answered.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        traj.events.append({"type": "reasoning", "text": clip(reasoning)})
    if text := _content(message):
        traj.events.append({"type": "message", "text": clip(text)})
    if refused:  # mini ran none of its calls (an unknown tool, a bad argument): kept, refused
        for call in _list(message.get("tool_calls")):
            function = _dict(_dict(call).get("function"))
            traj.events.append(
                {
                    "type": "tool_call",
                    "tool": function.get("name"),
                    "id": _dict(call).get("id"),
                    "input": clip(function.get("arguments")),
                    "refused": True,
                }
            )
    actions = _list(extra.get("actions"))
    for action in actions:
        if isinstance(action, dict):
            traj.events.append(
                {
                    "type": "tool_call",
                    "tool": "bash",
                    "id": action.get("tool_call_id"),
                    "input": clip(action.get("command")),
                }
            )


def parse_trajectory(text: str) -> Trajectory:
    """mini-swe-agent's trajectory JSON as hangar trace events and totals (pure)."""
    traj = Trajectory()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        if text.strip():
            traj.events.append({"type": "raw", "text": "trajectory file is not a JSON object"})
        return traj
    info = _dict(data.get("info"))
    stats = _dict(info.get("model_stats"))
    config = _dict(info.get("config"))
    model_config = _dict(config.get("model"))
    traj.mini_version = info.get("mini_version")
    traj.exit_status = info.get("exit_status") or None
    traj.cost_usd = _number(stats.get("instance_cost"))
    traj.api_calls = as_int(stats.get("api_calls"))
    traj.model_name = model_config.get("model_name")
    messages = _list(data.get("messages"))
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        extra = _dict(message.get("extra"))
        if role == "assistant":
            _turn(traj, message, extra)
        elif role == "tool" or (role == "user" and "returncode" in extra):
            returncode = extra.get("returncode")
            traj.events.append(
                {
                    "type": "tool_result",
                    "id": message.get("tool_call_id"),
                    "is_error": returncode != 0,
                    "exit_code": returncode,
                    "content": clip(extra.get("raw_output", _content(message))),
                }
            )
        elif role == "user" and extra.get("interrupt_type"):
            if extra.get("response"):  # a response mini refused: a turn all the same
                _turn(traj, None, extra)
            traj.events.append(
                {
                    "type": "interrupt",
                    "kind": extra["interrupt_type"],
                    "text": clip(_content(message)),
                }
            )
        elif role == "user" and not traj.first_prompt:
            traj.first_prompt = _content(message)
        elif role == "exit":
            traj.events.append(
                {
                    "type": "exit",
                    "exit_status": extra.get("exit_status"),
                    "submission": clip(extra.get("submission", "")),
                }
            )
    return traj


# ---- launching -----------------------------------------------------------------------


def settings(ctx: AgentContext) -> dict[str, Any]:
    raw = ctx.harness.config.get(ADAPTER) or {}
    unknown = sorted(set(raw) - set(SETTINGS))
    if unknown:
        raise HarnessError(
            f"harness lock {ctx.harness.ref}: unknown {ADAPTER} setting(s) {', '.join(unknown)}; "
            f"the section takes {', '.join(SETTINGS)}"
        )
    return dict(raw)


def base_config(ctx: AgentContext) -> str:
    """The ``-c`` base: the lock's own mini config (in the sandbox) or the built-in one."""
    name = settings(ctx).get("config")
    if name is None:
        return BUILTIN_CONFIG
    target = (ctx.harness.path / str(name)).resolve()
    if not target.is_relative_to(ctx.harness.path.resolve()) or not target.is_file():
        raise HarnessError(
            f"harness lock {ctx.harness.ref}: {ADAPTER}.config names {name!r}, which is not a "
            "file in the lock; put the mini-swe-agent config YAML beside harness.yaml"
        )
    return f"{HARNESS_MOUNT}/{target.relative_to(ctx.harness.path.resolve()).as_posix()}"


def litellm_model(ctx: AgentContext) -> str:
    model = ctx.model
    if model.startswith("openai/"):
        return model
    if "/" in model:
        raise HarnessError(
            f"harness lock {ctx.harness.ref}: model {model!r} names another litellm provider; "
            "the mini-swe-agent adapter reaches models through the OpenAI API: give an OpenAI "
            "model id (e.g. gpt-5-2025-08-07 or openai/gpt-5-2025-08-07)"
        )
    return f"openai/{model}"


def skill_names(ctx: AgentContext) -> list[str]:
    skills = ctx.harness.skills_dir
    return sorted(p.name for p in skills.iterdir() if p.is_dir()) if skills.is_dir() else []


def task_text(ctx: AgentContext) -> str:
    """What mini is asked: the task, the lock's instructions, and where its skills are."""
    parts = [prompt(ctx)]
    instructions = lock_instructions(ctx)
    if instructions is not None:
        parts.append(instructions.decode().rstrip("\n"))
    names = skill_names(ctx)
    if names:
        listing = "\n".join(f"- {n}: {HARNESS_MOUNT}/skills/{n}/SKILL.md" for n in names)
        parts.append(f"Skills you can use (read a skill's SKILL.md before using it):\n{listing}")
    return "\n\n".join(parts) + "\n"


def hangar_config(ctx: AgentContext, base_url: str) -> str:
    retries, timeout_s = provider_retries(ctx)
    kwargs: dict[str, Any] = {"api_base": base_url.rstrip("/") + "/v1"}
    # litellm hands these to the provider client, which retries on its own (2 by default).
    if retries is not None:
        kwargs["max_retries"] = retries
    if timeout_s is not None:
        kwargs["timeout"] = timeout_s
    return yaml.safe_dump(
        {
            "run": {"task": task_text(ctx)},
            "model": {"model_kwargs": kwargs},
        },
        sort_keys=False,
    )


def argv_for(ctx: AgentContext, binary: Path, config: str) -> list[str]:
    limit = ctx.max_cost_usd if ctx.max_cost_usd is not None else 0
    return [
        str(binary),
        "--yolo",
        "--exit-immediately",
        "-m",
        litellm_model(ctx),
        "-l",
        f"{limit:g}",
        "-c",
        config,
        "-c",
        f"{IN_MOUNT}/{HANGAR_CONFIG}",
        "-o",
        f"{OUT_MOUNT}/{TRAJECTORY}",
    ]


def sandbox_env(ctx: AgentContext, access: ModelAccess) -> dict[str, str]:
    return {
        "PATH": sandbox_path(),
        "TERM": "dumb",
        "NO_COLOR": "1",
        "COLUMNS": "200",
        **ctx.env,
        # Set last: the context's extras cannot redirect the model API or HOME.
        **access.env,
        **NO_BYTECODE_ENV,
        "HOME": HOME_MOUNT,
        "MSWEA_GLOBAL_CONFIG_DIR": f"{HOME_MOUNT}/mini-swe-agent",
        "MSWEA_CONFIGURED": "true",  # skip the first-run setup prompt
        # An unknown model's cost is 0 to litellm instead of failing the run; the adapter then
        # records it as unknown, with an estimate (prices.upper_estimate).
        "MSWEA_COST_TRACKING": "ignore_errors",
        # litellm would fetch its price list from the internet at import.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        **retry_env(ctx),
    }


def retry_env(ctx: AgentContext) -> dict[str, str]:
    """The lock's provider_retries as mini-swe-agent's own loop: tenacity around litellm counts
    attempts (retries + 1). The provider client's own retries and timeout are set through
    litellm's model_kwargs (``hangar_config``)."""
    retries, _ = provider_retries(ctx)
    if retries is None:
        return {}
    return {"MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": str(retries + 1)}


# ---- the run -------------------------------------------------------------------------


def fingerprint(ctx: AgentContext, traj: Trajectory, tools: list[str] | None) -> dict[str, Any]:
    file = ctx.harness.instructions_file
    instructions = file.read_text() if file is not None and file.is_file() else None
    skills, plugins = ctx.harness.skills_dir, ctx.harness.plugins_dir
    configured = traj.model_name or litellm_model(ctx)
    return {
        "adapter": ADAPTER,
        "harness": ctx.harness.ref,
        "cli": CLI,
        "cli_version": traj.mini_version or ctx.harness.config["agent"].get("version"),
        "model": traj.first_model or configured.removeprefix("openai/"),
        "tools": tools,
        "instructions_digest": hashlib.sha256(instructions.encode()).hexdigest()
        if instructions is not None
        else None,
        "skills_digest": tree_digest(skills) if skills.is_dir() else None,
        # mini-swe-agent loads no plugins: they are only visible under /harness/plugins.
        "plugins_digest": tree_digest(plugins) if plugins.is_dir() else None,
        "model_requested": configured,
        "instructions_seen": instructions is not None and instructions.strip() in traj.first_prompt,
        "skills_seen": [n for n in skill_names(ctx) if f"/skills/{n}/" in traj.first_prompt],
        "reported_by_cli": reported_by_cli(
            cli_version=traj.mini_version, model=traj.first_model, tools=tools
        ),
    }


def to_run(
    ctx: AgentContext, result: SandboxResult, traj: Trajectory, tools: list[str] | None
) -> AgentRun:
    events = list(traj.events)
    cost: float | prices.UnknownCost = traj.cost_usd
    if traj.turns and traj.cost_usd == 0:
        # Any provider's model: its tokens at the highest prices hangar lists for either.
        cost = prices.upper_estimate(
            [prices.ANTHROPIC, prices.OPENAI],
            ctx.model,  # the pinned id, not litellm's provider-prefixed name
            traj.tokens_in,
            traj.tokens_out,
            traj.cached_in,
        )
        events.append(
            {
                "type": "note",
                "text": f"mini-swe-agent (litellm) has no price for {traj.model_name!r}: cost "
                f"unknown, estimated at {cost.estimate_usd:g} USD ({cost.basis})",
            }
        )
    budget_stopped = ctx.max_cost_usd is not None and traj.exit_status == "LimitsExceeded"
    error = ending_error(
        "mini-swe-agent",
        ctx,
        result,
        budget_stopped=budget_stopped,
        reported=f"ended with {traj.exit_status}"
        if traj.exit_status not in (None, "Submitted")
        else None,
        no_result=traj.exit_status is None,  # no trajectory: even exit 0 is a failure
    )
    return agent_run(
        result,
        events=events,
        turns=traj.turns,
        tokens=(traj.tokens_in, traj.tokens_out, traj.cached_in),
        cost_usd=cost,
        fingerprint=fingerprint(ctx, traj, tools),
        error=error,
        budget_stopped=budget_stopped,
    )


class MiniSweAgent(Agent):
    name = ADAPTER

    def find_install(self, settings: Settings) -> Path:
        # Through any links (pipx's, a bin folder's): the venv's own script is what runs.
        return venv_cli(find_cli(BINARY, INSTALL_HINT, settings.agent_bin_dir), INSTALL_HINT)

    def run(self, ctx: AgentContext) -> AgentRun:
        config = base_config(ctx)  # the lock's settings are checked before anything runs
        binary = self.find_install(ctx.settings)
        mounts = venv_mounts(binary)
        scratch = {name: scratch_dir(ctx.out_dir / name) for name in ("in", "out", "home")}
        with model_access("openai", ctx) as access:
            (scratch["in"] / HANGAR_CONFIG).write_text(hangar_config(ctx, access.base_url))
            # mini enforces the budget itself (-l); its stdout is a human transcript.
            request = cli_request(
                ctx,
                access,
                argv_for(ctx, binary, config),
                sandbox_env(ctx, access),
                mounts,
                [
                    Mount(ctx.harness.path, HARNESS_MOUNT),
                    Mount(scratch["in"], IN_MOUNT),
                    Mount(scratch["out"], OUT_MOUNT, writable=True),
                    Mount(scratch["home"], HOME_MOUNT, writable=True),
                ],
                stdin=b"",
            )
            result = ctx.sandbox.run(request)
        traj = parse_trajectory(
            read_sandbox_file(scratch["out"] / TRAJECTORY, TRAJECTORY_LIMIT) or ""
        )
        egress = read_sandbox_file(ctx.out_dir / EGRESS_NAME, EGRESS_LIMIT) or ""
        return to_run(ctx, result, traj, first_request_tools(egress, "/chat/completions"))
