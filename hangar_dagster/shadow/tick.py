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
import logging
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from hangar_dagster.experiment.catalog import DAEMON_MARKER, stored_ids
from hangar_dagster.experiment.plan import ShadowOrigin
from hangar_dagster.experiment.spec import SpecError
from hangar_dagster.experiment.submit import (
    finish_submit,
    load_resolved,
    new_experiment_id,
    submit,
)
from hangar_dagster.queue.window import EvalWindow
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings
from hangar_dagster.shadow.merges import (
    GIT_TIMEOUT_S,
    UNREADABLE_MERGE,
    Merge,
    ShadowTask,
    build_task,
    decide,
    merge_shas,
    read_merge,
)
from hangar_dagster.shadow.policy import (
    CursorReset,
    MergeDecision,
    ShadowPolicy,
    ShadowState,
    policy_dir,
    read_policy,
    read_state,
    registered,
    write_state,
)
from hangar_dagster.util.fs import try_lock, write_atomic
from hangar_dagster.util.gitrepo import GitError, git, resolve_base

SUBMIT_REFUSED = "submit_refused"
LAST_ERROR = "last_error.txt"  # the last failure of a policy's tick (gone once one succeeds)
log = logging.getLogger(__name__)
MIRROR_TIMEOUT_S = 600  # a mirror's clone or fetch; past it the tick says so and tries again next


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
    clone of a URL under the policy's folder, fetched now. The clone is made in a temporary
    folder and renamed: a clone killed mid-way leaves no half mirror to fetch into."""
    if Path(policy.repo).is_dir():
        return Path(policy.repo)
    mirror = where / "mirror.git"
    if mirror.is_dir():
        git("fetch", "-q", "--prune", "origin", cwd=mirror, timeout=MIRROR_TIMEOUT_S)
        return mirror
    for stale in where.glob(".mirror-*"):  # a killed clone's (the policy's lock is held)
        shutil.rmtree(stale, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(dir=where, prefix=".mirror-"))
    try:
        git("clone", "-q", "--mirror", policy.repo, str(scratch / "m"), timeout=MIRROR_TIMEOUT_S)
        os.replace(scratch / "m", mirror)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return mirror


def shadow_spec(policy: ShadowPolicy, tasks: list[ShadowTask]) -> dict[str, object]:
    """The experiment spec a tick submits: one task per kept merge, the candidate alone. Each
    task's hidden tests and reference patch are files beside the spec (``write_task_files``):
    inline, a few large merges would pass the spec file's 1 MiB though each is in its bounds."""
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
                "hidden_tests": f"{t.id}/tests",
                "reference_patch": f"{t.id}/reference.diff",
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


def write_task_files(where: Path, task: ShadowTask) -> None:
    """``task``'s hidden tests under ``where/<id>/tests/`` and its patch beside them."""
    for rel, text in task.hidden_tests.items():
        path = where / task.id / "tests" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode())  # as read: UTF-8, line ends untouched
    (where / task.id / "reference.diff").write_bytes(task.reference_patch.encode())


def _submitted_before(settings: Settings, name: str, shas: set[str]) -> dict[str, str]:
    """Merge SHA -> the experiment an earlier tick of ``name`` submitted it in (a tick cut off
    before it stored that), for each of ``shas`` that is a task of one: going on with those,
    not submitting them twice. A merge that is no task of it (it landed after) is not here."""
    prefix = new_experiment_id(f"shadow-{name}")[: -len("0123abcd")]
    found: dict[str, str] = {}
    for eid in stored_ids(settings.paths):
        if not eid.startswith(prefix):
            continue
        exp = load_resolved(settings.paths, eid)
        if exp.shadow is not None and exp.shadow.policy == name:
            found |= {sha: eid for sha in exp.shadow.merges.values() if sha in shas}
    return found


def _look(
    settings: Settings,
    policy: ShadowPolicy,
    state: ShadowState,
    repo: Path,
    tip: str,
    now: dt.datetime,
) -> ShadowState:
    """Decide the merges since the cursor and move it (stored by the caller). A merge git
    cannot read is dropped alone (``unreadable_merge``); a cursor gone from the repository
    moves to the tip, recorded in ``resets``."""
    try:
        git("cat-file", "-e", f"{state.cursor}^{{commit}}", cwd=repo, timeout=GIT_TIMEOUT_S)
    except GitError as err:
        reset = CursorReset(at=now, lost=state.cursor, to=tip, detail=str(err)[:2000])
        return state.model_copy(update={"cursor": tip, "resets": [*state.resets, reset]})
    night = night_of(settings.window, now)
    kept_tonight = sum(1 for d in state.merges if d.kept and d.night == night)
    # A mainline moved back and forward again lists merges already decided: once is enough.
    decided = {d.sha for d in state.merges}
    shas = [sha for sha in merge_shas(repo, tip, state.cursor) if sha not in decided]
    readable: list[Merge] = []
    unreadable: dict[str, MergeDecision] = {}
    for sha in shas:
        try:
            readable.append(read_merge(repo, sha))
        except Exception as err:  # recorded on the merge: the policy goes on
            unreadable[sha] = MergeDecision(
                sha=sha,
                subject="",
                seen_at=now,
                night=night,
                kept=False,
                reason=UNREADABLE_MERGE,
                detail=f"{type(err).__name__}: {err}"[:2000],
            )
    decisions, _ = decide(repo, readable, policy, kept_tonight, night, now)
    by_sha = {d.sha: d for d in decisions} | unreadable
    merges = [*state.merges, *(by_sha[sha] for sha in shas)]
    return state.model_copy(update={"cursor": tip, "merges": merges})


def _submit(
    settings: Settings, policy: ShadowPolicy, repo: Path, waiting: list[MergeDecision], tip: str
) -> tuple[dict[str, str], dict[str, str]]:
    """Submit the kept merges ``waiting`` as one experiment: (merge SHA -> its experiment,
    merge SHA -> why it was refused). Merges an earlier cut-off tick submitted keep that
    experiment; only the others are submitted now. A task the submit refuses is left out and
    the others submitted again without it; a refusal of the whole (a budget) refuses all."""
    submitted = _submitted_before(settings, policy.name, {d.sha for d in waiting})
    for eid in sorted(set(submitted.values())):  # a cut-off tick may not have finished it
        finish_submit(load_resolved(settings.paths, eid), Store(settings.paths), settings.paths)
        (settings.paths.experiment_dir(eid) / DAEMON_MARKER).touch()
    refused: dict[str, str] = {}
    tasks: list[ShadowTask] = []
    for d in waiting:  # built again from the repository: a merge's content does not change
        if d.sha in submitted:
            continue
        try:
            task = build_task(repo, read_merge(repo, d.sha), policy)
        except Exception as err:  # this merge alone: the others go on
            task = UNREADABLE_MERGE, f"{type(err).__name__}: {err}"[:2000]
        if isinstance(task, ShadowTask):
            tasks.append(task)
        else:
            refused[d.sha] = f"{task[0]}: {task[1]}"
    specs = policy_dir(settings.paths, policy.name) / "specs"
    while tasks:
        specs.mkdir(parents=True, exist_ok=True)
        where = Path(tempfile.mkdtemp(dir=specs, prefix=f"{tip[:12]}-"))
        for task in tasks:
            write_task_files(where, task)
        spec_path = where / "experiment.yaml"
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
            shutil.rmtree(where, ignore_errors=True)
            named = _task_problems(err, tasks)
            if not named:  # the experiment's, not a task's: every merge is refused
                said = "; ".join(str(p) for p in err.problems)
                return submitted, refused | {t.merge: said for t in tasks}
            refused |= named
            tasks = [t for t in tasks if t.merge not in named]
            continue
        (settings.paths.experiment_dir(exp.experiment_id) / DAEMON_MARKER).touch()
        return submitted | {t.merge: exp.experiment_id for t in tasks}, refused
    return submitted, refused


def _task_problems(err: SpecError, tasks: list[ShadowTask]) -> dict[str, str]:
    """Merge SHA -> its problems, for the tasks (``tasks[i]...``) a refusal names."""
    named: dict[str, list[str]] = {}
    for p in err.problems:
        if (m := re.match(r"tasks\[(\d+)\]", p.path)) and int(m[1]) < len(tasks):
            named.setdefault(tasks[int(m[1])].merge, []).append(str(p))
    return {sha: "; ".join(said) for sha, said in named.items()}


def tick_policy(settings: Settings, name: str, now: dt.datetime) -> TickResult:
    """Decide the merges since the cursor; inside the eval window, submit the kept ones not
    yet submitted as one experiment (outside it they wait, so a day's merges make one). One
    tick at a time per policy: a policy another evaluation holds is skipped this tick."""
    with try_lock(policy_dir(settings.paths, name) / ".lock") as mine:
        if not mine:
            return TickResult(name, f"{name}: another tick is looking at it; skipped")
        return _tick_policy(settings, name, now)


def _tick_policy(settings: Settings, name: str, now: dt.datetime) -> TickResult:
    paths = settings.paths
    policy = read_policy(paths, name)
    state = read_state(paths, name)
    try:
        repo = local_repo(policy, policy_dir(paths, name))
        tip = resolve_base(str(repo), policy.mainline, timeout=GIT_TIMEOUT_S)
    except (GitError, subprocess.CalledProcessError) as err:
        return TickResult(name, f"{name}: cannot read {policy.repo} {policy.mainline}: {err}")
    said = [f"{name}: no new merge on {policy.mainline} since {tip[:12]}"]
    seen, resets = len(state.merges), len(state.resets)
    if tip != state.cursor:
        state = _look(settings, policy, state, repo, tip, now)
        write_state(paths, name, state)  # decided: a later cut-off does not decide them again
        new = state.merges[seen:]
        said = [
            f"{name}: {len(new)} new merge(s) on {policy.mainline}, {sum(d.kept for d in new)} kept"
        ]
        said += [
            f"cursor {r.lost[:12]} is gone from the repository (force-pushed?): reset to "
            f"{r.to[:12]}, the merges between not looked at"
            for r in state.resets[resets:]
        ]
    waiting = [d for d in state.merges if d.kept and d.experiment_id is None]
    experiment_id = None
    if waiting and not settings.window.is_open(now):
        opens = settings.window.next_open(now)
        said.append(
            f"{len(waiting)} kept merge(s) wait for the eval window ({opens:%Y-%m-%d %H:%M} UTC)"
        )
    elif waiting:
        submitted, refused = _submit(settings, policy, repo, waiting, tip)
        state = state.model_copy(
            update={
                "merges": [
                    d.model_copy(update={"experiment_id": submitted[d.sha]})
                    if d.sha in submitted
                    else d.model_copy(
                        update={
                            "kept": False,
                            "reason": SUBMIT_REFUSED,
                            "detail": refused[d.sha],
                            "task": None,
                        }
                    )
                    if d.sha in refused
                    else d
                    for d in state.merges
                ]
            }
        )
        write_state(paths, name, state)
        experiments = list(dict.fromkeys(submitted[d.sha] for d in waiting if d.sha in submitted))
        experiment_id = experiments[-1] if experiments else None  # the new one, if any
        if submitted:
            as_ = "experiment" if len(experiments) == 1 else "experiments"
            said.append(f"submitted {len(submitted)} as {as_} {', '.join(experiments)}")
        if refused:
            why = "; ".join(dict.fromkeys(refused.values()))
            said.append(f"{len(refused)} dropped: submit refused: {why}")
    return TickResult(name, "; ".join(said), experiment_id, tuple(state.merges[seen:]))


def tick(settings: Settings, now: dt.datetime) -> list[TickResult]:
    """One look at every registered policy; a policy whose repository cannot be read says so
    and is tried again next tick (its cursor stays). One that fails otherwise says so too,
    its error kept in ``last_error.txt`` beside its state, and the others go on."""
    results = []
    for name in registered(settings.paths):
        error = policy_dir(settings.paths, name) / LAST_ERROR
        try:
            results.append(tick_policy(settings, name, now))
        except Exception as err:
            said = f"{name}: failed: {type(err).__name__}: {err}"[:4000]
            log.exception("shadow policy %s failed", name)
            write_atomic(error, f"{now.isoformat()} {said}\n")
            results.append(TickResult(name, said))
        else:
            error.unlink(missing_ok=True)
    return results
