"""One look at every registered shadow policy's mainline: the body of the shadow sensor.

For each policy with new merges since its cursor: decide each merge (shadow/merges.py),
write the kept ones' tasks as an ordinary experiment spec (one variant, the candidate; egress
none; reuse off) and submit it for the daemon, then store the decisions and move the cursor.
From there the experiment is driven like any other: its base checks are the base-must-fail
and reference-must-pass gates, its trials wait for the eval window and count against the
budgets, and its grades are made against what was merged.
"""

from __future__ import annotations

import datetime as dt
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from hangar_dagster.experiment.catalog import DAEMON_MARKER, active_experiments
from hangar_dagster.experiment.plan import ShadowOrigin
from hangar_dagster.experiment.spec import SpecError
from hangar_dagster.experiment.submit import submit
from hangar_dagster.queue.window import EvalWindow
from hangar_dagster.settings import Settings
from hangar_dagster.shadow.merges import ShadowTask, build_task, decide, new_merges, read_merge
from hangar_dagster.shadow.policy import (
    MergeDecision,
    ShadowPolicy,
    ShadowState,
    policy_dir,
    read_policy,
    read_state,
    registered,
    write_state,
)
from hangar_dagster.util.fs import write_atomic
from hangar_dagster.util.gitrepo import GitError, git, resolve_base

SUBMIT_REFUSED = "submit_refused"


@dataclass(frozen=True)
class TickResult:
    policy: str
    said: str  # one line for the sensor's log / skip reason
    experiment_id: str | None = None
    decisions: tuple[MergeDecision, ...] = ()


def night_of(window: EvalWindow, now: dt.datetime) -> str:
    """The eval night ``now`` counts towards: the local date the window (next) opens on."""
    opens = window.opens_at(now) or window.next_open(now)
    return opens.astimezone(window.tz).date().isoformat()


def local_repo(policy: ShadowPolicy, where: Path) -> Path:
    """A directory git can read the policy's repository in: the path itself, or a mirror
    clone of a URL under the policy's folder, fetched now."""
    if Path(policy.repo).is_dir():
        return Path(policy.repo)
    mirror = where / "mirror.git"
    if not mirror.is_dir():
        git("clone", "-q", "--mirror", policy.repo, str(mirror))
    else:
        git("fetch", "-q", "--prune", "origin", cwd=mirror)
    return mirror


def shadow_spec(policy: ShadowPolicy, tasks: list[ShadowTask]) -> dict[str, object]:
    """The experiment spec a tick submits: one task per kept merge, the candidate alone."""
    environment = policy.environment.model_dump(exclude_none=True)
    environment["egress"] = {"mode": "none"}
    return {
        "name": f"shadow-{policy.name}",
        "description": f"shadow of {policy.repo} {policy.mainline}: {len(tasks)} merge(s)",
        **({"author": policy.author} if policy.author else {}),
        "harness_repo": policy.harness_repo,
        "environment": environment,
        "tasks": [
            {
                "id": t.id,
                "instructions": t.instructions,
                "repo": policy.repo,
                "base": t.base,
                **({"verify": policy.verify} if policy.verify else {}),
                "hidden_tests": t.hidden_tests,
                "reference_patch": t.reference_patch,
            }
            for t in tasks
        ],
        "variants": {"candidate": {"harness_lock": policy.harness_lock}},
        "trials": 1,
        "parallel": policy.parallel,
        "grader": policy.grader.model_dump(),
        **(
            {"trial_job_budget": policy.trial_job_budget.model_dump()}
            if policy.trial_job_budget
            else {}
        ),
        # Each merge is shadowed once; a trial of another experiment is not this measurement.
        "reuse": {"enabled": False},
    }


def _submitted_before(settings: Settings, name: str, shas: set[str]) -> str | None:
    """The experiment a tick of ``name`` submitted for these merges already (a tick cut off
    before it stored that): going on with it, not submitting the merges twice."""
    for exp in active_experiments(settings.paths):
        if exp.shadow is not None and exp.shadow.policy == name:
            if shas & set(exp.shadow.merges.values()):
                return exp.experiment_id
    return None


def _look(
    settings: Settings,
    policy: ShadowPolicy,
    state: ShadowState,
    repo: Path,
    tip: str,
    now: dt.datetime,
) -> ShadowState:
    """Decide the merges since the cursor and move it (stored by the caller)."""
    night = night_of(settings.window, now)
    kept_tonight = sum(1 for d in state.merges if d.kept and d.night == night)
    merges = new_merges(repo, tip, state.cursor)
    decisions, _ = decide(repo, merges, policy, kept_tonight, night, now)
    return state.model_copy(update={"cursor": tip, "merges": [*state.merges, *decisions]})


def _submit(
    settings: Settings, policy: ShadowPolicy, repo: Path, waiting: list[MergeDecision], tip: str
) -> tuple[str | None, str | None]:
    """Submit the kept merges ``waiting`` as one experiment: (its id, None) or (None, why a
    budget or the world refused it)."""
    if (earlier := _submitted_before(settings, policy.name, {d.sha for d in waiting})) is not None:
        return earlier, None
    tasks: list[ShadowTask] = []
    for d in waiting:  # built again from the repository: a merge's content does not change
        task = build_task(repo, read_merge(repo, d.sha), policy)
        assert isinstance(task, ShadowTask), task
        tasks.append(task)
    spec_path = policy_dir(settings.paths, policy.name) / "specs" / f"{tip[:12]}.yaml"
    write_atomic(spec_path, yaml.safe_dump(shadow_spec(policy, tasks), sort_keys=False))
    origin = ShadowOrigin(
        policy=policy.name,
        repo=policy.repo,
        mainline=policy.mainline,
        tip=tip,
        merges={t.id: t.merge for t in tasks},
    )
    try:
        exp = submit(spec_path, settings, shadow=origin)
    except SpecError as err:
        return None, "; ".join(str(p) for p in err.problems)
    (settings.paths.experiment_dir(exp.experiment_id) / DAEMON_MARKER).touch()
    return exp.experiment_id, None


def tick_policy(settings: Settings, name: str, now: dt.datetime) -> TickResult:
    """Decide the merges since the cursor; inside the eval window, submit the kept ones not
    yet submitted as one experiment (outside it they wait, so a day's merges make one)."""
    paths = settings.paths
    policy = read_policy(paths, name)
    state = read_state(paths, name)
    try:
        repo = local_repo(policy, policy_dir(paths, name))
        tip = resolve_base(str(repo), policy.mainline)
    except (GitError, subprocess.CalledProcessError) as err:
        return TickResult(name, f"{name}: cannot read {policy.repo} {policy.mainline}: {err}")
    said = [f"{name}: no new merge on {policy.mainline} since {tip[:12]}"]
    seen = len(state.merges)
    if tip != state.cursor:
        state = _look(settings, policy, state, repo, tip, now)
        write_state(paths, name, state)  # decided: a later cut-off does not decide them again
        new = state.merges[seen:]
        said = [
            f"{name}: {len(new)} new merge(s) on {policy.mainline}, {sum(d.kept for d in new)} kept"
        ]
    waiting = [d for d in state.merges if d.kept and d.experiment_id is None]
    experiment_id = None
    if waiting and not settings.window.is_open(now):
        opens = settings.window.next_open(now)
        said.append(
            f"{len(waiting)} kept merge(s) wait for the eval window ({opens:%Y-%m-%d %H:%M} UTC)"
        )
    elif waiting:
        experiment_id, refused = _submit(settings, policy, repo, waiting, tip)
        ids = {d.sha for d in waiting}
        update: dict[str, object] = (
            {"experiment_id": experiment_id}
            if experiment_id
            else {"kept": False, "reason": SUBMIT_REFUSED, "detail": refused, "task": None}
        )
        state = state.model_copy(
            update={
                "merges": [d.model_copy(update=update) if d.sha in ids else d for d in state.merges]
            }
        )
        write_state(paths, name, state)
        said.append(
            f"submitted {len(waiting)} as experiment {experiment_id}"
            if experiment_id
            else f"{len(waiting)} dropped: submit refused: {refused}"
        )
    return TickResult(name, "; ".join(said), experiment_id, tuple(state.merges[seen:]))


def tick(settings: Settings, now: dt.datetime) -> list[TickResult]:
    """One look at every registered policy; a policy whose repository cannot be read says so
    and is tried again next tick (its cursor stays)."""
    return [tick_policy(settings, name, now) for name in registered(settings.paths)]
