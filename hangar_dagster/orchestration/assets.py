"""The asset factory: one resolved experiment becomes one asset group.

    spec -> pin_sets (by variant) --------------\\
        \\-> base_checks (by task) -> trials (variant x task_rep) -> grades -> index

Trials and grades are multi-partitioned (variant x task_rep, e.g. ``fix-a.r2``)
and materialize many partitions in one run (single-run backfill policy):
trials of one experiment share one Dagster run and run concurrently up to the
spec's ``parallel`` in threads, so orchestration costs about one run per
stage, not one per trial (docs/performance.md). Each finished trial is stored
the moment it finishes; the attempt is a new materialization of the same
partition, with ``attempt`` in its metadata.
"""

import datetime as dt
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, TypeVar

import dagster as dg

from hangar_dagster.experiment.harness import load_lock
from hangar_dagster.experiment.model_policy import ModelCatalog
from hangar_dagster.experiment.overlay import record_pins as record_overlay_pins
from hangar_dagster.experiment.pins import lock_pin_content, pin_set_record
from hangar_dagster.experiment.plan import ResolvedExperiment, TrialKey
from hangar_dagster.experiment.spec import Problem
from hangar_dagster.grading.grader import check_base, contamination_notes, grade_trial
from hangar_dagster.orchestration.resources import HangarResource
from hangar_dagster.queue.drain import DrainWatcher, drain_marker
from hangar_dagster.queue.restarts import StartedMarker, close_interrupted
from hangar_dagster.queue.starts import (
    TokenThrottle,
    blocker,
    pending,
    record_queue_notes,
    waiting_reason,
)
from hangar_dagster.results.records import ExperimentPinRecord, GradeRecord, NoteRecord, TrialRecord
from hangar_dagster.results.store import DuplicateRecordError
from hangar_dagster.trials.redact import redact
from hangar_dagster.trials.trial import RAW_PATCH, TrialRequest, run_trial

STAGES = ("spec", "pin_sets", "base_checks", "trials", "index")
TAG_EXPERIMENT = "hangar/experiment"
TAG_STAGE = "hangar/stage"

T = TypeVar("T")
R = TypeVar("R")


def job_name(exp: ResolvedExperiment, stage: str) -> str:
    return f"{exp.experiment_id}__{stage}_job"


def partitions(
    exp: ResolvedExperiment,
) -> tuple[
    dg.StaticPartitionsDefinition, dg.StaticPartitionsDefinition, dg.MultiPartitionsDefinition
]:
    variants = dg.StaticPartitionsDefinition(list(exp.variants))
    tasks = dg.StaticPartitionsDefinition(list(exp.tasks))
    task_reps = dg.StaticPartitionsDefinition(
        [f"{t}.r{r}" for t in exp.tasks for r in range(1, exp.spec.trials + 1)]
    )
    return (
        variants,
        tasks,
        dg.MultiPartitionsDefinition({"variant": variants, "task_rep": task_reps}),
    )


def trial_key_of(trials_def: dg.MultiPartitionsDefinition, partition_key: str) -> TrialKey:
    dims = trials_def.get_partition_key_from_str(partition_key).keys_by_dimension
    return TrialKey.from_partition(dims["variant"], dims["task_rep"])


def _concurrently(items: Iterable[T], fn: Callable[[T], R], workers: int) -> Iterable[tuple[T, R]]:
    """Yield (item, result) as each finishes; results are handled on the caller's thread."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {pool.submit(fn, item): item for item in items}
        for fut in as_completed(futures):
            yield futures[fut], fut.result()


def _trial_metadata(t: TrialRecord, reused: bool, canary: str) -> dict[str, Any]:
    # Redacted again here: the UI must not show a key even from a row stored before redaction.
    metadata: dict[str, Any] = {
        "trial_key": t.trial_key,
        "attempt": t.attempt,
        "retry_of": t.retry_of or "",
        "run_of_attempt": t.run_id,
        "reused": reused,
        "outcome_class": t.outcome_class,
        "infra_reason": t.infra_reason or "",
        "drift": t.drift or "",
        "verify_passed": str(t.verify_passed),
        "pin_set": t.pin_set,
        "agent": f"{t.agent} (scripted stand-in, no model)" if t.agent_is_standin else t.agent,
        "model": t.model,
        "turns": t.turns,
        "cost_usd": t.cost_usd,
        "duration_s": round(t.duration_s, 2),
        "patch_bytes": t.patch_bytes,
        "artifacts": dg.MetadataValue.path(t.artifacts_dir),
    }
    return dict(redact(metadata, canary))


def _grade_metadata(g: GradeRecord, reused: bool, canary: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "trial_key": g.trial_key,
        "attempt": g.attempt,
        "reused": reused,
        "passed": g.passed,
        "trust": g.trust,
        "hidden_tests": dg.MetadataValue.json(g.hidden_tests),
        "reason": g.reason or "",
        "tamper_signals": ", ".join(g.tamper_signals),
        "touched_tests": ", ".join(g.touched_tests),
        "contamination": ", ".join(g.contamination),
        "task_invalid": g.task_invalid,
    }
    return dict(redact(metadata, canary))


def build_experiment_assets(exp: ResolvedExperiment) -> list[dg.AssetsDefinition]:
    prefix = exp.experiment_id
    group = exp.experiment_id
    variants_def, tasks_def, trials_def = partitions(exp)
    single_run = dg.BackfillPolicy.single_run()
    tags = {"hangar/experiment_name": exp.name}

    @dg.asset(
        key=[prefix, "spec"],
        group_name=group,
        tags=tags,
        description=f"The resolved spec of {exp.name} ({exp.spec_path}).",
    )
    def spec(context: dg.AssetExecutionContext, hangar: HangarResource) -> dg.MaterializeResult:  # type: ignore[type-arg]
        record = hangar.store().experiment(exp.experiment_id)
        if record is None:
            raise dg.Failure(f"experiment {exp.experiment_id} was never submitted")
        # Refused at submit, and again now: an alias declared since (HANGAR_MODEL_ALIASES) counts.
        catalog = ModelCatalog.of(hangar.settings())
        refused = [
            str(Problem(path=f"variants.{v.name}.harness_lock", message=r.message, fix=r.fix))
            for v in exp.variants.values()
            if (r := catalog.refusal(v.model, v.adapter))
        ]
        if refused:
            message = "the experiment may not start: " + "; ".join(refused)
            hangar.store().put(
                NoteRecord(experiment_id=exp.experiment_id, kind="model", message=message)
            )
            raise dg.Failure(message)
        return dg.MaterializeResult(
            metadata={
                "name": exp.name,
                "author": exp.author,
                "spec_path": dg.MetadataValue.path(exp.spec_path),
                "spec_digest": record.spec_digest,
                "variants": ", ".join(exp.variants),
                "tasks": ", ".join(exp.tasks),
                "trials_planned": record.trials_planned,
                "parallel": exp.spec.parallel,
            }
        )

    @dg.asset(
        key=[prefix, "pin_sets"],
        group_name=group,
        tags=tags,
        deps=[spec],
        partitions_def=variants_def,
        backfill_policy=single_run,
        description="Content-addressed pin set per variant (pin-<hash>), never overwritten.",
    )
    def pin_sets(context: dg.AssetExecutionContext, hangar: HangarResource) -> None:
        store = hangar.store()
        aliases = hangar.settings().model_aliases
        for name in context.partition_keys:
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
                )
            )
            if record.pin_set != variant.pin_set:
                raise dg.Failure(
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
                        run_id=context.run_id,
                    )
                )
            context.add_asset_metadata(
                {
                    "pin_set": record.pin_set,
                    "harness_lock": record.harness_lock,
                    "model": record.model,
                    "environment_digest": record.environment_digest,
                    "grader_digest": record.grader_digest,
                    "egress": record.egress,
                    "task_bases": dg.MetadataValue.json(record.task_bases),
                    "pinned_by": "its first finished trial (overlay variant)"
                    if variant.overlay
                    else "submit",
                },
                partition_key=name,
            )

    @dg.asset(
        key=[prefix, "base_checks"],
        group_name=group,
        tags=tags,
        deps=[spec],
        partitions_def=tasks_def,
        backfill_policy=single_run,
        description="Hidden tests must fail on the base (and pass on reference_patch); once per task per experiment.",
    )
    def base_checks(context: dg.AssetExecutionContext, hangar: HangarResource) -> None:
        store = hangar.store()
        done = store.base_checks(exp.experiment_id)
        todo = [t for t in context.partition_keys if t not in done]
        for task, check in _concurrently(
            todo, lambda t: check_base(exp, t, context.run_id, hangar.paths), exp.spec.parallel
        ):
            store.put(check)
            done[task] = check
        for task in context.partition_keys:
            c = done[task]
            if c.invalid:
                context.log.warning(f"task {task} is invalid: {c.reason}")
            context.add_asset_metadata(
                {
                    "invalid": c.invalid,
                    "reason": c.reason or "",
                    "base_sha": c.base_sha,
                    "base_counts": dg.MetadataValue.json(c.base_counts),
                    "reference_passed": str(c.reference_passed),
                    "checked_in_run": c.run_id,
                },
                partition_key=task,
            )

    @dg.asset(
        key=[prefix, "trials"],
        group_name=group,
        tags=tags,
        partitions_def=trials_def,
        backfill_policy=single_run,
        ins={
            "pins": dg.AssetIn(
                key=pin_sets.key,
                dagster_type=dg.Nothing,
                partition_mapping=dg.MultiToSingleDimensionPartitionMapping(
                    partition_dimension_name="variant"
                ),
            ),
            "checks": dg.AssetIn(
                key=base_checks.key,
                dagster_type=dg.Nothing,
                partition_mapping=dg.AllPartitionMapping(),
            ),
        },
        description="One agent run per partition, in a sandbox on a clone at the pinned base.",
    )
    def trials(context: dg.AssetExecutionContext, hangar: HangarResource) -> None:
        store = hangar.store()
        settings = hangar.settings()  # once per run: every trial of it runs under the same
        window = settings.window

        def still_running(marker: StartedMarker) -> bool:
            # A killed in-process run stays STARTED in Dagster: its process decides then.
            run = context.instance.get_run_by_id(marker.run_id)
            return run is not None and not run.is_finished and marker.process_alive()

        for cut in close_interrupted(exp, store, settings, context.run_id, still_running):
            context.log.warning(f"trial {cut.trial_key} attempt {cut.attempt}: {cut.error}")
        work = pending(exp, store, settings)
        for note in record_queue_notes(exp, store, settings):
            context.log.warning(note.message)
        todo = {k.key for k in work.keys}
        latest = {t.trial_key: t for t in store.trials(exp.experiment_id)}
        run: list[TrialKey] = []
        for pk in context.partition_keys:
            key = trial_key_of(trials_def, pk)
            prior = latest.get(key.key)
            if key.task not in exp.variants[key.variant].tasks:
                context.add_asset_metadata(
                    {"skipped": "task not in this variant"}, partition_key=pk
                )
            elif key.key in todo:
                run.append(key)
            elif prior is not None:
                # A finished attempt is kept (a resumed run loses and repeats nothing); an
                # infra error the retry rules refuse stays as it is (see the notes).
                context.add_asset_metadata(
                    _trial_metadata(prior, reused=True, canary=exp.canary), partition_key=pk
                )
        for said in record_overlay_pins(exp, store, context.run_id):  # a crash may have left one
            context.log.info(said)
        throttle = TokenThrottle(store.tokens_finished_since, settings.tpm_budget)

        def drain_reason(now: dt.datetime) -> str | None:
            if drain_marker(hangar.paths, context.run_id).exists():
                return "power_down: drain requested"
            return (
                None
                if window.is_open(now)
                else f"power_down: the eval window {window.describe()} closed"
            )

        with DrainWatcher(drain_reason) as watcher:

            def one(key: TrialKey) -> TrialRecord | str:
                throttle.wait(cancelled=watcher.cancel.is_set)
                why = watcher.why or blocker(exp, store, settings, dt.datetime.now(dt.UTC))
                if why:
                    return why  # not started; a later run picks it up
                retry = work.retries.get(key.key)
                request = TrialRequest(
                    experiment=exp,
                    key=key,
                    attempt=retry.attempt
                    if retry
                    else store.next_attempt(exp.experiment_id, key.key),
                    retry_of=retry.retry_of if retry else None,
                    run_id=context.run_id,
                    cancel=watcher.trial_cancel(),
                )
                record, _patch = run_trial(request, settings)
                try:
                    store.put(record)  # stored the moment it finishes: a crash later loses nothing
                except DuplicateRecordError:
                    return "another run stored this attempt first"  # two runs raced: one counts
                return record

            for key, result in _concurrently(run, one, exp.spec.parallel):
                pk = dg.MultiPartitionKey({"variant": key.variant, "task_rep": key.task_rep})
                if isinstance(result, str):
                    context.log.info(f"trial {key.key} not started: {result}")
                    context.add_asset_metadata(
                        {"started": False, "reason": result}, partition_key=pk
                    )
                    continue
                context.log.info(
                    f"trial {key.key} attempt {result.attempt}: {result.outcome_class}"
                    f"{' / ' + result.infra_reason if result.infra_reason else ''} ({result.duration_s:.1f}s)"
                )
                context.add_asset_metadata(
                    _trial_metadata(result, reused=False, canary=exp.canary), partition_key=pk
                )
                for said in record_overlay_pins(exp, store, context.run_id):
                    context.log.info(said)
        for note in record_queue_notes(exp, store, settings):  # what this run's failures led to
            context.log.warning(note.message)

    @dg.asset(
        key=[prefix, "grades"],
        group_name=group,
        tags=tags,
        partitions_def=trials_def,
        backfill_policy=single_run,
        ins={
            "trial": dg.AssetIn(key=trials.key, dagster_type=dg.Nothing),
            "checks": dg.AssetIn(
                key=base_checks.key,
                dagster_type=dg.Nothing,
                partition_mapping=dg.AllPartitionMapping(),
            ),
        },
        description="The sealed grader's verdict on each trial's patch (hidden tests).",
    )
    def grades(context: dg.AssetExecutionContext, hangar: HangarResource) -> None:
        store = hangar.store()
        latest = {t.trial_key: t for t in store.trials(exp.experiment_id)}
        graded = {
            (g.trial_key, g.attempt): g for g in store.grades(exp.experiment_id, all_attempts=True)
        }
        checks = store.base_checks(exp.experiment_id)
        todo: list[tuple[Any, TrialRecord]] = []
        for pk in context.partition_keys:
            key = trial_key_of(trials_def, pk)
            trial = latest.get(key.key)
            if trial is None:
                context.add_asset_metadata({"skipped": "no trial"}, partition_key=pk)
            elif (trial.trial_key, trial.attempt) in graded:
                context.add_asset_metadata(
                    _grade_metadata(
                        graded[(trial.trial_key, trial.attempt)], reused=True, canary=exp.canary
                    ),
                    partition_key=pk,
                )
            else:
                todo.append((pk, trial))

        def one(item: tuple[Any, TrialRecord]) -> GradeRecord:
            _pk, trial = item
            patch = (Path(trial.artifacts_dir) / RAW_PATCH).read_text()
            grade = grade_trial(
                exp, trial, patch, checks.get(trial.task), context.run_id, hangar.paths
            )
            store.put(grade)
            for note in contamination_notes(grade):  # the experiment note and the audit entry
                store.put(note)
            return grade

        for (pk, _trial), grade in _concurrently(todo, one, exp.spec.parallel):
            context.add_asset_metadata(
                _grade_metadata(grade, reused=False, canary=exp.canary), partition_key=pk
            )

    @dg.asset(
        key=[prefix, "index"],
        group_name=group,
        tags=tags,
        deps=[grades],
        description="Per trial key the highest attempt with its grade; per variant the pass rate.",
    )
    def index(context: dg.AssetExecutionContext, hangar: HangarResource) -> dg.MaterializeResult:  # type: ignore[type-arg]
        store = hangar.store()
        summary = store.summary(exp.experiment_id)
        rows = store.index(exp.experiment_id)
        table = ["| variant | trials | passed | pass rate (pts) |", "|---|---|---|---|"]
        table += [
            f"| {s['variant']} | {s['trials']} | {s['passed']} | {s['pass_rate_pts']} |"
            for s in summary
        ]
        settings = hangar.settings()
        work = pending(exp, store, settings)
        # Why trials are still missing, if they are: the window, a spent budget, the breaker.
        why = waiting_reason(exp, store, settings, dt.datetime.now(dt.UTC)) if work else None
        return dg.MaterializeResult(
            metadata={
                "summary": dg.MetadataValue.md("\n".join(table)),
                "trial_keys": len(rows),
                "pending_trials": len(work.keys),
                "waiting_for": why or "",
                "queue_notes": "; ".join(work.notes),
                "graded": sum(int(s["graded"]) for s in summary),
                "passed": sum(int(s["passed"]) for s in summary),
                "invalid_tasks": ", ".join(
                    t for t, c in store.base_checks(exp.experiment_id).items() if c.invalid
                ),
                "duckdb": dg.MetadataValue.path(str(hangar.paths.duckdb)),
            }
        )

    return [spec, pin_sets, base_checks, trials, grades, index]
