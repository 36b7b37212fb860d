"""Stage results as Dagster metadata a person can read: the one place records become metadata.

Booleans stay booleans, run ids are links to their Dagster run, artifact files
are paths, the index's summary is a table, and a field that is absent (None,
or an empty list) is left out rather than shown as an empty string. Strings
are redacted once more here: the UI must not show a key even from a row stored
before redaction.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import dagster as dg

from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.experiment.stage import PinnedVariant
from hangar_dagster.grading.stage import BaseCheckPartition, GradePartition
from hangar_dagster.results.records import ExperimentRecord
from hangar_dagster.results.report import Report, Written, five_lines_markdown, table_rows
from hangar_dagster.results.summary import IndexSummary
from hangar_dagster.trials.redact import redact
from hangar_dagster.trials.stage import TrialPartition

Metadata = dict[str, Any]

# Where the assets' data lives; Dagster shows these as the assets' kind icons (at most three).
KINDS = {"python", "duckdb", "parquet"}
# Dagster's own test for an owner that is an email address (anything else needs "team:").
_EMAIL = re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Z|a-z]{2,7}\b")

SUMMARY_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn("variant", "string"),
        dg.TableColumn("trials", "int", description="trial keys (latest attempt each)"),
        dg.TableColumn("graded", "int", description="counted trials (admissible, not flagged)"),
        dg.TableColumn("passed", "int"),
        dg.TableColumn("pass_rate_pts", "float", description="mean of task pass rates, points"),
    ]
)


# The report's table (results.report.table_rows): every rate in points with its interval and n.
REPORT_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn("variant", "string"),
        dg.TableColumn("changes", "string", description="what it changes, in words (the spec)"),
        dg.TableColumn("pass_rate_pts", "float", description="mean of task pass rates, points"),
        dg.TableColumn("ci_low_pts", "float", description="95% interval, clustered by task"),
        dg.TableColumn("ci_high_pts", "float"),
        dg.TableColumn("tasks", "int", description="tasks the rate rests on"),
        dg.TableColumn("trials", "int", description="counted trials (no flagged passes)"),
        dg.TableColumn("diff_pts", "float", description="minus the baseline, paired by task"),
        dg.TableColumn("diff_ci_low_pts", "float", description="95% interval of the difference"),
        dg.TableColumn("diff_ci_high_pts", "float"),
        dg.TableColumn("p_value", "float", description="exact paired test (sign flip / McNemar)"),
        dg.TableColumn("mde_pts", "float", description="detectable at 80% power at this n"),
        dg.TableColumn("verdict", "string", description="against decide.min_effect_pts"),
        dg.TableColumn("flagged_passes", "int", description="counted apart, not in the rate"),
    ]
)


def owners(exp: ResolvedExperiment) -> list[str]:
    """The spec's author as a Dagster owner: an email as it is, else ``team:<author>``."""
    return [exp.author if _EMAIL.fullmatch(exp.author) else f"team:{exp.author}"]


def _present(metadata: Mapping[str, Any]) -> Metadata:
    """Without absent fields: None, an empty string or an empty list is no row."""
    return {k: v for k, v in metadata.items() if v is not None and v != "" and v != []}


def _joined(values: list[str]) -> str | None:
    return ", ".join(values) or None


def _run(run_id: str | None) -> dg.MetadataValue[Any] | None:
    return dg.MetadataValue.dagster_run(run_id) if run_id else None


def spec_metadata(exp: ResolvedExperiment, record: ExperimentRecord) -> Metadata:
    return _present(
        {
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


def pin_set_metadata(pinned: PinnedVariant) -> Metadata:
    record = pinned.record
    return _present(
        {
            "pin_set": record.pin_set,
            "harness_lock": record.harness_lock,
            "model": record.model,
            "environment_digest": record.environment_digest,
            "grader_digest": record.grader_digest,
            "egress": record.egress,
            "task_bases": dg.MetadataValue.json(record.task_bases),
            "pinned_by": pinned.pinned_by,
        }
    )


def base_check_metadata(part: BaseCheckPartition) -> Metadata:
    c = part.check
    return _present(
        {
            "invalid": c.invalid,
            "reason": c.reason,
            "base_sha": c.base_sha,
            "base_counts": dg.MetadataValue.json(c.base_counts),
            "reference_passed": c.reference_passed,  # absent: the task has no reference patch
            "reference_counts": dg.MetadataValue.json(c.reference_counts)
            if c.reference_counts is not None
            else None,
            "reused": part.reused,
            "checked_in_run": _run(c.run_id),
            "log": dg.MetadataValue.path(str(part.log)),
            # The environment build (absent without one): its digest and seconds to build.
            "build_digest": c.build_digest,
            "build_s": dg.MetadataValue.float(c.build_s) if c.build_s is not None else None,
        }
    )


def _page(page: Path | None) -> dg.MetadataValue[Any] | None:
    return dg.MetadataValue.path(str(page)) if page is not None else None


def partition_url(webserver_url: str | None, asset_key: dg.AssetKey, partition: str) -> str | None:
    """The UI's page of one partition of an asset (None without a known webserver URL)."""
    if not webserver_url:
        return None
    path = "/".join(quote(p, safe="") for p in asset_key.path)
    return f"{webserver_url.rstrip('/')}/assets/{path}?view=partitions&partition={quote(partition, safe='')}"


def trial_metadata(part: TrialPartition, canary: str, page: Path | None = None) -> Metadata:
    if part.skipped is not None:
        return {"skipped": part.skipped}
    if part.record is None:
        return {"started": False, "reason": redact(part.not_started, canary)}
    t = part.record
    metadata = {
        "trial_key": t.trial_key,
        "attempt": t.attempt,
        "retry_of": _run(t.retry_of),
        "run_of_attempt": _run(t.run_id),
        "reused": part.reused,
        # A trial of an earlier experiment standing in for this one (not run, not paid here).
        "reused_from": dg.MetadataValue.json(t.reused_from) if t.reused_from else None,
        "outcome_class": t.outcome_class,
        "infra_reason": t.infra_reason,
        "drift": t.drift,
        "verify_passed": t.verify_passed,  # absent: verify did not run
        "pin_set": t.pin_set,
        "agent": f"{t.agent} (scripted stand-in, no model)" if t.agent_is_standin else t.agent,
        "model": t.model,
        "turns": t.turns,
        "cost_usd": t.cost_usd,  # absent when unknown: the estimate and its basis say why
        "cost_estimate_usd": t.cost_estimate_usd,
        "cost_basis": t.cost_basis,
        "duration_s": round(t.duration_s, 2),
        "patch_bytes": t.patch_bytes,
        "artifacts": dg.MetadataValue.path(t.artifacts_dir),
        # patch, trace, verify output (and, once graded, the grade log and per-test results)
        "evidence": _page(page),
    }
    return _present(redact(metadata, canary))


@dataclass(frozen=True)
class TrialLinks:
    """Where a grade's trial is: its run, its asset (and partition) and its evidence page."""

    run_id: str | None
    asset: dg.AssetKey
    partition: str
    url: str | None = None  # the partition's page in the UI, when the webserver URL is known
    page: Path | None = None


def grade_metadata(part: GradePartition, canary: str, trial: TrialLinks | None = None) -> Metadata:
    if part.grade is None:
        return {"skipped": part.skipped}
    g = part.grade
    links: Metadata = {}
    if trial is not None:
        links = {
            "trial_run": _run(trial.run_id),
            "trial_asset": dg.MetadataValue.asset(trial.asset),
            "trial_partition": trial.partition,
            "trial_materialization": dg.MetadataValue.url(trial.url) if trial.url else None,
            "evidence": _page(trial.page),
        }
    metadata = {
        "trial_key": g.trial_key,
        "attempt": g.attempt,
        "reused": part.reused,
        "passed": g.passed,
        "trust": g.trust,
        "hidden_tests": dg.MetadataValue.json(g.hidden_tests),
        "reason": g.reason,
        "tamper_signals": _joined(g.tamper_signals),
        "touched_tests": _joined(g.touched_tests),
        "contamination": _joined(g.contamination),
        "task_invalid": g.task_invalid,
        "grader_digest": g.grader_digest,
        # a regrade's grade: the one it replaces (that experiment keeps it)
        "regrade_of": dg.MetadataValue.json(g.regrade_of) if g.regrade_of else None,
        "graded_in_run": _run(g.run_id),
        **links,
    }
    return _present(redact(metadata, canary))


def index_metadata(summary: IndexSummary, canary: str) -> Metadata:
    table = dg.MetadataValue.table(
        records=[
            dg.TableRecord({c.name: row.get(c.name) for c in SUMMARY_SCHEMA.columns})
            for row in summary.variants
        ],
        schema=SUMMARY_SCHEMA,
    )
    metadata = {
        "summary": table,
        "trial_keys": summary.trial_keys,
        "pending_trials": summary.pending_trials,
        "waiting_grades": summary.waiting_grades,
        "complete": summary.complete,
        "unfinished": "; ".join(summary.unfinished),
        "waiting_for": summary.waiting_for,
        "queue_notes": "; ".join(summary.queue_notes),
        "graded": summary.graded,
        "passed": summary.passed,
        "invalid_tasks": _joined(summary.invalid_tasks),
        "duckdb": dg.MetadataValue.path(str(summary.duckdb)),
    }
    return _present(redact(metadata, canary))


def _picture(png: Path) -> dg.MetadataValue[Any] | None:
    try:
        data = base64.b64encode(png.read_bytes()).decode()
    except OSError:
        return None
    return dg.MetadataValue.md(
        "![pass rate per variant and the paired difference against the baseline]"
        f"(data:image/png;base64,{data})"
    )


def report_metadata(report: Report, written: Written, canary: str) -> Metadata:
    """The report on the index: its table, the five lines per variant as markdown, the
    readback, and the files (the picture is figure.png; report.html opens from disk)."""
    table = dg.MetadataValue.table(
        records=[dg.TableRecord(row) for row in table_rows(report)], schema=REPORT_SCHEMA
    )
    lines = "\n\n".join(
        f"### {v.name}{' (baseline)' if v.is_baseline else ''}\n\n{five_lines_markdown(v)}"
        for v in report.variants
    )
    question = "\n".join(
        f"**{k}:** {v}"
        for k, v in (
            ("Question", report.question),
            ("Hypothesis", report.hypothesis),
            ("Decision rule", f"{report.min_effect_pts:g} pts" if report.min_effect_pts else None),
        )
        if v
    )
    metadata = {
        "report": table,
        "five_lines": dg.MetadataValue.md(f"{question}\n\n{lines}" if question else lines),
        "readback": dg.MetadataValue.md("\n".join(f"- {line}" for line in report.readback))
        if report.readback
        else None,
        "report_html": dg.MetadataValue.path(str(written.html)),
        "figure": dg.MetadataValue.path(str(written.figure)),
        # The picture itself: the UI renders markdown images, and a data URI needs no server.
        "picture": _picture(written.figure),
    }
    return _present(redact(metadata, canary))
