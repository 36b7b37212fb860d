"""Submit: check a spec against the world, pin every reference, and store the resolved experiment.

``resolve`` collects every problem (unreachable repo, unknown base, missing
harness lock, floating model, unreadable hidden tests)
and raises one ``SpecError`` listing them all; nothing is written then.
``submit`` writes the resolved experiment atomically, then its row.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import secrets
import shutil
import tempfile
from pathlib import Path

from hangar_dagster.environment.image import ImageRefError, is_digest, pin_image
from hangar_dagster.experiment.harness import (
    CLI_PINS,
    CliPins,
    HarnessError,
    load_lock,
    read_cli_pins,
)
from hangar_dagster.experiment.model_policy import ModelCatalog, ModelListError
from hangar_dagster.experiment.overlay import (
    OVERLAYS,
    OverlayError,
    OverlayTarget,
    deprecation_note,
)
from hangar_dagster.experiment.overlay import build as build_overlay
from hangar_dagster.experiment.pins import environment_digest, lock_pin_content, pin_set_id
from hangar_dagster.experiment.plan import (
    ResolvedExperiment,
    ResolvedTask,
    ResolvedVariant,
    ShadowOrigin,
)
from hangar_dagster.experiment.regrade import (
    RegradeSubmitted,
    earlier_regrade,
    plan_regrade,
    regrade_note,
)
from hangar_dagster.experiment.reuse import materialize as materialize_reuse
from hangar_dagster.experiment.reuse import plan_reuse, reuse_notes
from hangar_dagster.experiment.spec import (
    MAX_HIDDEN_BYTES,
    MAX_HIDDEN_FILES,
    MAX_PATCH_BYTES,
    Environment,
    ExperimentSpec,
    Problem,
    RefusedForNow,
    SpecError,
    Task,
    load_spec,
)
from hangar_dagster.grading.grader import grader_digest
from hangar_dagster.queue.budget import projection_note, submit_problems
from hangar_dagster.results.records import ExperimentRecord, NoteRecord, Record, utcnow
from hangar_dagster.results.store import Store
from hangar_dagster.settings import HangarPaths, Settings
from hangar_dagster.trials.agents import UnknownAgent, get_agent
from hangar_dagster.trials.agents.install import CliUnavailable
from hangar_dagster.trials.canary import new_canary
from hangar_dagster.trials.redact import redact
from hangar_dagster.trials.sandbox import SandboxUnavailable
from hangar_dagster.util.digests import sha256_json
from hangar_dagster.util.fs import InputFileError, read_text_bounded
from hangar_dagster.util.gitrepo import GitError, repo_location, resolve_base

RESOLVED = "resolved.json"


def _read_hidden(task: Task, where: str, spec_dir: Path, problems: list[Problem]) -> dict[str, str]:
    if task.hidden_tests is None:
        return {}
    if isinstance(task.hidden_tests, dict):
        return dict(task.hidden_tests)
    root = (spec_dir / task.hidden_tests).resolve()
    fix = (
        f"point it at a folder of at most {MAX_HIDDEN_FILES} UTF-8 test files "
        f"({MAX_HIDDEN_BYTES} bytes in all), relative to the spec"
    )
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a directory"
        problems.append(Problem(path=f"{where}.hidden_tests", message=f"{root} {what}", fix=fix))
        return {}
    files: dict[str, str] = {}
    total = 0
    # Walked and read under the bounds: a typo like `hidden_tests: /` stops at the cap.
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if len(files) == MAX_HIDDEN_FILES:
                problems.append(
                    Problem(
                        path=f"{where}.hidden_tests",
                        message=f"{root} holds more than {MAX_HIDDEN_FILES} files",
                        fix=fix,
                    )
                )
                return {}
            try:
                data = read_text_bounded(path, MAX_HIDDEN_BYTES, "hidden test file")
            except InputFileError as err:
                problems.append(Problem(path=f"{where}.hidden_tests", message=str(err), fix=fix))
                return {}
            total += len(data.encode())
            if total > MAX_HIDDEN_BYTES:
                problems.append(
                    Problem(
                        path=f"{where}.hidden_tests",
                        message=f"{root} holds more than {MAX_HIDDEN_BYTES} bytes of test files",
                        fix=fix,
                    )
                )
                return {}
            files[path.relative_to(root).as_posix()] = data
    if not files:
        problems.append(
            Problem(path=f"{where}.hidden_tests", message=f"{root} holds no files", fix=fix)
        )
    return dict(sorted(files.items(), key=lambda kv: kv[0].split("/")))  # as paths sort


def _read_reference(task: Task, where: str, spec_dir: Path, problems: list[Problem]) -> str | None:
    ref = task.reference_patch
    if ref is None or "\n" in ref.strip():
        return ref
    path = (spec_dir / ref).resolve()
    try:
        text = read_text_bounded(path, MAX_PATCH_BYTES, "reference patch")
    except InputFileError as err:
        problems.append(
            Problem(
                path=f"{where}.reference_patch",
                message=str(err),
                fix="give a UTF-8 diff file relative to the spec "
                f"(at most {MAX_PATCH_BYTES} bytes), or the diff text itself",
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


def _harness_registry(spec: ExperimentSpec, spec_dir: Path, settings: Settings) -> Path | None:
    if spec.harness_repo:
        return (spec_dir / spec.harness_repo).resolve()
    return Path(settings.harness_repo).resolve() if settings.harness_repo else None


def _pinned_environment(
    environment: Environment, where: str, problems: list[Problem]
) -> Environment:
    """``environment`` with its image pinned to a digest (Docker, Kubernetes); a tag is a
    problem."""
    if environment.sandbox == "k8s":
        # The cluster pulls it; no engine here to look a tag up in: a digest as written.
        if not is_digest(environment.image):
            problems.append(
                Problem(
                    path=f"{where}.image",
                    message=f"environment.sandbox k8s needs environment.image by digest, "
                    f"not {environment.image!r}: a tag can move between trials",
                    fix="push the project image (deploy/docker) and pin it as repo@sha256:... "
                    "(docs/operations.md, Kubernetes)",
                )
            )
        return environment
    if environment.sandbox != "docker":
        return environment
    try:
        image = pin_image(environment.image)
    except (ImageRefError, SandboxUnavailable) as err:
        fix = err.fix if isinstance(err, ImageRefError) else "start dockerd (scripts/bootstrap)"
        problems.append(Problem(path=f"{where}.image", message=str(err), fix=fix))
        return environment
    return environment.model_copy(update={"image": image})


def new_experiment_id(name: str) -> str:
    return f"{re.sub(r'[^A-Za-z0-9_]', '_', name)}_{secrets.token_hex(4)}"


def resolve(
    spec: ExperimentSpec,
    spec_path: Path,
    settings: Settings,
    *,
    require_concrete: bool = False,
    experiment_id: str | None = None,
    overlays: OverlayTarget | None = None,
) -> ResolvedExperiment:
    """Pin everything ``spec`` points at; ``require_concrete`` (experiments) refuses model aliases.

    Ordinary jobs (``hangar grade``) resolve without it: an alias stays, recorded as not concrete.
    Overlay variants are built into ``overlays`` (submit: the experiment's directory); without
    it they are built in a temporary directory, only to pin them.
    """
    with contextlib.ExitStack() as stack:
        if overlays is None:
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            overlays = OverlayTarget(build=scratch, final=scratch)
        return _resolve(spec, spec_path, settings, require_concrete, experiment_id, overlays)


def _resolve(
    spec: ExperimentSpec,
    spec_path: Path,
    settings: Settings,
    require_concrete: bool,
    experiment_id: str | None,
    overlays: OverlayTarget,
) -> ResolvedExperiment:
    spec_dir = spec_path.resolve().parent
    problems: list[Problem] = []
    unresolved: list[Problem] = []  # bases git could not resolve now (RefusedForNow)

    tasks: dict[str, ResolvedTask] = {}
    for i, task in enumerate(spec.tasks):
        where = f"tasks[{i}]"
        repo = repo_location(task.repo, spec_dir)
        base_sha = ""
        if Path(repo).exists() and not Path(repo).is_dir():  # git would run in it: a traceback
            problems.append(
                Problem(
                    path=f"{where}.repo",
                    message=f"{repo} is not a directory, so not a git repository",
                    fix="point repo at the repository's folder (relative to the spec) or a git URL",
                )
            )
        else:
            try:
                base_sha = resolve_base(repo, task.base)
            except GitError as err:
                unresolved.append(
                    Problem(
                        path=f"{where}.base",
                        message=str(err),
                        fix="name a commit, tag or branch that exists in the repo",
                    )
                )
                problems.append(unresolved[-1])
        reported = len(problems)
        hidden = _read_hidden(task, where, spec_dir, problems)
        if not hidden and not spec.grader.files and len(problems) == reported:
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
            build=tuple(task.build),
        )

    g_digest = grader_digest(spec.grader, {t.id: t.hidden_files for t in tasks.values()})
    registry = _harness_registry(spec, spec_dir, settings)
    if registry is not None and registry.exists() and not registry.is_dir():
        problems.append(
            Problem(
                path="harness_repo",
                message=f"{registry} is not a directory",
                fix="point it at the harness registry folder (relative to the spec)",
            )
        )
    catalog = ModelCatalog.of(settings)  # one per experiment: every policy resolves once
    cli_pins: CliPins | None = None
    if registry is not None:
        try:
            cli_pins = read_cli_pins(registry)
        except HarnessError as err:
            problems.append(
                Problem(
                    path="harness_repo",
                    message=str(err),
                    fix=f"fix {CLI_PINS} at the registry root (see docs/architecture.md)",
                )
            )
    spec_environment = _pinned_environment(spec.environment, "environment", problems)
    variants: dict[str, ResolvedVariant] = {}
    for name, variant in spec.variants.items():
        where = f"variants.{name}"
        if variant.harness_lock is None:
            try:  # the deprecated overlay: built into the experiment's own registry
                lock = build_overlay(spec.name, name, variant, spec_dir, registry, overlays.build)
            except OverlayError as err:
                problems.append(err.problem)
                continue
        elif registry is None:
            problems.append(
                Problem(
                    path="harness_repo",
                    message="no harness registry is set",
                    fix="set harness_repo in the spec or the HANGAR_HARNESS_REPO environment variable",
                )
            )
            continue
        else:
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
        if cli_pins is not None and (pin_problem := cli_pins.problem(lock)):
            problems.append(
                Problem(path=f"{where}.harness_lock", message=pin_problem[0], fix=pin_problem[1])
            )
        try:
            model = catalog.choose(lock.model, lock.adapter)
        except ModelListError as err:
            problems.append(
                Problem(
                    path=f"{where}.harness_lock",
                    message=f"the lock's model: {err}",
                    fix="name a concrete, dated model id in the lock, or fix the model list",
                )
            )
            continue
        if require_concrete and (refused := catalog.refusal(model.model, lock.adapter)):
            field = "model" if variant.model is not None else "harness_lock"  # overlay or lock
            problems.append(
                Problem(path=f"{where}.{field}", message=refused.message, fix=refused.fix)
            )
        environment = variant.environment or spec.environment
        if variant.environment is not None:
            environment = _pinned_environment(environment, f"{where}.environment", problems)
        else:
            environment = spec_environment
        run_tasks = tuple(variant.tasks or [t.id for t in spec.tasks])
        task_build = {t: tasks[t].build for t in run_tasks}
        env_digest = environment_digest(environment, task_build)
        content = lock_pin_content(
            lock,
            environment,
            model=model.model,
            model_concrete_basis=model.basis,
            task_bases={t: tasks[t].base_sha for t in run_tasks},
            grader_digest=g_digest,
            aliases=settings.model_aliases,
            task_build=task_build,
        )
        variants[name] = ResolvedVariant(
            name=name,
            harness_lock=lock.ref,
            harness_digest=lock.digest,
            # An overlay's lock is built in staging and lives in the experiment's directory.
            harness_path=str(
                overlays.final / lock.ref if variant.harness_lock is None else lock.path
            ),
            adapter=lock.adapter,
            model=model.model,
            model_requested=model.requested,
            model_concrete_basis=model.basis,
            model_note=model.note if model.basis == "pattern" else None,
            environment=environment,
            environment_digest=env_digest,
            tasks=run_tasks,
            pin_set=pin_set_id(content),
            overlay=variant.harness_lock is None,
        )
    if problems:
        only_now = len(problems) == len(unresolved)
        raise (RefusedForNow if only_now else SpecError)(str(spec_path), problems)

    canary = spec.grader.canary or new_canary()
    pinned = spec.model_copy(
        update={
            "grader": spec.grader.model_copy(update={"canary": canary}),
            # The grader runs in the spec's environment: its image is pinned as the variants' are.
            "environment": spec_environment,
        }
    )
    return ResolvedExperiment(
        experiment_id=experiment_id or new_experiment_id(spec.name),
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
    return str(redact(exp.spec.model_dump_json(exclude_none=True), exp.canary))


def cli_problems(exp: ResolvedExperiment, settings: Settings) -> list[Problem]:
    """Each variant whose adapter's CLI cannot be found or used on this orchestrator.

    A configuration error: refused here, once, rather than failing (and being retried) in
    every trial. Checked at submit, not at validate (a spec can be checked anywhere).
    """
    problems = []
    for name, variant in exp.variants.items():
        try:
            get_agent(variant.adapter).find_install(settings)
        except (CliUnavailable, UnknownAgent) as err:
            problems.append(
                Problem(
                    path=f"variants.{name}",
                    message=f"adapter {variant.adapter}: {err}",
                    fix="install the CLI on the orchestrator, then submit again",
                )
            )
    return problems


def submit(
    spec_path: Path,
    settings: Settings,
    *,
    regrade: ResolvedExperiment | None = None,
    spec: ExperimentSpec | None = None,
    experiment_id: str | None = None,
    shadow: ShadowOrigin | None = None,
) -> ResolvedExperiment:
    """Validate and resolve ``spec_path``, then store it; raises SpecError having written nothing.

    ``regrade``: the experiment whose stored patches this one grades again under its grader
    (experiment/regrade.py), instead of planning reuse. ``spec``: the spec already read (a
    nightly schedule's stored copy), ``spec_path`` then only anchors its relative paths;
    ``experiment_id``: the id to use (a night's, derived so that a retried tick finds it).
    ``shadow``: the merges a shadow's experiment was built from (shadow/tick.py); its trials say
    source shadow."""
    paths = settings.paths
    spec = load_spec(spec_path) if spec is None else spec
    experiment_id = experiment_id or new_experiment_id(spec.name)
    store = Store(paths)
    final = paths.experiment_dir(experiment_id)
    # Overlay harnesses are built outside HANGAR_HOME (a refused spec writes nothing there),
    # then moved into staging with resolved.json: the experiment's directory appears whole.
    with tempfile.TemporaryDirectory(prefix="hangar-submit-") as scratch:
        built = Path(scratch) / OVERLAYS
        exp = resolve(
            spec,
            spec_path,
            settings,
            require_concrete=True,
            experiment_id=experiment_id,
            overlays=OverlayTarget(build=built, final=final / OVERLAYS),
        )
        if shadow is not None:
            exp = exp.model_copy(update={"shadow": shadow})
        n_trials = len(exp.trial_keys())
        if problems := cli_problems(exp, settings):
            raise SpecError(str(spec_path), problems)
        # Decided before the budget looks: it projects only the trials that will be paid.
        if regrade is not None:
            exp = plan_regrade(regrade, exp, store, settings)
            n_trials = len(exp.trial_keys())
            if (earlier := earlier_regrade(regrade, exp.grader_digest, paths)) is not None:
                raise RegradeSubmitted(earlier)  # the command run again: it goes on with that
        else:
            exp = exp.model_copy(update={"reuse": plan_reuse(exp, store, paths)})
        n_reused = len(exp.reuse.sources) if exp.reuse is not None else 0
        if problems := submit_problems(
            store,
            exp.spec,
            exp.author,
            n_trials,
            exp.submitted_at,
            settings,
            paid=n_trials - n_reused,
        ):
            raise RefusedForNow(str(spec_path), problems)
        paths.experiments.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=paths.experiments, prefix=".submit-"))
        if built.is_dir():
            shutil.move(built, staging / OVERLAYS)
        (staging / RESOLVED).write_text(exp.model_dump_json(indent=2))
        os.replace(staging, final)
    finish_submit(exp, store, paths, regrade=regrade)
    return exp


def finish_submit(
    exp: ResolvedExperiment,
    store: Store,
    paths: HangarPaths,
    *,
    regrade: ResolvedExperiment | None = None,
) -> None:
    """The store's records of a submitted experiment, whose directory is in place: what
    ``submit`` writes after that directory appears. Called again for an experiment a crash cut
    off there (a nightly or shadow tick, or a regrade, going on with it), it writes only what is
    missing: a second experiment row would be refused, a second note would say it twice."""
    eid = exp.experiment_id
    if store.experiment(eid) is None:
        spec_json = masked_spec_json(exp)
        store.put(
            ExperimentRecord(
                experiment_id=eid,
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
                trials_reused=len(exp.reuse.sources) if exp.reuse is not None else 0,
            )
        )
    notes = list(reuse_notes(exp))
    if regrade is not None:
        notes.append(regrade_note(regrade, exp))
    if said := projection_note(exp.spec, len(exp.trial_keys())):
        notes.append(NoteRecord(experiment_id=eid, kind="budget", message=said))
    notes += [deprecation_note(exp, v) for v in exp.variants.values() if v.overlay]
    notes += [
        NoteRecord(experiment_id=eid, kind="model", message=f"variant {v.name}: {v.model_note}")
        for v in exp.variants.values()
        if v.model_note
    ]
    stored = {(n.kind, n.message) for n in store.notes(eid)}
    missing: list[Record] = [n for n in notes if (n.kind, n.message) not in stored]
    if missing:
        store.put_many(missing)
    materialize_reuse(exp, store, paths)  # the spec stage writes again what a crash cut off


def load_resolved(paths: HangarPaths, experiment_id: str) -> ResolvedExperiment:
    return ResolvedExperiment.model_validate_json(
        (paths.experiment_dir(experiment_id) / RESOLVED).read_text()
    )
