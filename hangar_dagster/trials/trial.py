"""One trial attempt: clone at the pinned base, run the agent in a sandbox, verify, take the patch.

``run_trial`` never raises for a trial-level failure: every way a trial can
end is an outcome in the returned ``TrialRecord`` (infrastructure failures as
``infra_error`` with an ``infra_reason``), and its artifacts are written under
``HangarPaths.trial_artifacts`` with the canary masked: ``started.json``
(first, see ``restarts``), ``manifest.json``
(what it ran with), ``trace.json`` (what it did), ``patch.diff``,
``agent.log``, ``verify.log``, ``build.log``, the agent's ``RESULT.md``
when it left one and the model proxy's ``egress.jsonl`` when there was one.
The scratch work dir is deleted at the end.

Everything written, and the record, passes ``redact.redact`` (canary, API
keys, tokens). Since the artifacts are masked, the raw canary can no longer be
found in them; the trace's ``canary_seen_in`` lists where it was seen before
masking. The one exception is ``patch.raw.diff``: the agent's patch as it
made it, owner-only, which the grades asset grades (a redacted copy can be other
code) and nothing exports or shows. The returned patch text is that raw patch
too (for a caller grading in process).

After the agent ran, its turn-1 fingerprint and the environment it ran in are
compared with the pin set's (``drift.py``); a mismatch ends the attempt as
``infra_error / drift`` with the record's ``drift`` naming the half and fields.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.metadata
import json
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hangar_dagster.environment.build import BuildFailed, ensure_build, plan_build
from hangar_dagster.environment.egress import EgressError, EgressGrant, open_egress
from hangar_dagster.environment.mirror import MirrorError
from hangar_dagster.environment.runner import ensure_runner
from hangar_dagster.experiment.drift import (
    Drift,
    check_drift,
    environment_observed,
    environment_pins,
    harness_fingerprint,
    turn1_harness_digest,
)
from hangar_dagster.experiment.harness import HarnessError, HarnessLock, thaw
from hangar_dagster.experiment.model_policy import floating_reason
from hangar_dagster.experiment.plan import (
    ResolvedExperiment,
    ResolvedTask,
    ResolvedVariant,
    TrialKey,
)
from hangar_dagster.grading.grader import PRISTINE, grading_root
from hangar_dagster.grading.signals import canary_hits
from hangar_dagster.queue.drain import TrialCancel
from hangar_dagster.results.records import OutcomeClass, TrialRecord, utcnow
from hangar_dagster.results.store import Store
from hangar_dagster.settings import HangarPaths, Settings
from hangar_dagster.standins.agent import sandbox_path
from hangar_dagster.trials.agents import (
    NO_BYTECODE_ENV,
    Agent,
    AgentContext,
    AgentRun,
    UnknownAgent,
    get_agent,
)
from hangar_dagster.trials.agents.install import CliUnavailable
from hangar_dagster.trials.model_proxy import EGRESS_NAME, first_response_model, provider_failure
from hangar_dagster.trials.redact import redact, secret_values
from hangar_dagster.trials.sandbox import (
    Sandbox,
    SandboxRequest,
    SandboxResult,
    SandboxUnavailable,
    get_sandbox,
)
from hangar_dagster.trials.sandbox._common import read_sandbox_file
from hangar_dagster.util.fs import remove_tree, write_atomic
from hangar_dagster.util.gitrepo import GitError, cached_clone, changed_files, git, take_patch

RAW_PATCH = "patch.raw.diff"  # the unredacted patch the grader grades (see run_trial)
# Written before the agent starts; a marker with no stored record is an attempt a restart cut off.
STARTED_MARKER = "started.json"
RESULT_LIMIT = 1_000_000  # bytes of the agent's RESULT.md kept
EGRESS_LIMIT = 5_000_000  # bytes of the model proxy's egress.jsonl kept
LOG_LIMIT = 1_000_000  # bytes of build and verify output kept, each stream


@dataclass(frozen=True)
class TrialRequest:
    experiment: ResolvedExperiment
    key: TrialKey
    attempt: int
    retry_of: str | None
    run_id: str
    # This trial's own cancel event, set by the end-of-window drain (see drain.py): it stops the
    # build and the agent (the agent's context gets it); the attempt ends infra_error / power_down.
    cancel: threading.Event | None = field(default=None, compare=False)


def _drained(req: TrialRequest, run: AgentRun | None = None) -> None:
    """End the attempt as power_down (or interrupted) if the drain reached it while drainable.

    Before the agent ran, any drain counts. After it, only one that stopped the agent: an
    agent that ended by itself (an exit code, its time limit, its budget) keeps its outcome,
    and from there on the trial is no longer drainable (verify runs without the cancel event).
    """
    if req.cancel is None or not req.cancel.is_set():
        return
    if run is not None and (run.exit_code is not None or run.timed_out or run.budget_stopped):
        return
    # The drain (power_down) or an interrupt of this process (interrupted) says which.
    cut = req.cancel if isinstance(req.cancel, TrialCancel) else TrialCancel()
    raise InfraError(cut.reason, cut.message)


class InfraError(Exception):
    """Infrastructure ended the trial; ``reason`` becomes the record's ``infra_reason``."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class _Trial:
    """What a trial gathered so far; whatever stage it stopped at, it becomes a record."""

    sandbox_info: dict[str, str] = field(default_factory=dict)
    agent: Agent | None = None
    run: AgentRun | None = None
    verify: dict[str, Any] | None = None
    build_log: str = ""
    verify_log: str = ""
    result_md: str | None = None
    patch: str = ""
    infra_reason: str | None = None
    error: str | None = None
    build_ran: list[str] = field(default_factory=list)
    egress: str | None = None  # the model proxy's egress.jsonl
    secrets: list[str] = field(default_factory=list)  # secret values the agent was given
    harness_pins: dict[str, Any] | None = None  # the turn-1 fingerprint the pin set expects
    drift: Drift | None = None
    build_digest: str | None = None
    build_s: float | None = None  # what getting the build cost this attempt


def _sandbox_env(task: ResolvedTask) -> dict[str, str]:
    # Verify runs after the patch was taken, so what it writes never reaches the patch: no
    # PYTHONPYCACHEPREFIX (with one, Python ignores every compiled module and compiles the
    # stdlib and pytest afresh, about 1.7 CPU s per start; docs/performance.md).
    return {
        "PATH": sandbox_path(),
        "HOME": "/tmp",
        "HANGAR_TASK": task.id,
        "PYTHONDONTWRITEBYTECODE": NO_BYTECODE_ENV["PYTHONDONTWRITEBYTECODE"],
    }


def _shell(
    sandbox: Sandbox,
    command: str,
    repo: Path,
    variant: ResolvedVariant,
    task: ResolvedTask,
    cancel: threading.Event | None = None,
) -> SandboxResult:
    res = variant.environment.resources
    return sandbox.run(
        SandboxRequest(
            argv=["/bin/sh", "-c", command],
            workdir=repo,
            env=_sandbox_env(task),
            timeout_s=res.timeout_s,
            memory_mb=res.memory_mb,
            output_limit=LOG_LIMIT,
            cancel=cancel,
        )
    )


def _log(label: str, command: str, result: SandboxResult) -> str:
    status = "timed out" if result.timed_out else f"exit {result.exit_code}"
    head = f"$ {command}\n# {label}: {status} in {result.duration_s:.1f}s\n"
    return f"{head}{result.stdout}{result.stderr}\n"


def _snapshot(repo: Path, git_dir: Path) -> str:
    """The tree of ``repo`` as it is now (build outputs included), via the trusted ``git_dir``."""
    where = ["--git-dir", str(git_dir), "--work-tree", str(repo)]
    git(*where, "add", "-A", cwd=repo)
    tree = git(*where, "write-tree", cwd=repo).strip()
    git(*where, "reset", "-q", cwd=repo)
    return tree


def _prepare(
    req: TrialRequest, work: Path, state: _Trial, settings: Settings
) -> tuple[Sandbox, HarnessLock, Path, str]:
    exp, variant = req.experiment, req.experiment.variants[req.key.variant]
    task = exp.tasks[req.key.task]
    environment = variant.environment
    try:
        sandbox = get_sandbox(
            environment.sandbox,
            image=environment.image,
            labels={"hangar.experiment": exp.experiment_id, "hangar.trial": req.key.key},
            runtime=settings.sandbox_runtime,
        )
        state.sandbox_info = sandbox.describe()
    except SandboxUnavailable as err:
        raise InfraError("sandbox_create", str(err)) from err
    try:
        # The agent gets a read-only copy in the work dir, verified again after copying.
        harness = thaw(Path(variant.harness_path).parent, variant.harness_lock, work / "harness")
        state.agent = get_agent(variant.adapter)
    except (HarnessError, UnknownAgent) as err:
        raise InfraError("harness", str(err)) from err
    if harness.digest != variant.harness_digest or harness.adapter != variant.adapter:
        state.drift = check_drift(
            {"harness_digest": variant.harness_digest, "adapter": variant.adapter},
            {"harness_digest": harness.digest, "adapter": harness.adapter},
            {},
            {},
        )
        raise InfraError(
            "drift",
            f"harness lock {harness.ref} (adapter {harness.adapter}) is not what variant "
            f"{variant.name} pinned (sha256:{variant.harness_digest}, adapter {variant.adapter})",
        )
    repo = work / "repo"
    git_dir = work / "git"
    try:
        # A copy of the task's pristine clone, the one the grades copy (never mounted): one
        # `cp -a` instead of seven git runs per trial.
        cached_clone(task.repo, task.base_sha, repo, grading_root(settings.paths) / PRISTINE)
        # The agent can rewrite repo/.git; patches are taken with this copy (see take_patch).
        shutil.copytree(repo / ".git", git_dir, symlinks=True)
    except GitError as err:
        raise InfraError("clone", str(err)) from err
    base = task.base_sha
    plan = plan_build(environment, task.repo, task.base_sha, task.build)
    if plan is not None:
        # Built once per (environment, task base), normally by the base check; here only when
        # the cache is missing (under the build's lock: concurrent trials build once).
        state.build_digest = plan.digest
        try:
            built = ensure_build(plan, settings, req.cancel)
        except BuildFailed as err:
            state.build_log = err.tail
            _drained(req)  # a build the drain stopped did not fail
            raise InfraError("build", str(err)) from err
        state.build_s = round(built.waited_s, 3)
        state.build_ran = list(plan.environment_steps)
        state.build_log = read_sandbox_file(built.log, LOG_LIMIT) or ""
        built.copy_outputs(repo)
        # Build outputs are the environment's, not the agent's: diff against the built tree.
        base = _snapshot(repo, git_dir)
        sandbox = built.sandbox(sandbox, repo)
    else:
        # No build: the runner environment, so the agent's and verify's `python` never is
        # hangar's own (whose packages would stand in for the repo's).
        sandbox = ensure_runner(settings).sandbox(sandbox, repo)
    return sandbox, harness, git_dir, base


def _execute(req: TrialRequest, work: Path, state: _Trial, settings: Settings) -> None:
    variant = req.experiment.variants[req.key.variant]
    _drained(req)
    sandbox, harness, git_dir, base = _prepare(req, work, state, settings)
    _drained(req)
    egress_log = work / "agent" / EGRESS_NAME
    try:
        # The agent's way out under the environment's policy; its proxy runs while the agent does.
        with open_egress(variant.environment.egress.mode, egress_log, settings) as grant:
            _run_agent(req, work, state, settings, sandbox, harness, grant)
    except (MirrorError, EgressError) as err:
        raise InfraError("egress_unsupported", str(err)) from err
    _finish(req, work, state, sandbox, harness, git_dir, base, grant)


def _live_tokens(req: TrialRequest, settings: Settings) -> Callable[[int], None] | None:
    """Counts each model answer's tokens toward the TPM throttle while the trial runs (every
    run worker's throttle reads the same tally); None when no TPM budget is set."""
    if settings.tpm_budget is None:
        return None
    store = Store(settings.paths)
    eid, key, attempt = req.experiment.experiment_id, req.key.key, req.attempt
    return lambda n: store.add_live_tokens(eid, key, attempt, n, dt.datetime.now(dt.UTC))


def _run_agent(
    req: TrialRequest,
    work: Path,
    state: _Trial,
    settings: Settings,
    sandbox: Sandbox,
    harness: HarnessLock,
    grant: EgressGrant,
) -> None:
    exp, variant = req.experiment, req.experiment.variants[req.key.variant]
    task = exp.tasks[req.key.task]
    assert state.agent is not None
    res = variant.environment.resources
    ctx = AgentContext(
        trial_key=req.key.key,
        task_id=task.id,
        seed=f"{exp.name}:{req.key.key}:{req.attempt}",
        workdir=work / "repo",
        harness=harness,
        model=variant.model,
        instructions=task.instructions,
        verify=task.verify,
        timeout_s=res.timeout_s,
        memory_mb=res.memory_mb,
        sandbox=sandbox,
        egress=grant,
        out_dir=work / "agent",
        settings=settings,
        max_cost_usd=exp.spec.trial_job_budget.max_cost_usd if exp.spec.trial_job_budget else None,
        cancel=req.cancel if req.cancel is not None else threading.Event(),
        on_tokens=_live_tokens(req, settings),
    )
    state.secrets = secret_values(ctx.env)
    try:
        state.run = state.agent.run(ctx)
    except SandboxUnavailable as err:
        raise InfraError("sandbox_create", str(err)) from err
    except CliUnavailable as err:
        raise InfraError("agent_cli", str(err)) from err  # configuration: never retried
    except HarnessError as err:
        raise InfraError("harness", str(err)) from err


def _finish(
    req: TrialRequest,
    work: Path,
    state: _Trial,
    sandbox: Sandbox,
    harness: HarnessLock,
    git_dir: Path,
    base: str,
    grant: EgressGrant,
) -> None:
    exp, variant = req.experiment, req.experiment.variants[req.key.variant]
    task = exp.tasks[req.key.task]
    assert state.run is not None
    res = variant.environment.resources
    # Read before the drain check: a drained attempt's requests are searched for the canary too.
    state.egress = read_sandbox_file(work / "agent" / EGRESS_NAME, EGRESS_LIMIT)
    _drained(req, state.run)  # an agent the drain stopped says nothing about the agent
    for found in sorted((work / "agent").rglob("RESULT.md")):
        state.result_md = read_sandbox_file(found, RESULT_LIMIT)
        break
    try:
        # Before verify, so what verify leaves behind (caches, bytecode) is not in the patch.
        state.patch = take_patch(work / "repo", base, git_dir=git_dir)
    except GitError as err:
        raise InfraError("patch", str(err)) from err
    run = state.run
    if (run.exit_code != 0 or run.error) and not run.budget_stopped and state.egress:
        if outage := provider_failure(state.egress):
            raise InfraError(*outage)  # the provider failed, not the agent: retried, breaker
    # After the patch (kept for audit), before verify: a drifted run measures nothing.
    state.harness_pins = harness_fingerprint(harness, variant.model)
    # Turn 1's model is what the provider's first answer named (the proxy saw it), never what
    # a CLI echoes from its own config (Codex's session file) or error text.
    if answered := first_response_model(state.egress or "", variant.model):
        state.run.fingerprint = {**state.run.fingerprint, "model": answered}
    state.drift = check_drift(
        state.harness_pins,
        state.run.fingerprint,
        environment_pins(variant.environment),
        environment_observed(
            state.sandbox_info,
            egress=grant.policy,
            timeout_s=res.timeout_s,
            memory_mb=res.memory_mb,
            build=state.build_ran,
        ),
    )
    if state.drift:
        raise InfraError(
            "drift",
            f"turn 1 did not run what pin set {variant.pin_set} pinned: {state.drift.summary()}",
        )
    if task.verify:
        result = _shell(sandbox, task.verify, work / "repo", variant, task)
        state.verify_log = _log("verify", task.verify, result)
        state.verify = {
            "command": task.verify,
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "passed": result.exit_code == 0,
            "duration_s": round(result.duration_s, 3),
        }


def _outcome(exp: ResolvedExperiment, state: _Trial) -> OutcomeClass:
    run = state.run
    if state.infra_reason is not None or run is None:
        return "infra_error"
    if run.timed_out:
        return "timeout"
    budget = exp.spec.trial_job_budget
    if run.budget_stopped or (budget is not None and run.cost_usd > budget.max_cost_usd):
        return "budget_exceeded"
    if run.exit_code != 0:
        return "agent_error"
    return "completed" if state.patch.strip() else "empty_patch"


def mark_started(req: TrialRequest, paths: HangarPaths, started_at: dt.datetime) -> None:
    """Leave ``STARTED_MARKER`` in the attempt's artifacts dir (read by ``restarts``)."""
    marker = {
        "experiment_id": req.experiment.experiment_id,
        "trial_key": req.key.key,
        "attempt": req.attempt,
        "retry_of": req.retry_of,
        "run_id": req.run_id,
        "started_at": started_at.isoformat(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    art = paths.trial_artifacts(req.experiment.experiment_id, req.key.key, req.attempt)
    write_atomic(art / STARTED_MARKER, json.dumps(marker, indent=2, sort_keys=True))


def known_cost(run: AgentRun | None) -> float | None:
    """The attempt's cost as stored: None when no list price gives it (``cost_unknown``)."""
    if run is None:
        return 0.0  # no agent ran: nothing was spent
    return None if run.cost_unknown else run.cost_usd


def pinned_fields(
    exp: ResolvedExperiment,
    key: TrialKey,
    attempt: int,
    retry_of: str | None,
    run_id: str,
    aliases: frozenset[str],
) -> dict[str, Any]:
    """The TrialRecord fields that say which attempt this is and what it was pinned to run."""
    variant = exp.variants[key.variant]
    return {
        "experiment_id": exp.experiment_id,
        "trial_key": key.key,
        "variant": key.variant,
        "task": key.task,
        "replicate": key.replicate,
        "attempt": attempt,
        "retry_of": retry_of,
        "run_id": run_id,
        "pin_set": variant.pin_set,
        "harness_digest": variant.harness_digest,
        "environment_digest": variant.environment_digest,
        "model": variant.model,
        "model_concrete": floating_reason(variant.model, aliases) is None,
        "model_concrete_basis": variant.model_concrete_basis,
        "agent": variant.adapter,
        "base_sha": exp.tasks[key.task].base_sha,
        "source": "shadow" if exp.shadow else "experiment",
        "shadow_of": exp.shadow.merges.get(key.task) if exp.shadow else None,
    }


def run_trial(req: TrialRequest, settings: Settings) -> tuple[TrialRecord, str]:
    """Run one attempt of one trial under ``settings``; returns its record and its (raw) patch text."""
    paths = settings.paths
    exp = req.experiment
    variant = exp.variants[req.key.variant]
    task = exp.tasks[req.key.task]
    started_at = utcnow()
    started = time.monotonic()
    state = _Trial()
    mark_started(req, paths, started_at)
    paths.work.mkdir(parents=True, exist_ok=True)
    prefix = f"{exp.experiment_id}-{req.key.key.replace('/', '__')}-a{req.attempt}-"
    work = Path(tempfile.mkdtemp(dir=paths.work, prefix=prefix))
    try:
        _execute(req, work, state, settings)
    except InfraError as err:
        state.infra_reason, state.error = err.reason, str(err)
    except Exception as err:  # a trial must end as a record, whatever broke
        state.infra_reason, state.error = "internal", f"{type(err).__name__}: {err}"
    finally:
        remove_tree(work)
    if state.error is None and state.run is not None:
        state.error = state.run.error
    outcome = _outcome(exp, state)
    art = paths.trial_artifacts(exp.experiment_id, req.key.key, req.attempt)
    is_standin = state.agent.is_standin if state.agent else variant.adapter == "standin"
    run = state.run
    agent_log = run.output_tail if run else ""
    canary = exp.canary
    texts = {
        "patch": state.patch,
        "agent.log": agent_log,
        "trace": json.dumps(run.events if run else []),
        "verify.log": state.verify_log,
        **({"RESULT.md": state.result_md} if state.result_md is not None else {}),
        **({"egress": state.egress} if state.egress is not None else {}),
    }

    def clean(value: Any) -> Any:
        return redact(value, canary, state.secrets)

    manifest: dict[str, Any] = {
        "experiment_id": exp.experiment_id,
        "trial_key": req.key.key,
        "attempt": req.attempt,
        "retry_of": req.retry_of,
        "run_id": req.run_id,
        "pin_set": variant.pin_set,
        "harness_lock": variant.harness_lock,
        "harness_digest": variant.harness_digest,
        # The directory the agent's harness was verified and thawed from; freeze-variants reads it.
        "harness_path": variant.harness_path,
        "overlay": variant.overlay,
        "environment": variant.environment.model_dump(mode="json"),
        "environment_digest": variant.environment_digest,
        "harness_fingerprint": state.harness_pins,
        "model": variant.model,
        "model_requested": variant.model_requested or variant.model,
        "model_concrete": floating_reason(variant.model, settings.model_aliases) is None,
        "model_concrete_basis": variant.model_concrete_basis,
        "agent": variant.adapter,
        "agent_is_standin": is_standin,
        "task": {"id": task.id, "repo": task.repo, "base_sha": task.base_sha},
        "sandbox": state.sandbox_info or {"backend": variant.environment.sandbox},
        "hangar_version": importlib.metadata.version("hangar-dagster"),
        "started_at": started_at.isoformat(),
    }
    trace: dict[str, Any] = {
        "agent_is_standin": is_standin,
        "outcome_class": outcome,
        "infra_reason": state.infra_reason,
        "error": state.error,
        "agent_exit_code": run.exit_code if run else None,
        "agent_timed_out": run.timed_out if run else False,
        "events": run.events if run else [],
        "turns": run.turns if run else 0,
        "tokens_in": run.tokens_in if run else 0,
        "tokens_out": run.tokens_out if run else 0,
        "cached_tokens_in": run.cached_tokens_in if run else 0,
        # Unknown is not free: null, with the estimate budgets count and what it rests on.
        "cost_usd": known_cost(run),
        "cost_estimate_usd": run.cost_usd if run and run.cost_unknown else None,
        "cost_basis": run.cost_unknown if run else None,
        "budget_stopped": run.budget_stopped if run else False,
        "fingerprint": run.fingerprint if run else {},
        "turn1_harness_digest": turn1_harness_digest(run.fingerprint)
        if run and run.fingerprint
        else None,
        "drift": state.drift.as_json() if state.drift is not None else None,
        "verify": state.verify,
        "canary_seen_in": canary_hits(texts, canary),
    }
    manifest, trace = clean(manifest), clean(trace)
    patch_out = clean(state.patch)
    art.mkdir(parents=True, exist_ok=True)
    write_atomic(art / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True))
    write_atomic(art / "trace.json", json.dumps(trace, indent=2, sort_keys=True))
    write_atomic(art / "patch.diff", patch_out)
    # The grader needs the agent's own bytes: a redacted copy is other code (a `X_KEY = ...`
    # line rewritten). Kept beside the artifacts for the grades asset, owner-only, never exported.
    write_atomic(art / RAW_PATCH, state.patch)
    (art / RAW_PATCH).chmod(0o600)
    write_atomic(art / "agent.log", clean(agent_log))
    write_atomic(art / "verify.log", clean(state.verify_log or "(no verify command ran)\n"))
    if state.build_log:
        write_atomic(art / "build.log", clean(state.build_log))
    if state.result_md is not None:
        write_atomic(art / "RESULT.md", clean(state.result_md))
    if state.egress is not None:
        write_atomic(art / "egress.jsonl", clean(state.egress))
    finished_at = utcnow()
    record = TrialRecord(
        **pinned_fields(
            exp, req.key, req.attempt, req.retry_of, req.run_id, settings.model_aliases
        ),
        agent_is_standin=is_standin,
        started_at=started_at,
        finished_at=finished_at,
        duration_s=time.monotonic() - started,
        outcome_class=outcome,
        infra_reason=state.infra_reason,
        drift=clean(state.drift.summary()) if state.drift else None,
        agent_exit_code=run.exit_code if run else None,
        verify_passed=state.verify["passed"] if state.verify else None,
        verify_exit_code=state.verify["exit_code"] if state.verify else None,
        patch_sha256=hashlib.sha256(patch_out.encode()).hexdigest(),
        patch_bytes=len(patch_out.encode()),
        changed_files=changed_files(patch_out),
        turns=run.turns if run else 0,
        tokens_in=run.tokens_in if run else 0,
        tokens_out=run.tokens_out if run else 0,
        cost_usd=known_cost(run),
        cost_estimate_usd=run.cost_usd if run and run.cost_unknown else None,
        cost_basis=run.cost_unknown if run else None,
        error=clean(state.error),
        manifest=manifest,
        trace=trace,
        artifacts_dir=str(art),
        build_digest=state.build_digest,
        build_s=state.build_s,
    )
    return record, state.patch
