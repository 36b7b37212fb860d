"""An experiment's state and whether it may be archived: pure decisions, no I/O.

Kept apart from ``catalog`` (the files) so the CLI can name the states without
importing the store or the spec machinery.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum


class State(StrEnum):
    """What ``hangar experiment list`` shows per experiment."""

    WAITING = "waiting"  # submitted, with work pending (window, budget, queue) or its index due
    RUNNING = "running"  # a Dagster run of it is in flight
    COMPLETE = "complete"  # nothing pending, every trial graded, the index written after the last
    ARCHIVED = "archived"  # out of the loaded definitions; still readable by get, export, SQL


def experiment_state(
    *,
    archived: bool,
    in_flight: bool,
    pending_trials: int,
    indexed_at: dt.datetime | None,
    last_trial_at: dt.datetime | None,
    waiting_grades: int = 0,
) -> State:
    """The one rule for an experiment's state.

    A run in flight wins over the archive mark (archive refuses beside one, so both at
    once means a run was started by hand): what is happening now is what a person needs.
    Complete needs an index written after the last trial attempt finished, so an
    experiment whose final index run is still due stays waiting, and so does one with a
    finished trial still waiting for its grade (its pass rate is not final).
    """
    if in_flight:
        return State.RUNNING
    if archived:
        return State.ARCHIVED
    indexed = indexed_at is not None and (last_trial_at is None or indexed_at >= last_trial_at)
    if pending_trials == 0 and waiting_grades == 0 and indexed:
        return State.COMPLETE
    return State.WAITING


@dataclass(frozen=True)
class Refusal:
    message: str
    fix: str


def archive_refusal(
    *,
    in_flight: str | None,
    pending_trials: int,
    indexed_at: dt.datetime | None,
    last_trial_at: dt.datetime | None,
    force: bool,
) -> Refusal | None:
    """Why ``hangar experiment archive`` may not archive now, or None.

    A run in flight always refuses, even with ``--force``: its run worker loads the
    definitions again and would no longer find its job. Pending work (or an index
    still to be written) refuses unless forced: archiving gives that work up
    until the experiment is unarchived.
    """
    if in_flight is not None:
        return Refusal(
            message=in_flight,
            # No UI needed: a run whose worker is gone is ended by archive itself (as by resume).
            fix="wait until it ends (`hangar experiment get` follows it), or stop its worker "
            "(`kill PID`, the pid in $HANGAR_HOME/runs/RUN_ID.json) and archive again: a run "
            "whose worker is gone is marked failed first; --force does not archive beside a "
            "run in flight",
        )
    if force:
        return None
    if pending_trials:
        return Refusal(
            message=f"{pending_trials} trial(s) still pending",
            fix="finish them (`hangar experiment resume`), or archive with --force to give "
            "them up (`hangar experiment unarchive` brings the experiment back)",
        )
    if indexed_at is None or (last_trial_at is not None and indexed_at < last_trial_at):
        return Refusal(
            message="its index is not written after its last trial",
            fix="let the index run (`hangar experiment resume`), or archive with --force",
        )
    return None
