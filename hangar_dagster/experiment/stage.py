"""The spec and pin-set stages, without Dagster.

``check_spec`` re-checks at run time what submit checked (an alias declared
since, e.g. in ``HANGAR_MODEL_ALIASES``, counts) and writes the reused trials a crash
at submit left unwritten; ``pin_variants`` re-verifies
each variant's harness lock and stores its content-addressed pin set. Both
raise ``StageRefused`` when the experiment may not go on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hangar_dagster.experiment.harness import load_lock
from hangar_dagster.experiment.model_policy import ModelCatalog
from hangar_dagster.experiment.pins import lock_pin_content, pin_set_record
from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.experiment.reuse import materialize as materialize_reuse
from hangar_dagster.experiment.spec import Problem
from hangar_dagster.results.records import (
    ExperimentPinRecord,
    ExperimentRecord,
    NoteRecord,
    PinSetRecord,
)
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings


class StageRefused(RuntimeError):
    """The experiment may not go on; the message says why and what to do."""


def check_spec(exp: ResolvedExperiment, store: Store, settings: Settings) -> ExperimentRecord:
    """The stored experiment, once its variants' models are allowed again now."""
    record = store.experiment(exp.experiment_id)
    if record is None:
        raise StageRefused(f"experiment {exp.experiment_id} was never submitted")
    catalog = ModelCatalog.of(settings)  # an alias declared since submit counts now
    refused = [
        str(Problem(path=f"variants.{v.name}.harness_lock", message=r.message, fix=r.fix))
        for v in exp.variants.values()
        if (r := catalog.refusal(v.model, v.adapter))
    ]
    if refused:
        message = "the experiment may not start: " + "; ".join(refused)
        store.put(NoteRecord(experiment_id=exp.experiment_id, kind="model", message=message))
        raise StageRefused(message)
    materialize_reuse(exp, store, settings.paths)  # the reused trials a crash at submit cut off
    return record


@dataclass(frozen=True)
class PinnedVariant:
    variant: str
    record: PinSetRecord
    pinned_by: str  # "submit", or the overlay variant's first finished trial


def pin_variants(
    exp: ResolvedExperiment,
    store: Store,
    run_id: str,
    variants: Iterable[str],
    *,
    aliases: frozenset[str],
) -> list[PinnedVariant]:
    """Store the pin set of each variant in ``variants``, recomputed from its lock now."""
    out = []
    for name in variants:
        variant = exp.variants[name]
        # Re-verify the lock now: a registry edited since submit must not run.
        lock = load_lock(Path(variant.harness_path).parent, variant.harness_lock)
        record = pin_set_record(
            lock_pin_content(
                lock,
                variant.environment,
                model=variant.model,  # the policy resolved at submit, not the lock's name
                model_concrete_basis=variant.model_concrete_basis,
                task_bases={t: exp.tasks[t].base_sha for t in variant.tasks},
                grader_digest=exp.grader_digest,
                aliases=aliases,
                task_build={t: exp.tasks[t].build for t in variant.tasks},
            )
        )
        if record.pin_set != variant.pin_set:
            raise StageRefused(
                f"variant {name}: pins moved since submit ({variant.pin_set} -> {record.pin_set})"
            )
        store.put(record)
        # An overlay variant is linked to its pin set by its first finished trial (overlay.py).
        if not variant.overlay and name not in store.pins(exp.experiment_id):
            store.put(
                ExperimentPinRecord(
                    experiment_id=exp.experiment_id,
                    variant=name,
                    pin_set=record.pin_set,
                    run_id=run_id,
                )
            )
        pinned_by = "its first finished trial (overlay variant)" if variant.overlay else "submit"
        out.append(PinnedVariant(name, record, pinned_by))
    return out


def pins_version(exp: ResolvedExperiment) -> str:
    """The variants' pin sets as one string (``plain=pin-...,skill=pin-...``): what the
    pin-set, trial and grade assets carry as their Dagster code version."""
    return ",".join(f"{name}={v.pin_set}" for name, v in sorted(exp.variants.items()))
