"""The ``claude-code`` adapter: the real Claude Code CLI, headless, in the trial's sandbox.

It runs ``claude -p --output-format stream-json --verbose`` in the trial's
clone with:

- ``--model`` the variant's concrete model, ``--permission-mode`` from the
  lock's ``approvals`` (``APPROVALS``; Claude Code's own mode names are taken
  as they are; unset is ``full-auto``, since a headless run has nobody to
  ask), ``--max-turns`` when ``harness.yaml``'s adapter section sets
  it (``claude-code: {max_turns: 30}``);
- ``HOME`` a scratch directory (``/hangar-home``) holding the lock's
  instructions file as ``~/.claude/CLAUDE.md`` and its ``skills/`` as
  ``~/.claude/skills/``: where Claude Code reads a user's memory and skills,
  outside the repo, so neither shows in the patch. The lock's ``plugins/`` is
  placed as ``~/.claude/plugins/`` and each of its children (a plugin folder
  or ``.zip``) is passed with ``--plugin-dir``: Claude Code loads no plugin
  from that folder by itself, only installed ones and the ones named so;
- the model API through ``model_api.model_access("anthropic", ctx)``: the CLI
  talks to a loopback forwarder with a placeholder key and the host-side
  proxy adds the real one, so no key enters the sandbox;
- the CLI found on the orchestrator (``HANGAR_AGENT_BIN_DIR``, else ``PATH``)
  with its install directory mounted read-only at the same path.

Its stream-json output is read as it arrives (``on_stdout`` chain: the parser
and the trial budget watcher) and becomes the trace: ``init``, ``turn`` (one
per assistant message), ``reasoning`` (thinking), ``message``, ``tool_call``,
``tool_result`` and ``result`` events; the ``init`` event keeps the plugins, skills and slash
commands the CLI said it loaded. Each turn takes its final
usage from the session transcript under ``~/.claude/projects`` (stream-json
carries the usage a response began with), and the totals are the sum of the
turns (the ``result`` event's when there is no transcript); the cost is the
``result`` event's ``total_cost_usd``, or without one (killed, timed out)
estimated with ``PRICES``. The turn-1 fingerprint takes the CLI version, tools and model
from what the CLI reported (its ``system``/``init`` event and the model of
its first answer), ``plugins_loaded`` from the plugins its ``init`` event
names from the lock's folder, and the instructions, skills and plugins digests from the files as
placed in its HOME.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hangar_dagster.experiment.harness import HarnessError
from hangar_dagster.settings import Settings
from hangar_dagster.standins.agent import sandbox_path
from hangar_dagster.trials.agents import NO_BYTECODE_ENV, Agent, AgentContext, AgentRun, prices
from hangar_dagster.trials.agents.install import (
    find_cli,
    install_mounts,
    place_lock_files,
    prompt,
    scratch_dir,
)
from hangar_dagster.trials.agents.live import LiveUsage
from hangar_dagster.trials.agents.run_common import (
    TEXT_CHARS,
    agent_run,
    as_int,
    cli_request,
    clip,
    ending_error,
    provider_retries,
    reported_by_cli,
    turn_event,
    turn_totals,
)
from hangar_dagster.trials.model_proxy import ModelAccess, model_access
from hangar_dagster.trials.sandbox import Mount, SandboxResult
from hangar_dagster.trials.sandbox._common import read_sandbox_file

ADAPTER = "claude-code"
CLI = "claude"
HOME_MOUNT = "/hangar-home"
PLUGINS_MOUNT = f"{HOME_MOUNT}/.claude/plugins"  # where place_lock_files puts plugins/
INSTALL_HINT = "npm install @anthropic-ai/claude-code@<the lock's agent.version>"
# Lock approvals -> Claude Code permission mode.
APPROVALS = {
    "full-auto": "bypassPermissions",
    "auto-edit": "acceptEdits",
    "suggest": "default",
    "read-only": "plan",
}
NATIVE_MODES = {"default", "acceptEdits", "bypassPermissions", "plan", "dontAsk"}
# Anthropic's list prices (prices.py, cache reads and writes at their own prices), used only
# when the CLI reported no cost (it was killed before its result event). An unknown model's
# cost is unknown: estimated at the table's highest prices, and said so.
PRICES = prices.ANTHROPIC
TRANSCRIPT_LIMIT = 50_000_000  # bytes of the session transcript read back
NO_SUCH_TOOL = "No such tool available"  # what Claude Code answers a call to a tool it lacks
STDOUT_KEEP = 20_000_000  # bytes of stream-json parsed; past it the trace says it was cut
MAX_EVENTS = 2000
MAX_RAW = 50


def permission_mode(ctx: AgentContext) -> str:
    approvals = ctx.harness.config.get("approvals") or "full-auto"
    if approvals in NATIVE_MODES:
        return str(approvals)
    if approvals not in APPROVALS:
        raise HarnessError(
            f"harness lock {ctx.harness.ref}: approvals {approvals!r} has no Claude Code "
            f"permission mode; use one of {', '.join(sorted(APPROVALS | dict.fromkeys(NATIVE_MODES)))}"
        )
    return APPROVALS[approvals]


def max_turns(ctx: AgentContext) -> int | None:
    settings = ctx.harness.config.get(ADAPTER) or {}
    value = settings.get("max_turns")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise HarnessError(
            f"harness lock {ctx.harness.ref}: {ADAPTER}.max_turns {value!r} must be a positive "
            "integer"
        )
    return value


def plugin_dirs(ctx: AgentContext) -> list[str]:
    """Sandbox paths of the lock's plugins: each folder or ``.zip`` in its ``plugins/``."""
    source = ctx.harness.plugins_dir
    if not source.is_dir():
        return []
    return [
        f"{PLUGINS_MOUNT}/{child.name}"
        for child in sorted(source.iterdir())
        if child.is_dir() or child.suffix == ".zip"
    ]


def argv_for(ctx: AgentContext, binary: Path) -> list[str]:
    argv = [str(binary), "-p", "--output-format", "stream-json", "--verbose"]
    argv += ["--model", ctx.model, "--permission-mode", permission_mode(ctx)]
    turns = max_turns(ctx)
    if turns is not None:
        argv += ["--max-turns", str(turns)]
    for plugin in plugin_dirs(ctx):
        argv += ["--plugin-dir", plugin]
    return [*argv, "--", prompt(ctx)]


def _init_plugins(init: dict[str, Any]) -> list[dict[str, Any]] | None:
    plugins = init.get("plugins")
    if not isinstance(plugins, list):
        return None
    return [p for p in plugins if isinstance(p, dict)]


def plugin_sources(init: dict[str, Any]) -> list[str] | None:
    """Every plugin an ``init`` event says was loaded, as ``name@source`` (builtins included)."""
    plugins = _init_plugins(init)
    if plugins is None:
        return None
    return sorted(str(p.get("source") or p.get("name")) for p in plugins)


def lock_plugins_loaded(init: dict[str, Any]) -> list[str] | None:
    """Names of the loaded plugins that came from the lock's folder; None if the CLI said nothing."""
    plugins = _init_plugins(init)
    if plugins is None:
        return None
    return sorted(
        str(p.get("name"))
        for p in plugins
        if str(p.get("path", "")).startswith(f"{PLUGINS_MOUNT}/")
    )


def sandbox_env(ctx: AgentContext, access: ModelAccess) -> dict[str, str]:
    return {
        "PATH": sandbox_path(),
        "TERM": "dumb",
        **ctx.env,
        # Set last: the context's extras cannot redirect the model API or HOME.
        **access.env,
        **NO_BYTECODE_ENV,
        "HOME": HOME_MOUNT,
        "ANTHROPIC_BASE_URL": access.base_url,
        # The sandbox runs the CLI as uid 0 without capabilities; Claude Code refuses
        # bypassPermissions as root unless told it is in a sandbox.
        "IS_SANDBOX": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        **retry_env(ctx),
    }


def retry_env(ctx: AgentContext) -> dict[str, str]:
    """The lock's provider_retries as Claude Code's own knobs (its retries per request and the
    request timeout); nothing where the lock sets none."""
    retries, timeout_s = provider_retries(ctx)
    return {
        **({"CLAUDE_CODE_MAX_RETRIES": str(retries)} if retries is not None else {}),
        **({"API_TIMEOUT_MS": str(timeout_s * 1000)} if timeout_s is not None else {}),
    }


Tokens = tuple[int, int, int, int]  # (in with cache reads and writes, out, cache reads, writes)


def _tokens(usage: Any) -> Tokens:
    """The tokens of an API usage object: input counts the cache reads and writes too (the API
    counts them apart from ``input_tokens``), which are also given on their own."""
    if not isinstance(usage, dict):
        return 0, 0, 0, 0
    read, write = (
        as_int(usage.get("cache_read_input_tokens")),
        as_int(usage.get("cache_creation_input_tokens")),
    )
    return (
        as_int(usage.get("input_tokens")) + read + write,
        as_int(usage.get("output_tokens")),
        read,
        write,
    )


def estimate_cost(
    model: str, tokens_in: int, tokens_out: int, cached_in: int = 0, written_in: int = 0
) -> float | prices.UnknownCost:
    return prices.priced(PRICES, model, tokens_in, tokens_out, cached_in, written_in)


def transcript_usage(home: Path, session_id: str | None) -> dict[str, Tokens]:
    """Message id -> the final usage of each model response, from the session transcript Claude
    Code writes under ``~/.claude/projects``: its stream-json carries each message's usage as the
    response started (one output token), the transcript the usage it ended with."""
    if not session_id:
        return {}
    usage: dict[str, Tokens] = {}
    projects = home / ".claude" / "projects"
    folders = (
        [p for p in projects.iterdir() if p.is_dir() and not p.is_symlink()]
        if projects.is_dir() and not projects.is_symlink()
        else []
    )
    for folder in folders:
        text = read_sandbox_file(folder / f"{Path(session_id).name}.jsonl", TRANSCRIPT_LIMIT)
        for line in (text or "").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            message = record.get("message") if isinstance(record, dict) else None
            if (
                record.get("type") == "assistant"
                and isinstance(message, dict)
                and isinstance(message.get("usage"), dict)
            ):
                usage[str(message.get("id"))] = _tokens(message["usage"])
    return usage


class StreamJson:
    """Claude Code's stream-json, parsed line by line as it arrives (``feed``), into trace events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._partial = b""
        self._seen = 0
        self.cut = False
        self.events: list[dict[str, Any]] = []
        self.init: dict[str, Any] | None = None
        self.result: dict[str, Any] | None = None
        self.first_model: str | None = None
        self.messages: dict[str, Tokens] = {}  # message id -> tokens, as the stream said
        self.turns: dict[str, dict[str, Any]] = {}  # message id -> its turn event
        self.calls: dict[str, dict[str, Any]] = {}  # tool_use id -> its tool_call event
        self._raw = 0

    def feed(self, chunk: bytes) -> None:
        with self._lock:
            if self.cut:
                return
            self._seen += len(chunk)
            if self._seen > STDOUT_KEEP:
                self.cut = True
                self._emit({"type": "raw", "text": f"[stream cut after {STDOUT_KEEP} bytes]"})
                return
            *lines, self._partial = (self._partial + chunk).split(b"\n")
            for line in lines:
                self._line(line.decode("utf-8", errors="replace"))

    def close(self) -> None:
        with self._lock:
            if self._partial.strip() and not self.cut:
                self._line(self._partial.decode("utf-8", errors="replace"))
            self._partial = b""

    def _emit(self, event: dict[str, Any]) -> None:
        if len(self.events) < MAX_EVENTS:
            self.events.append(event)
        elif len(self.events) == MAX_EVENTS:
            self.events.append({"type": "raw", "text": f"[trace cut at {MAX_EVENTS} events]"})

    def _line(self, line: str) -> None:
        if not line.strip():
            return
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            self._raw += 1
            if self._raw <= MAX_RAW:
                self._emit({"type": "raw", "text": line[:TEXT_CHARS]})
            return
        kind = event["type"]
        if kind == "system":
            self._system(event)
        elif kind == "assistant":
            self._assistant(event)
        elif kind == "user":
            self._user(event)
        elif kind == "result":
            self._result(event)
        else:
            self._emit({"type": kind})

    def _system(self, event: dict[str, Any]) -> None:
        if event.get("subtype") == "init" and self.init is None:
            self.init = event
            tools = event.get("tools")
            self._emit(
                {
                    "type": "init",
                    "cli_version": event.get("claude_code_version"),
                    "model": event.get("model"),
                    "tools": sorted(str(t) for t in tools) if isinstance(tools, list) else None,
                    "skills": event.get("skills"),
                    "plugins": plugin_sources(event),
                    "slash_commands": event.get("slash_commands"),
                    "permission_mode": event.get("permissionMode"),
                    "session_id": event.get("session_id"),
                }
            )
        else:
            self._emit({"type": "system", "subtype": event.get("subtype")})

    def _assistant(self, event: dict[str, Any]) -> None:
        message = event.get("message")
        if not isinstance(message, dict):
            return
        message_id = str(message.get("id"))
        model = message.get("model") if isinstance(message.get("model"), str) else None
        # The CLI's own messages (an API error, a refusal to start) carry this model: no model
        # answered, so it is neither a turn nor the model the first turn ran.
        synthetic = model == SYNTHETIC_MODEL
        if not synthetic and message_id not in self.messages:
            self.messages[message_id] = _tokens(message.get("usage"))
            if self.first_model is None:
                self.first_model = model
            self.turns[message_id] = self._turn(len(self.messages), model, message_id)
            self._emit(self.turns[message_id])
        for block in message.get("content") or []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "thinking":
                self._emit({"type": "reasoning", "text": clip(block.get("thinking", ""))})
            elif block.get("type") == "redacted_thinking":
                self._emit({"type": "reasoning", "text": "[thinking redacted by the provider]"})
            elif block.get("type") == "text":
                self._emit({"type": "message", "text": clip(block.get("text", ""))})
            elif block.get("type") == "tool_use":
                call = {
                    "type": "tool_call",
                    "tool": block.get("name"),
                    "id": block.get("id"),
                    "input": clip(block.get("input")),
                }
                self.calls[str(block.get("id"))] = call
                self._emit(call)

    def _turn(self, n: int, model: str | None, message_id: str) -> dict[str, Any]:
        tokens_in, tokens_out, read, write = self.messages[message_id]
        return turn_event(
            n,
            model,
            tokens_in,
            tokens_out,
            read,
            message_id=message_id,
            cache_write_tokens_in=write,
        )

    def settle(self, usage: dict[str, Tokens]) -> bool:
        """Give each turn its final usage (``transcript_usage``); True when every turn had one."""
        for message_id, event in self.turns.items():
            if message_id in usage:
                self.messages[message_id] = usage[message_id]
                event.update(self._turn(event["n"], event["model"], message_id))
        return bool(self.turns) and all(m in usage for m in self.turns)

    def _user(self, event: dict[str, Any]) -> None:
        message = event.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                call = self.calls.get(str(block.get("tool_use_id")))
                if (
                    call is not None
                    and block.get("is_error")
                    and NO_SUCH_TOOL in str(block.get("content"))
                ):
                    call["refused"] = True  # a tool the CLI does not offer: not run
                self._emit(
                    {
                        "type": "tool_result",
                        "id": block.get("tool_use_id"),
                        "is_error": bool(block.get("is_error")),
                        "content": clip(block.get("content")),
                    }
                )

    def _result(self, event: dict[str, Any]) -> None:
        self.result = event
        tokens_in, tokens_out, cached_in, _ = _tokens(event.get("usage"))
        self._emit(
            {
                "type": "result",
                "subtype": event.get("subtype"),
                "is_error": bool(event.get("is_error")),
                "num_turns": event.get("num_turns"),
                "total_cost_usd": event.get("total_cost_usd"),
                "tokens_in": tokens_in,
                "tokens_out": tokens_out,
                "cached_tokens_in": cached_in,
                "duration_ms": event.get("duration_ms"),
                "result": clip(event.get("result")),
            }
        )


def live_cost(model: str) -> Callable[[dict[str, Any]], float | None]:
    """The trial budget's cost function: each new assistant message, priced with ``PRICES``."""
    seen: set[str] = set()

    def cost_of(event: dict[str, Any]) -> float | None:
        message = event.get("message") if event.get("type") == "assistant" else None
        if not isinstance(message, dict) or str(message.get("id")) in seen:
            return None
        seen.add(str(message.get("id")))
        return prices.amount(
            estimate_cost(str(message.get("model") or model), *_tokens(message.get("usage")))
        )

    return cost_of


def chain(*sinks: Callable[[bytes], None]) -> Callable[[bytes], None]:
    """One ``on_stdout`` callback feeding every sink in order."""

    def feed(chunk: bytes) -> None:
        for sink in sinks:
            sink(chunk)

    return feed


def fingerprint(
    ctx: AgentContext, stream: StreamJson, digests: dict[str, str | None]
) -> dict[str, Any]:
    """Turn 1 as the CLI reported it, falling back to what was launched where it said nothing."""
    init = stream.init or {}
    tools = init.get("tools")
    reported_version = init.get("claude_code_version")
    return {
        "adapter": ADAPTER,
        "harness": ctx.harness.ref,
        "cli": CLI,
        "cli_version": reported_version or ctx.harness.config["agent"].get("version"),
        "model": stream.first_model or init.get("model") or ctx.model,
        "tools": sorted(str(t) for t in tools) if isinstance(tools, list) else None,
        **digests,
        "model_requested": init.get("model"),
        "permission_mode": init.get("permissionMode"),
        "plugins_loaded": lock_plugins_loaded(init),
        "reported_by_cli": reported_by_cli(
            cli_version=reported_version,
            model=stream.first_model or init.get("model"),
            tools=tools,
        ),
    }


SYNTHETIC_MODEL = "<synthetic>"


def turns_of(stream: StreamJson) -> int:
    """Model responses: distinct assistant message ids (parallel tool calls share one).

    The CLI's own ``num_turns`` counts tool results + 1, so it is only the fallback for a
    run that ended before any assistant message reached the stream.
    """
    if stream.messages:
        return len(stream.messages)
    return as_int((stream.result or {}).get("num_turns")) or 0


def to_run(
    ctx: AgentContext,
    result: SandboxResult,
    stream: StreamJson,
    digests: dict[str, str | None],
    budget_stopped: bool,
    settled: bool = False,
) -> AgentRun:
    """``settled``: every turn has its final usage (``StreamJson.settle``), so the totals are
    the sum of the turns; otherwise the result event's, else the stream's (output understated)."""
    final = stream.result or {}
    turns = turns_of(stream)
    written = sum(t[3] for t in stream.messages.values())
    if settled or not final:
        _, tokens = turn_totals(stream.events)
    else:
        tokens_in, tokens_out, cached_in, written = _tokens(final.get("usage"))
        tokens = (tokens_in, tokens_out, cached_in)
        stream.events.append(
            {
                "type": "note",
                "text": "no session transcript gave each turn its final usage: the totals are "
                "the result event's, the turns' output tokens as the stream began them",
            }
        )
    cost = final.get("total_cost_usd")
    cost_usd: float | prices.UnknownCost
    if isinstance(cost, int | float) and not isinstance(cost, bool):
        cost_usd = float(cost)
    else:
        cost_usd = estimate_cost(stream.first_model or ctx.model, *tokens, written)
        stream.events.append(
            {
                "type": "note",
                "text": "Claude Code reported no cost (no result event): "
                + (
                    f"cost unknown, estimated at {cost_usd.estimate_usd:g} USD ({cost_usd.basis})"
                    if isinstance(cost_usd, prices.UnknownCost)
                    else f"estimated from tokens with the adapter's price table ({cost_usd:g} USD)"
                ),
            }
        )
    reported = (
        f"ended with {final.get('subtype')}: {clip(final.get('result'))}"
        if final.get("is_error")
        else None
    )
    return agent_run(
        result,
        events=stream.events,
        turns=turns,
        tokens=tokens,
        cost_usd=cost_usd,
        fingerprint=fingerprint(ctx, stream, digests),
        error=ending_error(
            "Claude Code", ctx, result, budget_stopped=budget_stopped, reported=reported
        ),
        budget_stopped=budget_stopped,
    )


class ClaudeCodeAgent(Agent):
    name = ADAPTER

    def find_install(self, settings: Settings) -> Path:
        return find_cli(CLI, INSTALL_HINT, settings.agent_bin_dir)

    def run(self, ctx: AgentContext) -> AgentRun:
        binary = self.find_install(ctx.settings)
        home = scratch_dir(ctx.out_dir / "home")
        # Where Claude Code reads a user's memory and skills: ~/.claude/CLAUDE.md and skills/;
        # plugins/ beside them loads only through argv_for's --plugin-dir.
        digests = place_lock_files(ctx, home / ".claude", "CLAUDE.md")
        argv = argv_for(ctx, binary)
        stream = StreamJson()
        watcher = LiveUsage(ctx, cost_of=live_cost(ctx.model))
        with model_access("anthropic", ctx) as access:
            request = cli_request(
                ctx,
                access,
                argv,
                sandbox_env(ctx, access),
                install_mounts(binary),
                [Mount(home, HOME_MOUNT, writable=True)],
                on_stdout=chain(stream.feed, watcher.feed),
            )
            result = ctx.sandbox.run(request)
        stream.close()
        session_id = (stream.init or {}).get("session_id")
        settled = stream.settle(
            transcript_usage(home, session_id if isinstance(session_id, str) else None)
        )
        return to_run(ctx, result, stream, digests, watcher.stopped, settled)
