"""Agent adapters: how a harness's agent CLI is started in a sandbox and read back.

One small interface, ``Agent``, and a registry of named adapters chosen by the
harness lock's ``agent.adapter``. An adapter turns the CLI's own output into
the trial's trace and its turn-1 fingerprint.
"""

from __future__ import annotations

import importlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hangar_dagster.environment.bytecode import PYCACHE_PREFIX
from hangar_dagster.environment.egress import EgressGrant
from hangar_dagster.experiment.harness import HarnessLock
from hangar_dagster.settings import Settings
from hangar_dagster.trials.sandbox import Sandbox

# Every adapter's agent, and the trial's build and verify steps, run Python with these: no
# bytecode is written, and what a tool compiles anyway goes to the sandbox's private /tmp, never
# the work tree. A .pyc in a patch then stays a real tamper signal.
# The prefix holds the build's precompiled bytecode, read-only (environment/bytecode.py).
NO_BYTECODE_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": PYCACHE_PREFIX}


@dataclass(frozen=True)
class AgentContext:
    trial_key: str
    task_id: str
    seed: str  # stable per trial key and attempt
    workdir: Path  # the trial's clone (read-write)
    harness: HarnessLock  # verified; harness.path is mounted read-only
    model: str
    instructions: str
    verify: str | None
    timeout_s: float
    memory_mb: int
    sandbox: Sandbox
    # The sandbox's way out under the environment's egress policy (environment/egress.py):
    # its mounts, env and argv prefix go into every request the adapter makes.
    egress: EgressGrant
    out_dir: Path  # host-side scratch for the adapter (not visible to the agent)
    settings: Settings  # the operator's: where agent CLIs are, the provider endpoints and keys
    env: dict[str, str] = field(default_factory=dict)  # extra variables (API endpoints)
    # Set by the end-of-window drain or the trial budget; adapters pass it as SandboxRequest.cancel.
    cancel: threading.Event = field(default_factory=threading.Event)
    # trial_job_budget.max_cost_usd: the adapter stops the agent once its streamed spend passes it.
    max_cost_usd: float | None = None
    # Told each model answer's tokens as the model proxy sees it: the TPM throttle's live usage.
    on_tokens: Callable[[int], None] | None = None


@dataclass
class AgentRun:
    exit_code: int | None
    timed_out: bool
    events: list[dict[str, Any]]
    turns: int
    tokens_in: int
    tokens_out: int
    # What the run cost, or, when ``cost_unknown`` is set, the estimate of it (budgets count it).
    cost_usd: float
    fingerprint: dict[str, Any]  # turn 1: cli version, model, tools, instructions/skills digests
    output_tail: str
    error: str | None = None
    budget_stopped: bool = False  # stopped for passing max_cost_usd (an outcome, not infra)
    cached_tokens_in: int = 0  # of tokens_in, those the provider served from its prompt cache
    cost_unknown: str | None = None  # why no list price gives the cost: stored null, estimated


class Agent(ABC):
    name: str
    is_standin: bool = False  # the scripted stand-in says so wherever it shows

    @abstractmethod
    def run(self, ctx: AgentContext) -> AgentRun: ...

    def find_install(self, settings: Settings) -> Path | None:
        """The adapter's CLI as it will be run; ``install.CliUnavailable`` when it cannot be
        found or used here. None: the adapter has no CLI of its own to install.

        Submit calls it for every variant, so a missing CLI is a configuration error at submit
        rather than a failure of every trial.
        """
        return None


_ADAPTERS = {
    "standin": "hangar_dagster.standins.agent:StandinAgent",
    "command": "hangar_dagster.trials.agents.command:CommandAgent",
    "claude-code": "hangar_dagster.trials.agents.claude_code:ClaudeCodeAgent",
    "codex": "hangar_dagster.trials.agents.codex:CodexAgent",
    "mini-swe-agent": "hangar_dagster.trials.agents.mini_swe:MiniSweAgent",
}


class UnknownAgent(ValueError):
    pass


def get_agent(name: str) -> Agent:
    try:
        target = _ADAPTERS[name]
    except KeyError:
        raise UnknownAgent(
            f"unknown agent adapter {name!r}; known: {', '.join(sorted(_ADAPTERS))}"
        ) from None
    module, cls = target.split(":")
    adapter: type[Agent] = getattr(importlib.import_module(module), cls)
    return adapter()
