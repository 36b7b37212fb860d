"""Submit: check a spec against the world, pin every reference, and store the resolved experiment.

``resolve`` collects every problem (unreachable repo, unknown base, missing
harness lock, floating model, unreadable hidden tests, unsupported egress)
and raises one ``SpecError`` listing them all; nothing is written then.
``submit`` writes the resolved experiment atomically, then its row.
"""

from __future__ import annotations

import getpass
import os
import re
import secrets
import tempfile
from pathlib import Path

from hangar_dagster.budget import projection_note, submit_problems
from hangar_dagster.canary import mask, new_canary
from hangar_dagster.config import HangarPaths
from hangar_dagster.digests import sha256_json
from hangar_dagster.gitrepo import GitError, repo_location, resolve_base
from hangar_dagster.grading.grader import grader_digest
from hangar_dagster.harness import HarnessError, load_lock
from hangar_dagster.models import floating_reason
from hangar_dagster.pins import environment_digest, pin_content, pin_set_id
from hangar_dagster.plan import ResolvedExperiment, ResolvedTask, ResolvedVariant
from hangar_dagster.records import ExperimentRecord, NoteRecord, utcnow
from hangar_dagster.spec import ExperimentSpec, Problem, SpecError, Task, load_spec
from hangar_dagster.store import Store

RESOLVED = "resolved.json"
MAX_HIDDEN_BYTES = 2_000_000


def _read_hidden(task: Task, where: str, spec_dir: Path, problems: list[Problem]) -> dict[str, str]:
    if task.hidden_tests is None:
        return {}
    if isinstance(task.hidden_tests, dict):
        return dict(task.hidden_tests)
    root = (spec_dir / task.hidden_tests).resolve()
    if not root.is_dir():
        problems.append(
            Problem(
                path=f"{where}.hidden_tests",
                message=f"{root} is not a directory",
                fix="point it at the folder of hidden test files, relative to the spec",
            )
        )
        return {}
    files: dict[str, str] = {}
    total = 0
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            data = path.read_text()
            total += len(data)
            files[path.relative_to(root).as_posix()] = data
    if not files or total > MAX_HIDDEN_BYTES:
        problems.append(
            Problem(
                path=f"{where}.hidden_tests",
                message=f"{root} holds {'no files' if not files else f'{total} bytes'}",
                fix=f"put 1 to {MAX_HIDDEN_BYTES} bytes of test files there",
            )
        )
    return files


def _read_reference(task: Task, where: str, spec_dir: Path, problems: list[Problem]) -> str | None:
    ref = task.reference_patch
    if ref is None or "\n" in ref.strip():
        return ref
    path = (spec_dir / ref).resolve()
    try:
        text = path.read_text()
    except OSError:
        problems.append(
            Problem(
                path=f"{where}.reference_patch",
                message=f"cannot read {path}",
                fix="give a diff file relative to the spec, or the diff text itself",
            )
        )
        return None
    if "diff --git" not in text and not text.startswith("---"):
        problems.append(
            Problem(
                path=f"{where}.reference_patch",
                message=f"{path} is not a diff",
                fix="write it with `git diff`",
            )
        )
    return text


def _harness_registry(spec: ExperimentSpec, spec_dir: Path) -> Path | None:
    if spec.harness_repo:
        return (spec_dir / spec.harness_repo).resolve()
    env = os.environ.get("HANGAR_HARNESS_REPO")
    return Path(env).resolve() if env else None


def new_experiment_id(name: str) -> str:
    return f"{re.sub(r'[^A-Za-z0-9_]', '_', name)}_{secrets.token_hex(4)}"


def resolve(spec: ExperimentSpec, spec_path: Path) -> ResolvedExperiment:
    spec_dir = spec_path.resolve().parent
    problems: list[Problem] = []

    tasks: dict[str, ResolvedTask] = {}
    for i, task in enumerate(spec.tasks):
        where = f"tasks[{i}]"
        repo = repo_location(task.repo, spec_dir)
        try:
            base_sha = resolve_base(repo, task.base)
        except GitError as err:
            problems.append(
                Problem(
                    path=f"{where}.base",
                    message=str(err),
                    fix="name a commit, tag or branch that exists in the repo",
                )
            )
            base_sha = ""
        hidden = _read_hidden(task, where, spec_dir, problems)
        if not hidden and not spec.grader.files:
            problems.append(
                Problem(
                    path=f"{where}.hidden_tests",
                    message="the task has no hidden tests",
                    fix="set hidden_tests, or grader.files for every task",
                )
            )
        tasks[task.id] = ResolvedTask(
            id=task.id,
            instructions=task.instructions,
            repo=repo,
            base_sha=base_sha,
            verify=task.verify,
            reference_patch=_read_reference(task, where, spec_dir, problems),
            hidden_files=hidden,
        )

    g_digest = grader_digest(spec.grader, {t.id: t.hidden_files for t in tasks.values()})
    registry = _harness_registry(spec, spec_dir)
    variants: dict[str, ResolvedVariant] = {}
    for name, variant in spec.variants.items():
        where = f"variants.{name}"
        if variant.harness_lock is None:
            problems.append(
                Problem(
                    path=where,
                    message="overlay variants (harness/model/skills fields) cannot run in this version",
                    fix="freeze the configuration into a harness lock and set harness_lock",
                )
            )
            continue
        if registry is None:
            problems.append(
                Problem(
                    path="harness_repo",
                    message="no harness registry is set",
                    fix="set harness_repo in the spec or the HANGAR_HARNESS_REPO environment variable",
                )
            )
            continue
        try:
            lock = load_lock(registry, variant.harness_lock)
        except HarnessError as err:
            problems.append(
                Problem(
                    path=f"{where}.harness_lock",
                    message=str(err),
                    fix="freeze the harness again and use the new name",
                )
            )
            continue
        if why := floating_reason(lock.model):
            problems.append(
                Problem(
                    path=f"{where}.harness_lock",
                    message=f"the lock's model is a floating alias: {why}",
                    fix="freeze a lock with a concrete, dated model id",
                )
            )
        environment = variant.environment or spec.environment
        if environment.egress.mode != "none":
            problems.append(
                Problem(
                    path=f"{where}.environment.egress.mode",
                    message=f"{environment.egress.mode!r} needs an egress proxy, which the local sandbox does not have",
                    fix="use egress mode none on the local sandbox",
                )
            )
        run_tasks = tuple(variant.tasks or [t.id for t in spec.tasks])
        env_digest = environment_digest(environment)
        content = pin_content(
            harness_lock=lock.ref,
            harness_digest=lock.digest,
            environment_digest=env_digest,
            model=lock.model,
            task_bases={t: tasks[t].base_sha for t in run_tasks},
            grader_digest=g_digest,
            egress=environment.egress.mode,
        )
        variants[name] = ResolvedVariant(
            name=name,
            harness_lock=lock.ref,
            harness_digest=lock.digest,
            harness_path=str(lock.path),
            adapter=lock.adapter,
            model=lock.model,
            environment=environment,
            environment_digest=env_digest,
            tasks=run_tasks,
            pin_set=pin_set_id(content),
        )
    if problems:
        raise SpecError(str(spec_path), problems)

    canary = spec.grader.canary or new_canary()
    pinned = spec.model_copy(update={"grader": spec.grader.model_copy(update={"canary": canary})})
    return ResolvedExperiment(
        experiment_id=new_experiment_id(spec.name),
        name=spec.name,
        author=spec.author or os.environ.get("USER") or getpass.getuser(),
        spec_path=str(spec_path.resolve()),
        submitted_at=utcnow(),
        spec=pinned,
        tasks=tasks,
        variants=variants,
        grader_digest=g_digest,
    )


def masked_spec_json(exp: ResolvedExperiment) -> str:
    return str(mask(exp.spec.model_dump_json(exclude_none=True), exp.canary))


def submit(spec_path: Path, paths: HangarPaths) -> ResolvedExperiment:
    """Validate and resolve ``spec_path``, then store it; raises SpecError having written nothing."""
    exp = resolve(load_spec(spec_path), spec_path)
    store = Store(paths)
    n_trials = len(exp.trial_keys())
    if problems := submit_problems(store, exp.spec, exp.author, n_trials, exp.submitted_at):
        raise SpecError(str(spec_path), problems)
    paths.experiments.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=paths.experiments, prefix=".submit-"))
    (staging / RESOLVED).write_text(exp.model_dump_json(indent=2))
    os.replace(staging, paths.experiment_dir(exp.experiment_id))
    spec_json = masked_spec_json(exp)
    store.put(
        ExperimentRecord(
            experiment_id=exp.experiment_id,
            name=exp.name,
            author=exp.author,
            submitted_at=exp.submitted_at,
            spec_path=exp.spec_path,
            spec_digest="sha256:" + sha256_json(spec_json),
            spec_json=spec_json,
            variants=list(exp.variants),
            tasks=list(exp.tasks),
            trials_per_task=exp.spec.trials,
            trials_planned=len(exp.trial_keys()),
            parallel=exp.spec.parallel,
        )
    )
    if note := projection_note(exp.spec, n_trials):
        store.put(NoteRecord(experiment_id=exp.experiment_id, kind="budget", message=note))
    return exp


def load_resolved(paths: HangarPaths, experiment_id: str) -> ResolvedExperiment:
    return ResolvedExperiment.model_validate_json(
        (paths.experiment_dir(experiment_id) / RESOLVED).read_text()
    )


def stored_experiments(paths: HangarPaths) -> list[ResolvedExperiment]:
    """Every submitted experiment, oldest first (the definitions are built from these)."""
    if not paths.experiments.is_dir():
        return []
    found = [
        load_resolved(paths, d.name)
        for d in paths.experiments.iterdir()
        if (d / RESOLVED).is_file()
    ]
    return sorted(found, key=lambda e: e.submitted_at)
