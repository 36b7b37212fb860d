"""Pin sets: the content-addressed record of everything a variant's trials run with.

``pin-<hash>`` is a hash over the harness lock and its digest, the environment
digest, the concrete model, every task's base SHA, the grader digest, the
egress policy, and the two halves a trial's drift is checked against: the
turn-1 fingerprint the lock must report and the environment's fields
(``drift.harness_fingerprint`` / ``drift.environment_pins``). Same inputs,
same id; any change, a new id. The store refuses
to overwrite a stored pin set with other content.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hangar_dagster.environment.build import build_definition
from hangar_dagster.experiment.drift import environment_pins, harness_fingerprint
from hangar_dagster.experiment.harness import HarnessLock
from hangar_dagster.experiment.model_policy import floating_reason
from hangar_dagster.experiment.spec import Environment
from hangar_dagster.results.records import PinSetRecord, utcnow
from hangar_dagster.util.digests import sha256_json


def environment_digest(
    environment: Environment, task_build: Mapping[str, Sequence[str]] | None = None
) -> str:
    """The environment's digest; with a build (environment.build or a task's ``build``), the
    build's definition too (``build.build_definition``), so a changed build is a new pin set.
    Without one, the digest is what it always was."""
    content: dict[str, Any] = environment.model_dump(mode="json")
    if (build := build_definition(environment, task_build or {})) is not None:
        content = {"environment": content, "build": build}
    return "sha256:" + sha256_json(content)


def pin_content(
    *,
    harness_lock: str,
    harness_digest: str,
    environment_digest: str,
    model: str,
    task_bases: dict[str, str],
    grader_digest: str,
    egress: str,
    aliases: frozenset[str],  # Settings.model_aliases: whether the model counts as concrete
    model_concrete_basis: str | None = None,
    harness_fingerprint: dict[str, Any] | None = None,
    environment: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "harness_lock": harness_lock,
        "harness_digest": harness_digest,
        "environment_digest": environment_digest,
        "model": model,
        "model_concrete": floating_reason(model, aliases) is None,
        "model_concrete_basis": model_concrete_basis,
        "task_bases": dict(sorted(task_bases.items())),
        "grader_digest": grader_digest,
        "egress": egress,
        "harness_fingerprint": harness_fingerprint or {},
        "environment": environment or {},
    }


def lock_pin_content(
    lock: HarnessLock,
    environment: Environment,
    *,
    model: str,
    model_concrete_basis: str | None,
    task_bases: dict[str, str],
    grader_digest: str,
    aliases: frozenset[str],
    task_build: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """A variant's pins from its verified lock and environment (submit and the pin_sets asset);
    ``task_build``: the variant's tasks' own build steps."""
    return pin_content(
        harness_lock=lock.ref,
        harness_digest=lock.digest,
        environment_digest=environment_digest(environment, task_build),
        model=model,
        task_bases=task_bases,
        grader_digest=grader_digest,
        egress=environment.egress.mode,
        aliases=aliases,
        model_concrete_basis=model_concrete_basis,
        harness_fingerprint=harness_fingerprint(lock, model),
        environment=environment_pins(environment),
    )


def pin_set_id(content: dict[str, Any]) -> str:
    return "pin-" + sha256_json(content)[:20]


def pin_set_record(content: dict[str, Any]) -> PinSetRecord:
    return PinSetRecord(pin_set=pin_set_id(content), created_at=utcnow(), **content)
