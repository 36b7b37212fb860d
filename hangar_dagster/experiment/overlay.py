"""Overlay variants (deprecated): a base harness changed by a variant's fields, and freeze-variants.

An overlay variant names no ``harness_lock``; it starts from a base harness
and changes it:

- ``harness``: the base. A lock ref (``name@sha256:<digest>``) in the
  registry, a harness directory (relative to the spec), or a bare name: the one
  lock of that name in the registry. Unset, the base is the registry's default
  harness, the one lock named ``default``.
- ``model``, ``approvals``: replace those keys of ``harness.yaml``.
- ``instructions``: replaces the instructions text; ``instructions_append``
  adds a paragraph after it (after the base's, when ``instructions`` is unset).
- ``skills``: keep only these skills of the base (``[]``: none);
  ``skills_remove``: drop these. Both name directories under the base's
  ``skills/``.

At submit the result is built as a real harness directory, named
``<spec name>-<variant>``, with ``overlay: {base, fields}`` in its
``harness.yaml``, and frozen into the experiment's own registry
(``<experiment dir>/overlays/``, never the team registry), so trials thaw,
verify and run it through the same adapters as any lock. Each overlay variant
gets a ``deprecation`` note.

Pins: the pin set is computed at submit from the built harness, like a lock
variant's, but the variant is pinned (``experiment_pins``) only by its first
finished trial (any outcome but ``infra_error``) whose turn 1 ran that harness
digest (``ran_harness_digest``); later trials are held to the same pin set
(drift otherwise). ``freeze_variants`` freezes the harness that trial ran into
a registry and writes the same spec with ``harness_lock`` variants, whose pin
sets are the overlay's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hangar_dagster.experiment.harness import (
    MANIFEST,
    HarnessError,
    HarnessLock,
    _read_config,
    find_ref,
    freeze,
    load_lock,
    parse_ref,
    tree_digest,
)
from hangar_dagster.experiment.plan import ResolvedExperiment, ResolvedVariant
from hangar_dagster.experiment.spec import Problem, Variant
from hangar_dagster.results.records import ExperimentPinRecord, NoteRecord, TrialRecord
from hangar_dagster.results.store import DuplicateRecordError, Store
from hangar_dagster.util.fs import write_atomic
from hangar_dagster.util.gitrepo import repo_location

OVERLAYS = "overlays"  # under the experiment dir: the registry of its overlay harnesses
DEFAULT_HARNESS = "default"  # the registry lock an overlay without `harness:` starts from
INSTRUCTIONS = "instructions.md"
SKILLS = "skills"


class OverlayError(ValueError):
    """An overlay variant that cannot be built; ``problem`` names the field and the fix."""

    def __init__(self, problem: Problem):
        super().__init__(str(problem))
        self.problem = problem


class FreezeError(ValueError):
    """freeze-variants cannot convert the experiment (the message names the variant and the fix)."""


@dataclass(frozen=True)
class OverlayTarget:
    """Where submit builds overlay harnesses (``build``) and where they live once stored (``final``)."""

    build: Path
    final: Path


@dataclass(frozen=True)
class _Base:
    path: Path
    ref: str  # name@sha256:<digest of the directory>, also for a directory base


def _problem(where: str, message: str, fix: str) -> OverlayError:
    return OverlayError(Problem(path=where, message=message, fix=fix))


def _base(value: str | None, where: str, spec_dir: Path, registry: Path | None) -> _Base:
    """The harness an overlay starts from (see the module docstring for the rules)."""
    field = f"{where}.harness" if value is not None else where
    if value is not None and "@" not in value and (spec_dir / value).is_dir():
        path = (spec_dir / value).resolve()
        try:
            config = _read_config(path)
            digest = tree_digest(path)
        except HarnessError as err:
            raise _problem(field, str(err), "point it at a harness directory") from None
        return _Base(path, f"{config['name']}@sha256:{digest}")
    default = (
        ""
        if value is not None
        else f"an overlay without harness: starts from the registry's {DEFAULT_HARNESS!r} lock; "
    )
    if registry is None:
        raise _problem(
            field,
            f"{default}no harness registry is set",
            "set harness_repo in the spec or HANGAR_HARNESS_REPO, or harness: to a directory",
        )
    try:
        lock = load_lock(registry, find_ref(registry, value or DEFAULT_HARNESS))
    except HarnessError as err:
        raise _problem(
            field,
            f"{default}{err}",
            "set harness: to a lock ref, a harness directory (relative to the spec) or the name "
            f"of one lock in the registry; or freeze a harness named {DEFAULT_HARNESS!r} "
            "(better: set harness_lock)",
        ) from None
    return _Base(lock.path, lock.ref)


def _instructions(root: Path, config: dict[str, Any], variant: Variant, where: str) -> None:
    if variant.instructions is None and variant.instructions_append is None:
        return
    named = config.get("instructions")
    file = root / str(named) if named else root / INSTRUCTIONS
    text = variant.instructions
    if text is None:
        if named and not file.is_file():
            raise _problem(
                f"{where}.instructions_append",
                f"the base harness names instructions file {named!r}, which it does not hold",
                "fix the base harness, or set instructions: to the whole text",
            )
        text = file.read_text() if named else ""
    if variant.instructions_append is not None:
        added = variant.instructions_append
        text = f"{text.rstrip()}\n\n{added}" if text.strip() else added
    file.write_text(text.rstrip("\n") + "\n")
    config["instructions"] = file.relative_to(root).as_posix()


def _skills(root: Path, variant: Variant, where: str) -> None:
    skills = root / SKILLS
    have = sorted(p.name for p in skills.iterdir() if p.is_dir()) if skills.is_dir() else []
    for field, names in (("skills", variant.skills), ("skills_remove", variant.skills_remove)):
        unknown = [n for n in names or [] if n not in have]
        if unknown:
            raise _problem(
                f"{where}.{field}",
                f"the base harness has no skill(s) {', '.join(unknown)}",
                f"use skills of the base: {', '.join(have) or '(it has none)'}",
            )
    keep = set(have if variant.skills is None else variant.skills)
    keep -= set(variant.skills_remove or [])
    for name in have:
        if name not in keep:
            shutil.rmtree(skills / name)
    if skills.is_dir() and not any(skills.iterdir()):
        skills.rmdir()


def build(
    spec_name: str,
    name: str,
    variant: Variant,
    spec_dir: Path,
    registry: Path | None,
    into: Path,
) -> HarnessLock:
    """Build overlay variant ``name`` and freeze it into the registry directory ``into``.

    Raises OverlayError naming the field when the base or a field cannot apply.
    """
    where = f"variants.{name}"
    base = _base(variant.harness, where, spec_dir, registry)
    into.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=into, prefix=".overlay-") as tmp:
        root = Path(tmp) / name
        # Content only: a base thawed read-only must still be editable here (modes are not digested).
        shutil.copytree(base.path, root, copy_function=shutil.copyfile)
        for folder, _, _ in os.walk(root):
            os.chmod(folder, 0o755)
        config: dict[str, Any] = yaml.safe_load((root / MANIFEST).read_text())
        config["name"] = f"{spec_name}-{name}"
        if variant.model is not None:
            config["model"] = variant.model
        if variant.approvals is not None:
            config["approvals"] = variant.approvals
        _instructions(root, config, variant, where)
        _skills(root, variant, where)
        # Provenance for auditors; part of the digest, and the same for the same base and fields.
        config["overlay"] = {"base": base.ref, "fields": variant.overlay_fields()}
        (root / MANIFEST).write_text(yaml.safe_dump(config, sort_keys=True))
        try:
            return freeze(root, into)
        except HarnessError as err:
            raise _problem(where, str(err), "fix the base harness") from None


def deprecation_note(exp: ResolvedExperiment, variant: ResolvedVariant) -> NoteRecord:
    fields = ", ".join(exp.spec.variants[variant.name].overlay_fields())
    return NoteRecord(
        experiment_id=exp.experiment_id,
        kind="deprecation",
        message=(
            f"variant {variant.name} is an overlay ({fields or 'the default harness'}), which "
            f"is deprecated; it runs as {variant.harness_lock}, built in the experiment. "
            f"`hangar experiment freeze-variants {exp.experiment_id} --out DIR -o locked.yaml` "
            "turns it into a harness lock once a trial of it has finished"
        ),
    )


def ran_harness_digest(trial: TrialRecord) -> str:
    """The harness digest the trial's first turn ran with.

    The adapter's own report where it gives one (``harness_digest``, or the
    digest in its ``harness`` ref), else the digest hangar verified as it
    mounted the harness read-only for the agent.
    """
    fingerprint = trial.trace.get("fingerprint") or {}
    reported = fingerprint.get("harness_digest")
    if isinstance(reported, str) and reported:
        return reported.removeprefix("sha256:")
    ref = fingerprint.get("harness")
    if isinstance(ref, str):
        try:
            return parse_ref(ref)[1]
        except HarnessError:
            pass  # not a lock ref: fall back to what hangar verified
    return trial.harness_digest


def first_finished(trials: Iterable[TrialRecord], variant: str) -> TrialRecord | None:
    """The variant's earliest finished attempt whose turn 1 ran (any outcome but infra_error)."""
    ran = [t for t in trials if t.variant == variant and t.outcome_class != "infra_error"]
    return min(ran, key=lambda t: (t.finished_at, t.trial_key, t.attempt), default=None)


def record_pins(exp: ResolvedExperiment, store: Store, run_id: str) -> list[str]:
    """Link each overlay variant to its pin set once its first trial has finished.

    The pin set itself (computed at submit from the harness built there) is
    stored by the pin_sets stage; the variant counts as pinned once its first
    finished trial's turn 1 ran that harness digest. A first trial that ran
    another digest pins nothing (its drift says why). Returns what happened, for
    the run's log.
    """
    overlay = [v for v in exp.variants.values() if v.overlay]
    if not overlay:
        return []  # called after every finished trial: no store read when nothing can pin
    pinned = store.pins(exp.experiment_id)
    todo = [v for v in overlay if v.name not in pinned]
    if not todo:
        return []
    trials = store.trials(exp.experiment_id, all_attempts=True)
    said: list[str] = []
    for variant in todo:
        first = first_finished(trials, variant.name)
        if first is None:
            continue
        seen = ran_harness_digest(first)
        ran = f"trial {first.trial_key} attempt {first.attempt}"
        if seen != variant.harness_digest:
            said.append(
                f"overlay variant {variant.name}: not pinned: {ran} ran harness sha256:{seen}, "
                f"not the one built at submit (sha256:{variant.harness_digest})"
            )
            continue
        try:
            store.put(
                ExperimentPinRecord(
                    experiment_id=exp.experiment_id,
                    variant=variant.name,
                    pin_set=variant.pin_set,
                    run_id=run_id,
                )
            )
        except DuplicateRecordError:
            continue  # another run linked it first
        message = (
            f"overlay variant {variant.name}: pin set {variant.pin_set} recorded from {ran}, "
            f"whose turn 1 ran harness {variant.harness_lock}"
        )
        store.put(NoteRecord(experiment_id=exp.experiment_id, kind="pins", message=message))
        said.append(message)
    return said


def _rebase(value: str, old: Path, new: Path) -> str:
    """A path written relative to ``old`` (or absolute), written relative to ``new``."""
    return os.path.relpath((old / value).resolve(), new)


def _locked_spec(
    exp: ResolvedExperiment, refs: dict[str, str], registry: Path, spec_out: Path
) -> dict[str, Any]:
    old, new = Path(exp.spec_path).parent, spec_out.resolve().parent
    data: dict[str, Any] = exp.spec.model_dump(mode="json", exclude_none=True)
    data["grader"].pop("canary", None)  # never reuse a canary: the next run generates its own
    data["harness_repo"] = os.path.relpath(registry, new)
    for task in data["tasks"]:
        # The SHA the pins were made with: a branch or tag may have moved since.
        task["base"] = exp.tasks[task["id"]].base_sha
        location = repo_location(task["repo"], old)
        task["repo"] = os.path.relpath(location, new) if Path(location).is_absolute() else location
        if isinstance(task.get("hidden_tests"), str):
            task["hidden_tests"] = _rebase(task["hidden_tests"], old, new)
        patch = task.get("reference_patch")
        if isinstance(patch, str) and "\n" not in patch.strip():  # a path, as submit reads it
            task["reference_patch"] = _rebase(patch, old, new)
    for name, variant in data["variants"].items():
        kept = {k: v for k, v in variant.items() if k in ("environment", "tasks")}
        data["variants"][name] = {"harness_lock": refs[name], **kept}
    return data


def _frozen(variant: ResolvedVariant, first: TrialRecord | None, registry: Path) -> str:
    """Freeze what ``variant`` ran into ``registry`` (a lock variant: its lock); the lock ref."""
    if first is None:
        lock = load_lock(Path(variant.harness_path).parent, variant.harness_lock)
        return freeze(lock.path, registry).ref
    ran = Path(str(first.manifest.get("harness_path", variant.harness_path)))
    seen = ran_harness_digest(first)
    if not (ran / MANIFEST).is_file():
        raise FreezeError(
            f"variant {variant.name}: the harness trial {first.trial_key} ran ({ran}) is gone; "
            "it lives in the experiment's directory under HANGAR_HOME"
        )
    now = tree_digest(ran)
    if now != seen:
        raise FreezeError(
            f"variant {variant.name}: the harness trial {first.trial_key} ran ({ran}) now "
            f"hashes to sha256:{now}, not sha256:{seen} as its turn 1 saw it; it was "
            "changed afterwards and cannot be frozen as what ran"
        )
    return freeze(ran, registry).ref


def freeze_variants(
    exp: ResolvedExperiment, store: Store, registry: Path, spec_out: Path
) -> dict[str, str]:
    """Freeze each overlay variant of the experiment into ``registry``; write ``spec_out``.

    Each overlay variant becomes the lock its first finished trial ran (the
    harness directory recorded in that trial's manifest); lock variants are
    copied into ``registry`` as they are, so ``spec_out`` (the same spec with
    ``harness_lock`` variants and ``harness_repo`` pointing at ``registry``)
    runs with the same pin sets. Idempotent. Returns variant -> lock ref.
    """
    experiment_id = exp.experiment_id
    overlays = [v for v in exp.variants.values() if v.overlay]
    if not overlays:
        raise FreezeError(
            f"experiment {experiment_id} has no overlay variants: its variants are harness locks "
            "already; run its spec as it is"
        )
    trials = store.trials(experiment_id, all_attempts=True)
    firsts = {v.name: first_finished(trials, v.name) for v in overlays}
    missing = sorted(name for name, t in firsts.items() if t is None)
    if missing:
        raise FreezeError(
            f"experiment {experiment_id}: no finished trial of overlay variant(s) "
            f"{', '.join(missing)}, so there is nothing they ran to freeze; run the experiment "
            f"first (`hangar experiment resume {experiment_id}`)"
        )
    registry = registry.resolve()
    refs: dict[str, str] = {}
    for variant in exp.variants.values():
        try:
            refs[variant.name] = _frozen(variant, firsts.get(variant.name), registry)
        except HarnessError as err:
            raise FreezeError(f"variant {variant.name}: {err}") from None
    data = _locked_spec(exp, refs, registry, spec_out)
    head = (
        f"# Written by `hangar experiment freeze-variants {experiment_id}`: the overlay variants "
        f"({', '.join(v.name for v in overlays)})\n# are harness locks frozen from the harness "
        "their first finished trial ran. No canary: each experiment generates its own.\n"
    )
    write_atomic(spec_out, head + yaml.safe_dump(data, sort_keys=False))
    return refs
