"""The asset factory: one resolved experiment becomes one asset group.

    spec -> pin_sets (by variant) --------------\\
        \\-> base_checks (by task) -> trials (variant x task_rep) -> grades -> index

The factory only declares: each asset translates its partition keys into
typed keys, calls its stage body (a plain function in the room it belongs to:
``experiment.stage``, ``grading.stage``, ``trials.stage``,
``results.summary``) and turns the typed result into metadata
(``orchestration.metadata``).

Trials and grades are multi-partitioned (variant x task_rep, e.g. ``fix-a.r2``)
and materialize many partitions in one run (single-run backfill policy):
trials of one experiment share one Dagster run and run concurrently up to the
spec's ``parallel`` in threads, so orchestration costs about one run per
stage, not one per trial (docs/performance.md). Each finished trial is stored
the moment it finishes; the attempt is a new materialization of the same
partition, with ``attempt`` in its metadata. The variants' pin sets are the
code version of the pin-set, trial and grade assets (docs/architecture.md).
"""

import datetime as dt
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import dagster as dg

from hangar_dagster.experiment.plan import ResolvedExperiment, TrialKey
from hangar_dagster.experiment.stage import StageRefused, check_spec, pin_variants, pins_version
from hangar_dagster.grading.stage import run_base_checks, run_grades
from hangar_dagster.orchestration import metadata as md
from hangar_dagster.orchestration.checks import readback_result, readback_spec
from hangar_dagster.orchestration.resources import HangarResource
from hangar_dagster.orchestration.stages import (
    EVAL_POOL,
    partition_key_of,
    partitions,
    trial_key_of,
)
from hangar_dagster.queue.restarts import StartedMarker
from hangar_dagster.results.records import GradeRecord, GradeTestRecord
from hangar_dagster.results.report import build_report, report_dir, write_report
from hangar_dagster.results.report_trials import Evidence, page_path, write_trial_page
from hangar_dagster.results.summary import summarize, write_terminal
from hangar_dagster.trials.stage import run_trials

T = TypeVar("T")


def _refusal_as_failure(body: Callable[[], T]) -> T:
    try:
        return body()
    except StageRefused as err:
        raise dg.Failure(str(err)) from err


def _report(context: dg.AssetExecutionContext, metadata: Iterable[tuple[str, md.Metadata]]) -> None:
    """Each partition's metadata onto its materialization (emitted when the step ends)."""
    for partition_key, values in metadata:
        context.add_asset_metadata(values, partition_key=partition_key)


def _newer(path: Path, than: dt.datetime) -> bool:
    """``path`` exists and was written at or after ``than``."""
    try:
        return path.stat().st_mtime >= than.timestamp()
    except FileNotFoundError:
        return False


def build_experiment_assets(exp: ResolvedExperiment) -> list[dg.AssetsDefinition]:
    prefix = exp.experiment_id
    variants_def, tasks_def, trials_def = partitions(exp)
    group = exp.experiment_id
    tags = {"hangar/experiment_name": exp.name}
    owners = md.owners(exp)
    pins = pins_version(exp)  # the code version of what the pins produce
    single_run = dg.BackfillPolicy.single_run()

    @dg.asset(
        key=[prefix, "spec"],
        description=f"The resolved spec of {exp.name} ({exp.spec_path}).",
        group_name=group,
        tags=tags,
        kinds=md.KINDS,
        owners=owners,
    )
    def spec(context: dg.AssetExecutionContext, hangar: HangarResource) -> dg.MaterializeResult:  # type: ignore[type-arg]
        record = _refusal_as_failure(lambda: check_spec(exp, hangar.store(), hangar.settings()))
        return dg.MaterializeResult(metadata=md.spec_metadata(exp, record))

    @dg.asset(
        key=[prefix, "pin_sets"],
        deps=[spec],
        partitions_def=variants_def,
        backfill_policy=single_run,
        description="Content-addressed pin set per variant (pin-<hash>), never overwritten.",
        group_name=group,
        tags=tags,
        kinds=md.KINDS,
        owners=owners,
        code_version=pins,
    )
    def pin_sets(context: dg.AssetExecutionContext, hangar: HangarResource) -> None:
        pinned = _refusal_as_failure(
            lambda: pin_variants(
                exp,
                hangar.store(),
                context.run.run_id,
                context.partition_keys,
                aliases=hangar.settings().model_aliases,
            )
        )
        _report(context, ((p.variant, md.pin_set_metadata(p)) for p in pinned))

    @dg.asset(
        key=[prefix, "base_checks"],
        deps=[spec],
        partitions_def=tasks_def,
        backfill_policy=single_run,
        code_version=exp.grader_digest,
        description="Hidden tests must fail on the base (and pass on reference_patch); once per task per experiment.",
        group_name=group,
        tags=tags,
        kinds=md.KINDS,
        owners=owners,
    )
    def base_checks(context: dg.AssetExecutionContext, hangar: HangarResource) -> None:
        checked = run_base_checks(
            exp,
            hangar.store(),
            hangar.paths,
            context.run.run_id,
            context.partition_keys,
            context.log,
            hangar.settings(),
        )
        _report(context, ((t, md.base_check_metadata(part)) for t, part in checked.items()))

    @dg.asset(
        key=[prefix, "trials"],
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
        pool=EVAL_POOL,  # the cluster's eval share, enforced by the instance (docs/queue.md)
        group_name=group,
        tags=tags,
        kinds=md.KINDS,
        owners=owners,
        code_version=pins,
    )
    def trials(context: dg.AssetExecutionContext, hangar: HangarResource) -> None:
        def in_flight(marker: StartedMarker) -> bool:
            # A killed in-process run stays STARTED in Dagster: its process decides then.
            run = context.instance.get_run_by_id(marker.run_id)
            return run is not None and not run.is_finished and marker.process_alive()

        ran = run_trials(
            exp,
            hangar.store(),
            hangar.settings(),  # once per run: every trial of it runs under the same settings
            context.run.run_id,
            _trial_keys(context),
            in_flight=in_flight,
            log=context.log,
        )
        done = {k: p.record for k, p in ran.items() if p.record is not None}
        # A trial already graded (in its slot, or earlier) gets its page, with the grade, from
        # this run's grades step: written here as well, each page was written twice in the run's
        # tail, while the slots wait for the next run (docs/architecture.md, "Runs over pending
        # work"). The link is the same path.
        graded = {
            (g.trial_key, g.attempt)
            for g in hangar.store().grades(exp.experiment_id, keys=[k.key for k in done])
        }
        pages = {
            k: page_path(hangar.paths, exp.experiment_id, k.key)
            if (t.trial_key, t.attempt) in graded
            else write_trial_page(
                page_path(hangar.paths, exp.experiment_id, k.key),
                f"{exp.name} ({exp.experiment_id})",
                Evidence(t, None, ()),
                exp.canary,
            )
            for k, t in done.items()
        }
        _report(
            context,
            (
                (partition_key_of(k), md.trial_metadata(p, exp.canary, pages.get(k)))
                for k, p in ran.items()
            ),
        )

    @dg.asset(
        key=[prefix, "grades"],
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
        group_name=group,
        tags=tags,
        kinds=md.KINDS,
        owners=owners,
        code_version=pins,
    )
    def grades(context: dg.AssetExecutionContext, hangar: HangarResource) -> None:
        graded = run_grades(
            exp,
            hangar.store(),
            hangar.paths,
            context.run.run_id,
            _trial_keys(context),
            hangar.settings(),
        )
        store = hangar.store()
        names = [k.key for k in graded]  # the run's own keys, not the experiment's
        latest = {t.trial_key: t for t in store.trials(exp.experiment_id, keys=names)}
        # One read of the run's tests, not one per key (a query per partition cost seconds).
        tests_of: dict[tuple[str, int], list[GradeTestRecord]] = {}
        for t in store.grade_tests(exp.experiment_id, keys=names):
            tests_of.setdefault((t.trial_key, t.attempt), []).append(t)
        url = hangar.settings().webserver_url

        def links(k: TrialKey, g: GradeRecord) -> md.TrialLinks | None:
            trial = latest.get(k.key)
            if trial is None or trial.attempt != g.attempt:
                return None
            tests = tuple(tests_of.get((k.key, g.attempt), ()))
            page = page_path(hangar.paths, exp.experiment_id, k.key)
            # A grade of an earlier run has its page from that run's grades step, unless the
            # page is older than the grade (that run stopped between the grade and the step):
            # a relaunch writes the pages of what it graded, not of its whole range.
            if g.run_id == context.run.run_id or not _newer(page, g.graded_at):
                write_trial_page(
                    page, f"{exp.name} ({exp.experiment_id})", Evidence(trial, g, tests), exp.canary
                )
            pk = partition_key_of(k)
            return md.TrialLinks(
                trial.run_id, trials.key, pk, md.partition_url(url, trials.key, pk), page
            )

        _report(
            context,
            (
                (
                    partition_key_of(k),
                    md.grade_metadata(
                        p, exp.canary, links(k, p.grade) if p.grade is not None else None
                    ),
                )
                for k, p in graded.items()
            ),
        )

    @dg.asset(
        key=[prefix, "index"],
        deps=[grades],
        description="Per trial key the highest attempt with its grade; per variant the pass rate "
        "with its interval, the five lines and the report (report.html, figure.png).",
        check_specs=[readback_spec(dg.AssetKey([prefix, "index"]))],
        group_name=group,
        tags=tags,
        kinds=md.KINDS,
        owners=owners,
    )
    def index(context: dg.AssetExecutionContext, hangar: HangarResource) -> dg.MaterializeResult:  # type: ignore[type-arg]
        store = hangar.store()
        summary = summarize(exp, store, hangar.settings(), dt.datetime.now(dt.UTC))
        report = build_report(exp, store)
        out = report_dir(hangar.paths, exp.experiment_id)
        written = write_report(report, out, exp.canary)
        write_terminal(out, context.run.run_id, report, summary)
        return dg.MaterializeResult(
            metadata=md.index_metadata(summary, exp.canary)
            | md.report_metadata(report, written, exp.canary),
            check_results=[readback_result(report, exp.canary)],
        )

    def _trial_keys(context: dg.AssetExecutionContext) -> list[TrialKey]:
        return [trial_key_of(trials_def, pk) for pk in context.partition_keys]

    return [spec, pin_sets, base_checks, trials, grades, index]
