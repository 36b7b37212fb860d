"""Trial attempts cut off by a restart: closing what a dead run left behind.

``run_trial`` writes ``started.json`` (``trial.STARTED_MARKER``) into the
attempt's artifacts dir before the agent starts. A process killed mid-trial (the daemon or run worker
restarted, ``hangar experiment run --wait`` killed) leaves that marker and no
stored ``TrialRecord``. The next trials run calls ``close_interrupted`` first:
every marker without a record whose run is no longer in flight becomes an
``infra_error / control_plane_restart`` record, so the key's next attempt is a
retry (``retry_of`` = the dead run) under the usual rules. hangar never
resumes a trial (docs/queue.md, "No resuming").
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import socket
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hangar_dagster.experiment.plan import ResolvedExperiment, TrialKey
from hangar_dagster.results.records import TrialRecord, utcnow
from hangar_dagster.results.store import DuplicateRecordError, Store
from hangar_dagster.settings import HangarPaths, Settings
from hangar_dagster.trials.trial import RAW_PATCH, STARTED_MARKER, pinned_fields
from hangar_dagster.util.fs import write_atomic


@dataclass(frozen=True)
class StartedMarker:
    """What ``trial.mark_started`` writes (its keys are these fields)."""

    experiment_id: str
    trial_key: str
    attempt: int
    retry_of: str | None
    run_id: str
    started_at: str  # ISO 8601, UTC
    host: str
    pid: int

    def process_alive(self) -> bool:
        """Whether the process that ran the attempt still runs; True when it ran on another host."""
        if self.host != socket.gethostname():
            return True  # cannot tell from here: the run's status decides
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True  # exists, owned by someone else
        return True


def started_markers(paths: HangarPaths, experiment_id: str) -> list[StartedMarker]:
    root = paths.artifacts / experiment_id
    out = []
    for path in sorted(root.glob(f"*/attempt-*/{STARTED_MARKER}")):
        try:
            out.append(StartedMarker(**json.loads(path.read_text())))
        except (ValueError, TypeError) as err:  # a torn or foreign file: say which
            raise ValueError(
                f"{path}: not a started marker ({err}); delete it if no trial wrote it"
            ) from err
    return out


def estimate_cost(exp: ResolvedExperiment, known: list[float], variant: str) -> tuple[float, str]:
    """(estimate, basis) of an attempt whose cost is unknown: unknown is not free.

    The median of the variant's known attempt costs in this experiment (one agent and model
    on the same tasks: the nearest evidence there is); with none yet, the spec's per-trial
    cap ``trial_job_budget.max_cost_usd`` (an upper bound: no attempt may spend more); else
    the experiment's ``budget.max_cost_usd`` spread over its planned trials (what one trial
    may spend on average); with none of them, 0 and a basis that says nothing bounds it.
    docs/data.md, "Unknown costs".
    """
    if known:
        return (
            round(statistics.median(known), 6),
            f"median of {len(known)} known attempt cost(s) of variant {variant}",
        )
    if exp.spec.trial_job_budget is not None:
        return (
            exp.spec.trial_job_budget.max_cost_usd,
            f"trial_job_budget.max_cost_usd (no known cost of variant {variant} yet)",
        )
    if exp.spec.budget is not None and (planned := len(exp.trial_keys())) > 0:
        return (
            round(exp.spec.budget.max_cost_usd / planned, 6),
            f"budget.max_cost_usd over its {planned} planned trials (no known cost of variant "
            f"{variant} yet, no trial_job_budget)",
        )
    return 0.0, f"none: no known cost of variant {variant}, no trial_job_budget and no budget"


def _closed_record(
    exp: ResolvedExperiment,
    marker: StartedMarker,
    art: Path,
    closed_by: str,
    aliases: frozenset[str],
    estimate: tuple[float, str],
) -> TrialRecord:
    key = TrialKey.parse(marker.trial_key)
    variant = exp.variants[key.variant]
    started_at = dt.datetime.fromisoformat(marker.started_at)
    finished_at = utcnow()
    error = (
        f"cut off by a restart: run {marker.run_id} (pid {marker.pid} on {marker.host}) ended "
        f"without recording this attempt; closed by run {closed_by}. Not resumed: the retry "
        "starts over from a fresh clone"
    )
    manifest = {
        "experiment_id": exp.experiment_id,
        "trial_key": marker.trial_key,
        "attempt": marker.attempt,
        "retry_of": marker.retry_of,
        "run_id": marker.run_id,
        "closed_by_run": closed_by,
        "pin_set": variant.pin_set,
        "started_at": marker.started_at,
    }
    trace: dict[str, object] = {
        "outcome_class": "infra_error",
        "infra_reason": "control_plane_restart",
        "error": error,
        "events": [],
        "cost_usd": None,  # unknown: the process that knew it is gone
        "cost_estimate_usd": estimate[0],
        "cost_basis": estimate[1],
    }
    write_atomic(art / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True))
    write_atomic(art / "trace.json", json.dumps(trace, indent=2, sort_keys=True))
    write_atomic(art / "patch.diff", "")
    write_atomic(art / RAW_PATCH, "")  # the grades asset reads it for every counting attempt
    return TrialRecord(
        **pinned_fields(exp, key, marker.attempt, marker.retry_of, marker.run_id, aliases),
        agent_is_standin=variant.adapter == "standin",
        started_at=started_at,
        finished_at=finished_at,
        duration_s=max(0.0, (finished_at - started_at).total_seconds()),
        outcome_class="infra_error",
        infra_reason="control_plane_restart",
        agent_exit_code=None,
        verify_passed=None,
        verify_exit_code=None,
        patch_sha256=hashlib.sha256(b"").hexdigest(),
        patch_bytes=0,
        changed_files=[],
        turns=0,
        tokens_in=0,
        tokens_out=0,
        cost_usd=None,
        cost_estimate_usd=estimate[0],
        cost_basis=estimate[1],
        error=error,
        manifest=manifest,
        trace=trace,
        artifacts_dir=str(art),
    )


def close_interrupted(
    exp: ResolvedExperiment,
    store: Store,
    settings: Settings,
    current_run: str,
    in_flight: Callable[[StartedMarker], bool],
) -> list[TrialRecord]:
    """Store an ``infra_error / control_plane_restart`` record for every attempt a dead run left.

    An attempt is closed when its marker has no stored record, was not written
    by ``current_run``, and ``in_flight(marker)`` says its run is gone. Returns
    the records stored (a record another run stored first is skipped).
    """
    paths = settings.paths
    markers = [m for m in started_markers(paths, exp.experiment_id) if m.run_id != current_run]
    if not markers:  # nothing to close: no read of the experiment's attempts
        return []
    # The markers' keys only; the variants' costs (for an estimate) only once one is closed.
    mine = store.trials(exp.experiment_id, all_attempts=True, keys={m.trial_key for m in markers})
    stored = {(t.trial_key, t.attempt) for t in mine}
    known: dict[str, list[float]] | None = None
    closed = []
    for marker in markers:
        if (marker.trial_key, marker.attempt) in stored or in_flight(marker):
            continue
        if known is None:
            known = {}
            for t in store.trials(exp.experiment_id, all_attempts=True):
                if t.cost_usd is not None:
                    known.setdefault(t.variant, []).append(t.cost_usd)
        art = paths.trial_artifacts(exp.experiment_id, marker.trial_key, marker.attempt)
        variant = TrialKey.parse(marker.trial_key).variant
        estimate = estimate_cost(exp, known.get(variant, []), variant)
        record = _closed_record(exp, marker, art, current_run, settings.model_aliases, estimate)
        try:
            store.put(record)
        except DuplicateRecordError:
            continue  # its own run stored it after all, or another run closed it first
        closed.append(record)
    return closed
