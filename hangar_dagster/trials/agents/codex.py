"""The ``codex`` adapter: the real Codex CLI (``codex exec --json``), headless, in the trial's sandbox.

It runs ``codex exec --json --skip-git-repo-check
--dangerously-bypass-approvals-and-sandbox --color never -`` in the trial's
clone, the prompt on stdin, with:

- ``HOME`` a scratch directory (``/hangar-home``) and ``CODEX_HOME`` its
  ``.codex``: a ``config.toml`` naming the variant's concrete model and one
  model provider, ``hangar``, whose ``base_url`` is the in-sandbox end of
  ``model_api.model_access("openai", ctx)`` (Responses API; the placeholder
  key in ``OPENAI_API_KEY``, the real one added by the host proxy); the lock's
  instructions file as ``AGENTS.md`` and its ``skills/`` as ``skills/``, where
  Codex reads a user's global instructions and skills, outside the repo; its
  ``plugins/`` as ``plugins/``, where Codex does not load them (it loads
  plugins installed from a marketplace, cached under ``plugins/cache/`` and
  enabled in ``config.toml``): they are placed and fingerprinted, not loaded;
- Codex's own sandbox and approvals switched off: hangar's sandbox is the
  boundary (Codex's landlock/seccomp and bundled bwrap cannot nest inside it),
  so the lock's ``approvals`` must be ``full-auto`` (or unset);
- the CLI found on the orchestrator (``HANGAR_AGENT_BIN_DIR``, else ``PATH``)
  with its npm install (and node, when outside the system directories)
  mounted read-only at the same path.

The trace comes from the CLI's own output: its ``--json`` events on stdout
(``thread.started``, ``item.*`` for messages, commands, file changes, MCP
and web tools, ``turn.completed`` with usage) become ``init``, ``reasoning``, ``message``,
``tool_call``/``tool_result``, ``usage`` and ``error`` events, and the
session file Codex writes under ``CODEX_HOME/sessions`` gives one ``turn``
per model response with its tokens (cached input apart) and the tool calls
``--json`` leaves out (a call to a tool Codex did not offer, answered
"unsupported call", becomes a ``tool_call`` marked ``refused``); the run's
totals are the sum of the turns. The turn-1 fingerprint takes ``cli_version`` and
``model`` from that session file (its ``session_meta`` and first
``turn_context``), the tools from the first request the proxy logged in
``egress.jsonl``, and the instructions, skills and plugins digests from the
files as placed (with whether the session shows Codex read the first two). Codex reports no
cost: it is estimated from tokens with ``PRICES`` (OpenAI's list prices in
``prices.py``, cached input at its cached price; for an unknown model the cost is
unknown and estimated at the table's highest prices,
with a note in the trace). While it runs, the session file is followed for
its token counts so a trial budget (``ctx.max_cost_usd``) can stop it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hangar_dagster.experiment.harness import HarnessError
from hangar_dagster.settings import Settings
from hangar_dagster.standins.agent import parse_trace, sandbox_path
from hangar_dagster.trials.agents import NO_BYTECODE_ENV, Agent, AgentContext, AgentRun, prices
from hangar_dagster.trials.agents.install import (
    CliUnavailable,
    find_cli,
    install_mounts,
    place_lock_files,
    prompt,
    scratch_dir,
)
from hangar_dagster.trials.agents.live import LiveUsage
from hangar_dagster.trials.agents.run_common import (
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
from hangar_dagster.trials.model_proxy import (
    EGRESS_NAME,
    ModelAccess,
    first_request_tools,
    model_access,
)
from hangar_dagster.trials.sandbox import Mount, SandboxResult
from hangar_dagster.trials.sandbox._common import read_sandbox_file
from hangar_dagster.util.background import while_running

ADAPTER = "codex"
CLI = "codex"
HOME_MOUNT = "/hangar-home"
CODEX_DIR = ".codex"  # CODEX_HOME, under HOME
INSTALL_HINT = "npm install @openai/codex@<the lock's agent.version>"
PROVIDER_ID = "hangar"
SESSIONS_LIMIT = 20_000_000  # bytes of the session file read back
EGRESS_LIMIT = 5_000_000
POLL_S = 0.2
# Codex reports tokens but no cost: priced with OpenAI's list prices (prices.py), cached
# input at its cached price. An unknown model's cost is unknown: estimated, and said so.
PRICES = prices.OPENAI
CALL_ITEMS = ("function_call", "custom_tool_call", "local_shell_call")
OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")
REFUSED_PREFIX = "unsupported call"  # what Codex answers a call to a tool it did not offer


def estimate_cost(
    model: str, tokens_in: int, tokens_out: int, cached_in: int = 0
) -> float | prices.UnknownCost:
    """USD for these tokens (cached input at the cached price); for a model not in ``PRICES``,
    an upper estimate (``prices.upper_estimate``)."""
    return prices.priced(PRICES, model, tokens_in, tokens_out, cached_in)


# ---- what Codex printed: ``codex exec --json`` -------------------------------------


@dataclass
class ExecOutput:
    """The trace events and totals read from ``codex exec --json`` stdout."""

    events: list[dict[str, Any]] = field(default_factory=list)
    thread_id: str | None = None
    turns_completed: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cached_in: int = 0
    errors: list[str] = field(default_factory=list)
    final_message: str | None = None


def _tool_call(item: dict[str, Any]) -> dict[str, Any] | None:
    """The ``tool_call`` event of a started or completed tool item, None for other items."""
    kind = item.get("type")
    base = {"type": "tool_call", "id": item.get("id")}
    if kind == "command_execution":
        return {**base, "tool": "shell", "input": clip(item.get("command"))}
    if kind == "file_change":
        return {**base, "tool": "apply_patch", "input": clip(item.get("changes"))}
    if kind == "mcp_tool_call":
        return {
            **base,
            "tool": f"{item.get('server')}.{item.get('tool')}",
            "input": clip(item.get("arguments")),
        }
    if kind == "web_search":
        return {**base, "tool": "web_search", "input": clip(item.get("query"))}
    return None


def _tool_result(item: dict[str, Any]) -> dict[str, Any]:
    status = item.get("status")
    exit_code = item.get("exit_code")
    output = item.get("aggregated_output", item.get("result", item.get("error")))
    return {
        "type": "tool_result",
        "id": item.get("id"),
        "is_error": status == "failed" or (isinstance(exit_code, int) and exit_code != 0),
        "exit_code": exit_code,
        "content": clip(output),
    }


def parse_exec_json(stdout: str) -> ExecOutput:
    """Codex's ``--json`` events as hangar trace events (pure: over saved output)."""
    out = ExecOutput()
    called: set[str] = set()  # item ids whose tool_call event is out
    for event in parse_trace(stdout):
        kind = event["type"]
        raw_item = event.get("item")
        item: dict[str, Any] | None = raw_item if isinstance(raw_item, dict) else None
        if kind == "thread.started":
            out.thread_id = event.get("thread_id")
            out.events.append({"type": "init", "thread_id": out.thread_id})
        elif kind in ("item.started", "item.updated", "item.completed") and item is not None:
            call = _tool_call(item)
            if call is not None:
                if str(item.get("id")) not in called:
                    called.add(str(item.get("id")))
                    out.events.append(call)
                if kind == "item.completed":
                    out.events.append(_tool_result(item))
            elif kind != "item.completed":
                continue
            elif item.get("type") == "agent_message":
                out.final_message = str(item.get("text", ""))
                out.events.append({"type": "message", "text": clip(item.get("text", ""))})
            elif item.get("type") == "reasoning":
                out.events.append({"type": "reasoning", "text": clip(item.get("text", ""))})
            elif item.get("type") == "error":
                out.events.append({"type": "warning", "message": clip(item.get("message"))})
            else:
                out.events.append({"type": str(item.get("type"))})
        elif kind == "turn.completed":
            raw_usage = event.get("usage")
            usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
            tokens_in, tokens_out = (
                as_int(usage.get("input_tokens")),
                as_int(usage.get("output_tokens")),
            )
            cached_in = as_int(usage.get("cached_input_tokens"))
            out.turns_completed += 1
            out.tokens_in += tokens_in
            out.tokens_out += tokens_out
            out.cached_in += cached_in
            # The exec's total over all its responses; the turn events hold each response's.
            out.events.append(
                {
                    "type": "usage",
                    "tokens_in": tokens_in,
                    "tokens_out": tokens_out,
                    "cached_tokens_in": cached_in,
                }
            )
        elif kind in ("turn.failed", "error"):
            error = event.get("error")
            message = error.get("message") if isinstance(error, dict) else event.get("message")
            out.errors.append(str(message))
            out.events.append({"type": "error", "message": clip(message)})
        elif kind == "raw":
            out.events.append(event)
        else:
            out.events.append({"type": kind})
    return out


# ---- what Codex recorded: its session file under CODEX_HOME/sessions -----------------


@dataclass
class Session:
    """Turn-1 facts and per-response usage from Codex's session (rollout) file."""

    cli_version: str | None = None
    model: str | None = None  # of the first turn
    provider: str | None = None
    responses: list[str] = field(default_factory=list)  # response ids, in order
    # response id -> (tokens in with the cached ones, out, cached in), from token_usage_record
    usage: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    calls: list[dict[str, Any]] = field(default_factory=list)  # every tool call the model made
    outputs: dict[str, str] = field(default_factory=dict)  # call id -> what Codex answered
    items: set[str] = field(default_factory=set)  # ids of the items Codex carried out
    total_tokens: tuple[int, int] | None = None  # (in, out), the last running total
    instructions_seen: bool = False
    skills_text: str = ""  # the skills list Codex put in its prompt


def _message_text(payload: dict[str, Any]) -> str:
    content = payload.get("content")
    parts = content if isinstance(content, list) else []
    return "\n".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))


def parse_session(text: str) -> Session:
    """Read a Codex session file (JSON lines of ``{type, payload}``); pure, tolerant of junk."""
    session = Session()
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or not isinstance(record.get("payload"), dict):
            continue
        kind, payload = record.get("type"), record["payload"]
        if kind == "session_meta" and session.cli_version is None:
            session.cli_version = payload.get("cli_version")
            session.provider = payload.get("model_provider")
        elif kind == "turn_context" and session.model is None:
            session.model = payload.get("model")
        elif kind == "token_usage_record":
            response = str(payload.get("response_id"))
            if response not in session.responses:
                session.responses.append(response)
            usage = payload.get("usage")
            if isinstance(usage, dict):
                session.usage[response] = (
                    as_int(usage.get("input_tokens")),
                    as_int(usage.get("output_tokens")),
                    as_int(usage.get("cached_input_tokens")),
                )
        elif kind == "response_item" and payload.get("type") in CALL_ITEMS:
            session.calls.append(payload)
        elif kind == "response_item" and payload.get("type") in OUTPUT_ITEMS:
            output = payload.get("output")
            session.outputs[str(payload.get("call_id"))] = (
                output if isinstance(output, str) else json.dumps(output)
            )
        elif kind == "event_msg" and payload.get("type") == "item_completed":
            item = payload.get("item")
            if isinstance(item, dict):
                session.items.add(str(item.get("id")))
        elif kind == "event_msg" and payload.get("type") == "token_count":
            info = payload.get("info")
            total = info.get("total_token_usage") if isinstance(info, dict) else None
            if isinstance(total, dict):
                session.total_tokens = (
                    as_int(total.get("input_tokens")),
                    as_int(total.get("output_tokens")),
                )
        elif kind == "response_item" and payload.get("type") == "message":
            body = _message_text(payload)
            if body.startswith("# AGENTS.md instructions"):
                session.instructions_seen = True
            elif body.startswith("<skills_instructions>"):
                session.skills_text = body
    return session


def calls_not_shown(session: Session) -> list[dict[str, Any]]:
    """``tool_call``/``tool_result`` events of the calls the model made that Codex carried out as
    no item, so its ``--json`` output leaves them out: a tool it was not offered (answered
    "unsupported call: NAME", marked ``refused``), or one Codex answers without an item."""
    events: list[dict[str, Any]] = []
    for call in session.calls:
        call_id = str(call.get("call_id"))
        if call_id in session.items:
            continue
        answer = session.outputs.get(call_id)
        refused = answer is not None and answer.startswith(REFUSED_PREFIX)
        events.append(
            {
                "type": "tool_call",
                "id": call_id,
                "tool": call.get("name"),
                "input": clip(call.get("arguments", call.get("input"))),
                "refused": refused,
            }
        )
        if answer is not None:
            events.append(
                {"type": "tool_result", "id": call_id, "is_error": refused, "content": clip(answer)}
            )
    return events


def session_file(codex_home: Path) -> Path | None:
    """The session file of this run (one per exec; the newest if there are several).

    The agent can write under its HOME, so the walk follows no symlinked directory.
    """
    found = [
        Path(root) / name
        for root, _, files in os.walk(codex_home / "sessions")
        for name in files
        if name.startswith("rollout-") and name.endswith(".jsonl")
    ]
    return max(found, key=lambda p: p.name) if found else None


# ---- launching -----------------------------------------------------------------------


def check_approvals(ctx: AgentContext) -> None:
    approvals = ctx.harness.config.get("approvals") or "full-auto"
    if approvals != "full-auto":
        raise HarnessError(
            f"harness lock {ctx.harness.ref}: approvals {approvals!r} is not supported by the "
            "codex adapter: Codex runs headless inside hangar's sandbox with its own sandbox "
            "and approvals off; set approvals: full-auto"
        )


CATALOG_NAME = "models.json"  # CODEX_HOME/models.json, when the lock names a model_family
SETTINGS = ("model_family",)  # what the lock's ``codex:`` section may set


def model_family(ctx: AgentContext) -> str | None:
    """The lock's ``codex.model_family``: the bundled catalog entry a model Codex does not
    know is given (its tools, shell, instructions); None when the lock sets none."""
    raw = ctx.harness.config.get(ADAPTER) or {}
    if not isinstance(raw, dict) or set(raw) - set(SETTINGS):
        raise HarnessError(
            f"harness lock {ctx.harness.ref}: the codex section may set only "
            f"{', '.join(SETTINGS)}, not {sorted(set(raw) - set(SETTINGS)) if isinstance(raw, dict) else raw!r}"
        )
    family = raw.get("model_family")
    if family is not None and not (isinstance(family, str) and family):
        raise HarnessError(
            f"harness lock {ctx.harness.ref}: codex.model_family must be a model slug of the "
            f"CLI's bundled catalog (`codex debug models --bundled`), not {family!r}"
        )
    return family


@functools.cache
def bundled_catalog(binary: Path, mtime_ns: int) -> list[dict[str, Any]]:
    """The model catalog shipped with this Codex binary (``codex debug models --bundled``)."""
    del mtime_ns  # the cache key: a reinstalled CLI is read again
    # In a throwaway CODEX_HOME: the host user's own Codex config and state stay out of it.
    with tempfile.TemporaryDirectory(prefix="hangar-codex-catalog-") as scratch:
        done = subprocess.run(
            [str(binary), "debug", "models", "--bundled"],
            capture_output=True,
            text=True,
            timeout=60,
            env={
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": scratch,
                "CODEX_HOME": scratch,
            },
        )
    try:
        models = json.loads(done.stdout)["models"]
    except (ValueError, KeyError, TypeError):
        raise CliUnavailable(
            f"{binary} debug models --bundled gave no model catalog (exit {done.returncode}): "
            f"{done.stderr.strip()[-300:]}"
        ) from None
    return [m for m in models if isinstance(m, dict) and isinstance(m.get("slug"), str)]


def knows(catalog: list[dict[str, Any]], model: str) -> bool:
    """Whether Codex finds ``model`` in its catalog itself: a slug, or a slug's dated id."""
    return any(model == m["slug"] or model.startswith(m["slug"] + "-") for m in catalog)


def catalog_for(ctx: AgentContext, binary: Path) -> list[dict[str, Any]] | None:
    """The catalog Codex is given (bundled + ``ctx.model`` as the lock's family), or None.

    Codex matches a model to its metadata by slug (a dated id such as ``gpt-5.5-2026-01-01``
    finds ``gpt-5.5``); an id it cannot match gets "fallback metadata", which offers no
    ``apply_patch``. None: Codex knows the model, or the lock names no family for it.
    """
    family = model_family(ctx)
    if family is None:
        return None
    catalog = bundled_catalog(binary, binary.resolve().stat().st_mtime_ns)
    if knows(catalog, ctx.model):
        return None
    entry = next((m for m in catalog if m["slug"] == family), None)
    if entry is None:
        raise HarnessError(
            f"harness lock {ctx.harness.ref}: codex.model_family {family!r} is not in the "
            f"bundled catalog of {binary} (see `codex debug models --bundled`)"
        )
    return [*catalog, {**entry, "slug": ctx.model, "display_name": ctx.model}]


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def config_toml(
    model: str,
    base_url: str,
    catalog: str | None = None,
    retries: tuple[int | None, int | None] = (None, None),
) -> str:
    """CODEX_HOME/config.toml: the model and the one provider, through hangar's model proxy;
    ``catalog``: the in-sandbox path of a model catalog (``catalog_for``); ``retries``: the
    lock's provider_retries (max_retries, timeout_s) as the provider's own retry knobs."""
    max_retries, timeout_s = retries
    knobs = [
        *(
            [f"request_max_retries = {max_retries}", f"stream_max_retries = {max_retries}"]
            if max_retries is not None
            else []
        ),
        *([f"stream_idle_timeout_ms = {timeout_s * 1000}"] if timeout_s is not None else []),
    ]
    return "\n".join(
        [
            *([f"model_catalog_json = {_toml_string(catalog)}"] if catalog else []),
            f"model = {_toml_string(model)}",
            f"model_provider = {_toml_string(PROVIDER_ID)}",
            'approval_policy = "never"',
            "",
            f"[model_providers.{PROVIDER_ID}]",
            'name = "hangar model proxy"',
            f"base_url = {_toml_string(base_url.rstrip('/') + '/v1')}",
            'env_key = "OPENAI_API_KEY"',
            'wire_api = "responses"',
            *knobs,
            "",
        ]
    )


def argv_for(binary: Path) -> list[str]:
    return [
        str(binary),
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "--color",
        "never",
        "-",  # the prompt comes on stdin: not in argv, where ps shows it
    ]


def sandbox_env(ctx: AgentContext, access: ModelAccess) -> dict[str, str]:
    node = shutil.which("node")  # codex's npm entry point is a node script
    node_dir = [str(Path(node).resolve().parent)] if node else []
    return {
        "PATH": ":".join([*node_dir, sandbox_path()]),
        "TERM": "dumb",
        **ctx.env,
        # Set last: the context's extras cannot redirect the model API or HOME.
        **access.env,
        **NO_BYTECODE_ENV,
        "HOME": HOME_MOUNT,
        "CODEX_HOME": f"{HOME_MOUNT}/{CODEX_DIR}",
        "NO_COLOR": "1",
    }


def live_cost(model: str) -> Callable[[dict[str, Any]], float | None]:
    """The trial budget's cost function over session-file lines: the running token total, priced."""

    def cost_of(record: dict[str, Any]) -> float | None:
        payload = record.get("payload")
        if record.get("type") != "event_msg" or not isinstance(payload, dict):
            return None
        info = payload.get("info") if payload.get("type") == "token_count" else None
        total = info.get("total_token_usage") if isinstance(info, dict) else None
        if not isinstance(total, dict):
            return None
        return prices.amount(
            estimate_cost(
                model,
                as_int(total.get("input_tokens")),
                as_int(total.get("output_tokens")),
                as_int(total.get("cached_input_tokens")),
            )
        )

    return cost_of


@contextmanager
def follow_session(watcher: LiveUsage, codex_home: Path) -> Iterator[None]:
    """Follow the session file for the budget once Codex has created it (its name has a timestamp)."""

    def wait_then_follow(done: threading.Event) -> None:
        while not done.wait(POLL_S):
            path = session_file(codex_home)
            if path is not None:
                with watcher.follow(path):
                    done.wait()
                return

    with while_running(wait_then_follow, "hangar-codex-session"):
        yield


# ---- the run -------------------------------------------------------------------------


def fingerprint(
    ctx: AgentContext,
    session: Session,
    tools: list[str] | None,
    digests: dict[str, str | None],
) -> dict[str, Any]:
    """Turn 1 as Codex recorded it, falling back to what was launched where it said nothing."""
    skills = ctx.harness.skills_dir
    skill_names = sorted(p.name for p in skills.iterdir() if p.is_dir()) if skills.is_dir() else []
    return {
        "adapter": ADAPTER,
        "harness": ctx.harness.ref,
        "cli": CLI,
        "cli_version": session.cli_version or ctx.harness.config["agent"].get("version"),
        "model": session.model or ctx.model,
        "tools": tools,
        **digests,
        "model_provider": session.provider,
        "instructions_seen": session.instructions_seen,
        "skills_seen": [n for n in skill_names if f"- {n}:" in session.skills_text],
        "reported_by_cli": reported_by_cli(
            cli_version=session.cli_version, model=session.model, tools=tools
        ),
    }


def to_run(
    ctx: AgentContext,
    result: SandboxResult,
    output: ExecOutput,
    session: Session,
    tools: list[str] | None,
    digests: dict[str, str | None],
    budget_stopped: bool,
) -> AgentRun:
    events = [*output.events, *calls_not_shown(session)]
    model = session.model or ctx.model
    for n, response in enumerate(session.responses, start=1):
        used = session.usage.get(response, (0, 0, 0))
        events.append(turn_event(n, model, *used, response_id=response))
    turns, tokens = turn_totals(events)
    if not turns:  # no session file: what the exec's own output says
        turns = output.turns_completed
        tokens = (output.tokens_in, output.tokens_out, output.cached_in)
    cost = estimate_cost(model, *tokens[:2], tokens[2])
    events.append(
        {
            "type": "note",
            "text": f"Codex reports no cost and {model!r} is not in the codex adapter's price "
            f"table: cost unknown, estimated at {cost.estimate_usd:g} USD ({cost.basis})"
            if isinstance(cost, prices.UnknownCost)
            else f"Codex reports no cost: {cost:g} USD estimated from tokens with the "
            "codex adapter's price table",
        }
    )
    reported = f"reported an error: {clip(output.errors[-1])}" if output.errors else None
    return agent_run(
        result,
        events=events,
        turns=turns,
        tokens=tokens,
        cost_usd=cost,
        fingerprint=fingerprint(ctx, session, tools, digests),
        error=ending_error("Codex", ctx, result, budget_stopped=budget_stopped, reported=reported),
        budget_stopped=budget_stopped,
    )


class CodexAgent(Agent):
    name = ADAPTER

    def find_install(self, settings: Settings) -> Path:
        return find_cli(CLI, INSTALL_HINT, settings.agent_bin_dir)

    def run(self, ctx: AgentContext) -> AgentRun:
        check_approvals(ctx)
        binary = self.find_install(ctx.settings)
        home = scratch_dir(ctx.out_dir / "home")
        codex_home = home / CODEX_DIR
        # Where Codex reads a user's global instructions and skills: CODEX_HOME/AGENTS.md, skills/
        # (plugins/ beside them is placed, not loaded: see the module docstring).
        digests = place_lock_files(ctx, codex_home, "AGENTS.md")
        watcher = LiveUsage(ctx, cost_of=live_cost(ctx.model), running_total=True)
        catalog = catalog_for(ctx, binary)
        catalog_path = None
        if catalog is not None:
            (codex_home / CATALOG_NAME).write_text(json.dumps({"models": catalog}))
            catalog_path = f"{HOME_MOUNT}/{CODEX_DIR}/{CATALOG_NAME}"
        with model_access("openai", ctx) as access:
            config = config_toml(ctx.model, access.base_url, catalog_path, provider_retries(ctx))
            (codex_home / "config.toml").write_text(config)
            # Codex's stdout has usage only at the end of the exec; the budget
            # follows the session file, which has token counts after each response.
            request = cli_request(
                ctx,
                access,
                argv_for(binary),
                sandbox_env(ctx, access),
                install_mounts(binary),
                [Mount(home, HOME_MOUNT, writable=True)],
                stdin=prompt(ctx).encode(),
            )
            with follow_session(watcher, codex_home):
                result = ctx.sandbox.run(request)
        path = session_file(codex_home)
        session = parse_session((read_sandbox_file(path, SESSIONS_LIMIT) or "") if path else "")
        egress = read_sandbox_file(ctx.out_dir / EGRESS_NAME, EGRESS_LIMIT) or ""
        return to_run(
            ctx,
            result,
            parse_exec_json(result.stdout),
            session,
            first_request_tools(egress, "/responses"),
            digests,
            watcher.stopped,
        )
