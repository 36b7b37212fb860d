"""Export one experiment as files: index.json plus every trial attempt's manifest and trace,
and, given its report, report.md, report.html, figure.png and report.json.

Everything written passes ``redact.redact`` (canary, API keys, tokens). The export is built in a hidden
sibling directory and renamed into place, so ``out_dir`` is always either the
previous complete export or the new complete one, never half of either.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hangar_dagster.results.records import TrialRecord
from hangar_dagster.results.store import Store
from hangar_dagster.trials.redact import redact

if TYPE_CHECKING:
    from hangar_dagster.results.report import Report


class ExportError(ValueError):
    """The experiment is unknown or the output directory can't take an export."""


def _write_json(path: Path, value: Any, canary: str | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(redact(value, canary), indent=2, sort_keys=True) + "\n")


def _attempt_dir(t: TrialRecord) -> str:
    return f"trials/{t.trial_key.replace('/', '__')}/attempt-{t.attempt}"


def export_experiment(
    store: Store,
    experiment_id: str,
    out_dir: Path,
    canary: str | None,
    report: Report | None = None,
) -> Path:
    """Write ``out_dir/index.json`` and ``out_dir/trials/<variant>__<task>__<rep>/attempt-<n>/``,
    and with ``report`` (``results.report.build_report``) the report's files beside them.

    ``canary`` is the experiment's canary (from its spec); every string equal to
    or containing it is masked, and keys and tokens are redacted. Returns the resolved ``out_dir``.
    """
    exp = store.experiment(experiment_id)
    if exp is None:
        raise ExportError(
            f"no experiment {experiment_id!r} in {store.paths.home}; "
            "pass an experiment id as shown by `hangar experiment get`"
        )
    out_dir = out_dir.resolve()
    if out_dir.exists() and not (out_dir / "index.json").is_file() and any(out_dir.iterdir()):
        raise ExportError(
            f"{out_dir} exists and is not a hangar export (no index.json); "
            "choose an empty or new directory"
        )
    trials = store.trials(experiment_id, all_attempts=True)
    attempts: list[dict[str, Any]] = [
        {
            "trial_key": t.trial_key,
            "attempt": t.attempt,
            "run_id": t.run_id,
            "outcome_class": t.outcome_class,
            "infra_reason": t.infra_reason,
            "reused_from": t.reused_from,
            "source": t.source or "experiment",
            "shadow_of": t.shadow_of,
            "dir": _attempt_dir(t),
        }
        for t in trials
    ]
    index = {
        "experiment": exp.model_dump(mode="json"),
        "pins": {v: p.model_dump(mode="json") for v, p in store.pins(experiment_id).items()},
        "base_checks": {
            task: b.model_dump(mode="json") for task, b in store.base_checks(experiment_id).items()
        },
        "notes": [n.model_dump(mode="json") for n in store.notes(experiment_id)],
        "summary": store.summary(experiment_id),
        "index": store.index(experiment_id),
        "attempts": attempts,
    }

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f".{out_dir.name}.tmp-{uuid.uuid4().hex}")
    try:
        _write_json(staging / "index.json", index, canary)
        for t in trials:
            _write_json(staging / _attempt_dir(t) / "manifest.json", t.manifest, canary)
            _write_json(staging / _attempt_dir(t) / "trace.json", t.trace, canary)
        if report is not None:
            from hangar_dagster.results.report import to_json, write_report

            write_report(report, staging, canary)
            _write_json(staging / "report.json", to_json(report), canary)
        old = out_dir.with_name(f".{out_dir.name}.old-{uuid.uuid4().hex}")
        if out_dir.exists():
            out_dir.rename(old)
        staging.rename(out_dir)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir
