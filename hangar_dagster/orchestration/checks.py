"""Asset checks: an invalid task shows in the UI's Checks tab per partition, flagged trials per run.

- ``<exp>/base_checks`` (by task): ``base_must_fail`` and ``reference_must_pass``,
  blocking, ERROR when they fail. Failing, they fail the base_checks run (Dagster's
  blocking rule) and the eval queue leaves that task's trials out (``queue/starts.py``).
  One result per partition of the run: the stage runs cover a partition range, and
  ``dg.AssetCheckResult`` has no partition, so the results are ``dg.AssetCheckEvaluation``
  events with their partition and the partition's materialization.
- ``<exp>/grades`` (variant x task_rep): one WARN check per signal an eval engineer
  scans for (``grading/verdicts.GRADE_SIGNALS``), never blocking, evaluated **once per run**
  over the run's trials (``run_evaluations``): it fails when any of them raises the signal and
  names those trials. Per partition it was five Dagster events per trial, which cost a
  100-trial regrade more than its grading; each grade's own signals are on its
  materialization's metadata.
- ``<exp>/index``: ``readback``, WARN and never blocking: fails with one line per thing a
  reader of the report could not read (``results/readback.py``), each with its fix. The index
  step evaluates it on the report it has just built and written (``readback_result``): the
  report is built once per run that writes the index, not again in a check step of its own.

Each check reads what its asset stored. The verdicts themselves are
Dagster-free (``grading/verdicts.py``). Jobs that select an asset run its checks
in the same run (``define_asset_job`` includes them), so jobs.py needs nothing.
"""

# No `from __future__ import annotations`: Dagster reads the context annotation as a type.
import inspect
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import dagster as dg

from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.grading.verdicts import (
    GRADE_SIGNALS,
    Verdict,
    base_must_fail,
    reference_must_pass,
)
from hangar_dagster.orchestration.resources import HangarResource
from hangar_dagster.orchestration.stages import partitions, trial_key_of
from hangar_dagster.results.records import BaseCheckRecord
from hangar_dagster.results.report import Report
from hangar_dagster.trials.redact import redact

R = TypeVar("R")

BASE_CHECKS: dict[str, tuple[str, Callable[[BaseCheckRecord], Verdict]]] = {
    "base_must_fail": (
        "The hidden tests must fail on the unpatched base; a task they pass on is invalid "
        "and its trials never start.",
        base_must_fail,
    ),
    "reference_must_pass": (
        "The hidden tests must pass on the task's reference_patch (passed, with a note, "
        "when the task gives none); a task they fail on is invalid.",
        reference_must_pass,
    ),
}


def _target_type() -> Any:
    # The pointer that ties an evaluation to the materialization it checked (without it the UI
    # counts the result as stale) is a documented parameter of dg.AssetCheckEvaluation whose type
    # Dagster 1.13 does not export by name; it is taken from that public signature.
    hint = inspect.signature(dg.AssetCheckEvaluation).parameters["target_materialization_data"]
    return next(t for t in typing.get_args(hint.annotation) if t is not type(None))


TARGET = _target_type()


def latest_materializations(
    instance: dg.DagsterInstance, key: dg.AssetKey, partition_keys: Sequence[str]
) -> dict[str, dg.EventLogRecord]:
    """The newest materialization of each partition (one query when they are this run's)."""
    if not partition_keys:
        return {}
    got: dict[str, dg.EventLogRecord] = {}
    newest = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=list(partition_keys)),
        limit=len(partition_keys),
    )
    for record in newest.records:  # newest first
        if record.partition_key is not None:
            got.setdefault(record.partition_key, record)
    for pk in partition_keys:
        if pk not in got:
            one = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=key, asset_partitions=[pk]), limit=1
            ).records
            if one:
                got[pk] = one[0]
    return got


def evaluations(
    context: dg.AssetCheckExecutionContext,
    asset_key: dg.AssetKey,
    checks: Mapping[str, Callable[[R], Verdict]],
    records: Mapping[str, R],
    severity: dg.AssetCheckSeverity,
    blocking: bool,
    canary: str,
) -> Iterator[dg.AssetCheckEvaluation | dg.Output[None]]:
    """One evaluation per selected check and partition with a record; partitions without one
    are not evaluated (the UI shows them as skipped)."""
    selected = {k.name for k in context.selected_asset_check_keys if k.asset_key == asset_key}
    keys = [pk for pk in context.op_execution_context.partition_keys if pk in records]
    mats = latest_materializations(context.instance, asset_key, keys)
    for name, decide in checks.items():
        if name not in selected:
            continue
        for pk in keys:
            verdict = decide(records[pk])
            mat = mats.get(pk)
            yield dg.AssetCheckEvaluation(
                asset_key=asset_key,
                check_name=name,
                passed=verdict.passed,
                metadata=redact(verdict.metadata, canary),
                target_materialization_data=TARGET(
                    storage_id=mat.storage_id, run_id=mat.run_id, timestamp=mat.timestamp
                )
                if mat is not None
                else None,
                severity=severity,
                description=redact(verdict.description, canary),
                blocking=blocking,
                partition=pk,
            )
        # The check's output: what a blocking check's downstream steps wait for in a run.
        spec = dg.AssetCheckSpec(name, asset=asset_key)
        yield dg.Output(None, output_name=spec.get_python_identifier())


# How many flagged trials a run-level check names in its metadata (the count is always whole).
FLAGGED_SHOWN = 50


def run_evaluations(
    context: dg.AssetCheckExecutionContext,
    asset_key: dg.AssetKey,
    checks: Mapping[str, Callable[[R], Verdict]],
    records: Mapping[str, R],
    canary: str,
) -> Iterator[dg.AssetCheckResult | dg.Output[None]]:
    """One WARN result per selected check for the whole run: failed when any of the run's
    ``records`` (trial key -> record) fails it, naming those trials. A run with no record
    evaluates nothing. Once per run, not per partition: each evaluation is a Dagster event,
    and a hundred partitions' five checks cost more than their grading (docs/performance.md)."""
    for name, decide in checks.items():
        if dg.AssetCheckKey(asset_key, name) not in context.selected_asset_check_keys:
            continue
        if not records:
            yield dg.Output(
                None, output_name=dg.AssetCheckSpec(name, asset=asset_key).get_python_identifier()
            )
            continue
        flagged = {k: v for k, r in records.items() if not (v := decide(r)).passed}
        shown = list(flagged.items())[:FLAGGED_SHOWN]
        listed = "\n".join(f"- `{k}`: {v.description}" for k, v in shown)
        more = len(flagged) - len(shown)
        yield dg.AssetCheckResult(
            asset_key=asset_key,
            check_name=name,
            passed=not flagged,
            severity=dg.AssetCheckSeverity.WARN,
            description=redact(
                f"{len(flagged)} of the run's {len(records)} trial(s): "
                + ", ".join(k for k, _ in shown)
                + (f" and {more} more" if more else "")
                if flagged
                else f"all {len(records)} trial(s) of the run",
                canary,
            ),
            metadata={
                "trials": len(records),
                "flagged": len(flagged),
                "flagged_trials": dg.MetadataValue.md(
                    redact(listed + (f"\n- and {more} more" if more else ""), canary) or "none"
                ),
            },
        )


def build_experiment_checks(
    exp: ResolvedExperiment, assets: Sequence[dg.AssetsDefinition]
) -> list[dg.AssetChecksDefinition]:
    by_name = {a.key.path[-1]: a for a in assets}
    base_key, grades_key = by_name["base_checks"].key, by_name["grades"].key
    _variants, tasks_def, trials_def = partitions(exp)

    @dg.multi_asset_check(
        name=f"{exp.experiment_id}__base_checks_checks",
        specs=[
            dg.AssetCheckSpec(
                name, asset=base_key, description=what, blocking=True, partitions_def=tasks_def
            )
            for name, (what, _decide) in BASE_CHECKS.items()
        ],
        can_subset=True,
    )
    def base_checks_checks(
        context: dg.AssetCheckExecutionContext, hangar: HangarResource
    ) -> Iterator[dg.AssetCheckEvaluation | dg.Output[None]]:
        records = hangar.store().base_checks(exp.experiment_id)
        yield from evaluations(
            context,
            base_key,
            {n: d for n, (_w, d) in BASE_CHECKS.items()},
            records,
            dg.AssetCheckSeverity.ERROR,
            blocking=True,
            canary=exp.canary,
        )

    @dg.multi_asset_check(
        name=f"{exp.experiment_id}__grades_checks",
        specs=[
            dg.AssetCheckSpec(name, asset=grades_key, description=what)
            for name, (what, _decide) in GRADE_SIGNALS.items()
        ],
        can_subset=True,
    )
    def grades_checks(
        context: dg.AssetCheckExecutionContext, hangar: HangarResource
    ) -> Iterator[dg.AssetCheckResult | dg.Output[None]]:
        # The grade of the attempt that counts, as the index picks it, of each key of the run.
        names = {
            trial_key_of(trials_def, pk).key for pk in context.op_execution_context.partition_keys
        }
        records = hangar.store().grades(exp.experiment_id, keys=sorted(names))
        yield from run_evaluations(
            context,
            grades_key,
            {n: d for n, (_w, d) in GRADE_SIGNALS.items()},
            {g.trial_key: g for g in records},
            exp.canary,
        )

    return [base_checks_checks, grades_checks]


def readback_spec(index_key: dg.AssetKey) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec("readback", asset=index_key, description=READBACK, blocking=False)


def readback_result(report: Report, canary: str) -> dg.AssetCheckResult:
    """The ``readback`` check's verdict on the report the index step wrote."""
    lines = list(report.readback)
    return dg.AssetCheckResult(
        check_name="readback",
        passed=not lines,
        severity=dg.AssetCheckSeverity.WARN,
        description=redact("; ".join(lines) if lines else "the report reads clean", canary),
        metadata={
            "lines": len(lines),
            "readback": dg.MetadataValue.md(
                redact("\n".join(f"- {line}" for line in lines), canary) or "clean"
            ),
        },
    )


READBACK = (
    "What a reader of the report could not read, one line each with its fix (no question, no "
    "baseline, a fraction, a missing interval or n, a variant named by a setting, an effect "
    "this n cannot detect, flagged passes in the headline, invalid tasks); warns, never blocks."
)
