"""Nightly experiments: a spec registered once, submitted afresh every night (issue 15 item 4).

``hangar experiment schedule SPEC`` stores a copy of the spec's YAML with its digest under
``HANGAR_HOME/nightly/<name>/schedule.json``: an edit of the file afterwards changes nothing
that runs until it is registered again (``--replace``). Each night at ``nightly.at`` (local to
``nightly.timezone``) the ``nightly_experiments`` schedule calls ``tick``: the copy is
submitted as a new experiment whose bases (branch names included) resolve to that night's
SHAs, reusing the trials nothing changed for (experiment/reuse.py), and handed to the daemon.
What each night submitted is ``nights/<date>.json``: the experiment, every task's ref and SHA.

Once per night per schedule, whatever retries a tick: the night's experiment id is derived
from (schedule, night, spec digest), the night's record is written last, and a lock file per
schedule keeps two ticks from submitting at once. Which night is due is a pure function of
the clock (``due_night``), with the eval window's DST rules (queue/window.py).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import getpass
import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from hangar_dagster.experiment.catalog import DAEMON_MARKER
from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.experiment.spec import (
    MAX_SPEC_BYTES,
    ExperimentSpec,
    Nightly,
    Problem,
    RefusedForNow,
    SpecError,
    load_spec,
    parse_spec,
)
from hangar_dagster.experiment.spec_yaml import load_yaml
from hangar_dagster.experiment.submit import (
    RESOLVED,
    finish_submit,
    load_resolved,
    resolve,
    submit,
)
from hangar_dagster.queue.window import local_instant
from hangar_dagster.results.records import NoteRecord, utcnow
from hangar_dagster.results.store import Store
from hangar_dagster.settings import HangarPaths, Settings
from hangar_dagster.util.fs import read_text_bounded, try_lock, write_atomic

SCHEDULE = "schedule.json"
LAST_ERROR = "last_error.txt"  # the last failure of a schedule's tick (gone once one succeeds)
NIGHTS = "nights"
# A night is still submitted this long after its time (the daemon was down at it); later, it
# is left out and the next night goes on. Six hours reach past the default window's close.
CATCH_UP = dt.timedelta(hours=6)
log = logging.getLogger(__name__)


class NightlyError(ValueError):
    """A registration command that cannot be done; the message names the fix."""


class Schedule(BaseModel):
    """A registered nightly spec: the copy that runs each night (``schedule.json``)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    spec_path: str  # the file it was registered from: its folder anchors the spec's paths
    spec_text: str  # the YAML as registered; what every night submits
    spec_digest: str  # sha256:<hex> of spec_text
    at: str
    timezone: str
    registered_at: dt.datetime
    registered_by: str
    paused: bool = False
    paused_at: dt.datetime | None = None

    @property
    def nightly(self) -> Nightly:
        return Nightly(at=self.at, timezone=self.timezone)

    def spec(self) -> ExperimentSpec:
        return parse_spec(load_yaml(self.spec_text), f"nightly schedule {self.name}")


class TaskBase(BaseModel):
    ref: str  # as the spec names it: a branch, tag or commit
    sha: str  # what it named that night


class Night(BaseModel):
    """What one night of a schedule submitted (``nights/<date>.json``)."""

    model_config = ConfigDict(extra="forbid")

    schedule: str
    night: dt.date
    due_at: dt.datetime  # the instant (UTC) of nightly.at that night
    submitted_at: dt.datetime
    spec_digest: str
    experiment_id: str | None = None  # None: refused (``refused`` says why)
    bases: dict[str, TaskBase] = {}
    trials_planned: int = 0
    trials_reused: int = 0
    previous: str | None = None  # the experiment of the schedule's night before, if any
    refused: str | None = None
    # Only on what a tick returns, never stored: refused for now, tried again next tick.
    pending: bool = Field(default=False, exclude=True)


# ---- pure rules: which night, which id, what moved ----


def night_time(nightly: Nightly, night: dt.date) -> dt.datetime:
    """The instant (UTC) a night's submission is due: ``at`` on local date ``night``. A time
    skipped by a DST change is the first instant after the gap, a repeated one its later
    occurrence (the rules of the eval window and of Dagster's cron)."""
    return local_instant(night, nightly.time, nightly.zone)


def due_night(
    nightly: Nightly, now: dt.datetime, catch_up: dt.timedelta = CATCH_UP
) -> dt.date | None:
    """The night whose submission time has come at ``now`` and passed at most ``catch_up``
    ago (None: none is due)."""
    today = now.astimezone(nightly.zone).date()
    for night in (today, today - dt.timedelta(days=1)):
        at = night_time(nightly, night)
        if at <= now < at + catch_up:
            return night
    return None


def next_due(nightly: Nightly, now: dt.datetime) -> dt.datetime:
    """The next instant (UTC) a night is due, at or after ``now``."""
    today = now.astimezone(nightly.zone).date()
    return min(
        at
        for offset in range(3)
        if (at := night_time(nightly, today + dt.timedelta(days=offset))) >= now
    )


def night_experiment_id(name: str, night: dt.date, spec_digest: str) -> str:
    """The night's experiment id, ``<name>_<8 hex>`` like any other, derived rather than random
    so that a tick run again after a crash finds the experiment it submitted."""
    digest = hashlib.sha256(f"{name}\n{night.isoformat()}\n{spec_digest}".encode()).hexdigest()
    return f"{re.sub(r'[^A-Za-z0-9_]', '_', name)}_{digest[:8]}"


def moved_bases(before: Night | None, after: Night) -> dict[str, tuple[str, str]]:
    """Task -> (SHA before, SHA after) for each task whose ref named another commit than the
    night before."""
    if before is None:
        return {}
    return {
        task: (before.bases[task].sha, base.sha)
        for task, base in after.bases.items()
        if task in before.bases and before.bases[task].sha != base.sha
    }


def spec_digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


# ---- the registry under HANGAR_HOME/nightly ----


def schedule_dir(paths: HangarPaths, name: str) -> Path:
    return paths.nightly / name


def read_schedule(paths: HangarPaths, name: str) -> Schedule | None:
    """``name``'s schedule; None when none is registered; NightlyError when its file cannot be
    read (cut off, edited by hand), naming the file and the commands that mend it."""
    path = schedule_dir(paths, name) / SCHEDULE
    try:
        return Schedule.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:  # pydantic's ValidationError is a ValueError
        said = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise NightlyError(
            f"{path} is not a readable nightly schedule ({said}); remove it with "
            f"`hangar experiment schedule --remove {name}`, or register the spec again with "
            "`hangar experiment schedule SPEC --replace`"
        ) from None


def _names(paths: HangarPaths) -> list[str]:
    return (
        sorted(d.name for d in paths.nightly.iterdir() if d.is_dir())
        if paths.nightly.is_dir()
        else []
    )


def schedules(paths: HangarPaths) -> list[Schedule]:
    """Every registered schedule that can be read, by name (``broken_schedules``: the others)."""
    found: list[Schedule] = []
    for name in _names(paths):
        with contextlib.suppress(NightlyError):
            if (schedule := read_schedule(paths, name)) is not None:
                found.append(schedule)
    return found


def broken_schedules(paths: HangarPaths) -> dict[str, str]:
    """Name -> why, for each registered schedule whose file cannot be read."""
    broken: dict[str, str] = {}
    for name in _names(paths):
        try:
            read_schedule(paths, name)
        except NightlyError as err:
            broken[name] = str(err)
    return broken


def nights(paths: HangarPaths, name: str) -> list[Night]:
    """The nights a schedule submitted (or refused), oldest first; removal keeps them."""
    folder = schedule_dir(paths, name) / NIGHTS
    if not folder.is_dir():
        return []
    return sorted(
        (Night.model_validate_json(f.read_text()) for f in folder.glob("*.json")),
        key=lambda n: n.night,
    )


def _write_schedule(paths: HangarPaths, schedule: Schedule) -> None:
    write_atomic(schedule_dir(paths, schedule.name) / SCHEDULE, schedule.model_dump_json(indent=2))


def _named(paths: HangarPaths, name: str) -> Schedule:
    found = read_schedule(paths, name)
    if found is None:
        known = ", ".join(s.name for s in schedules(paths)) or "none"
        raise NightlyError(
            f"no nightly schedule {name!r} under {paths.nightly} (registered: {known}); "
            "`hangar experiment schedule --list` shows them"
        )
    return found


def register(spec_path: Path, settings: Settings, *, replace: bool = False) -> Schedule:
    """Register ``spec_path`` (it must have ``nightly:``) under its name, its YAML copied.

    The spec is resolved once now, nothing written, so a spec that could not be submitted
    (an unknown branch, a missing lock) is refused here, not found out at night. Raises
    SpecError (the spec) or NightlyError (the registration)."""
    text = read_text_bounded(spec_path, MAX_SPEC_BYTES, "spec")
    spec = load_spec(spec_path)
    if spec.nightly is None:
        raise SpecError(
            str(spec_path),
            [
                Problem(
                    path="nightly",
                    message="the spec has no nightly schedule",
                    fix='add nightly: {at: "19:30", timezone: America/New_York} (docs/queue.md)',
                )
            ],
        )
    resolve(spec, spec_path, settings, require_concrete=True)  # refuses what a night would
    digest = spec_digest(text)
    try:
        existing = read_schedule(settings.paths, spec.name)
    except NightlyError:
        if not replace:
            raise
        existing = None  # an unreadable copy: --replace writes a good one over it
    if existing is not None and not replace:
        if existing.spec_digest == digest:
            return existing
        raise NightlyError(
            f"nightly schedule {spec.name!r} is registered with another copy of the spec "
            f"({existing.spec_digest[:19]}, from {existing.spec_path}); "
            "add --replace to run this one from the next night on"
        )
    schedule = Schedule(
        name=spec.name,
        spec_path=str(spec_path.resolve()),
        spec_text=text,
        spec_digest=digest,
        at=spec.nightly.at,
        timezone=spec.nightly.timezone,
        registered_at=utcnow(),
        registered_by=os.environ.get("USER") or getpass.getuser(),
        paused=existing.paused if existing is not None else False,
        paused_at=existing.paused_at if existing is not None else None,
    )
    _write_schedule(settings.paths, schedule)
    return schedule


def set_paused(paths: HangarPaths, name: str, paused: bool) -> Schedule:
    schedule = _named(paths, name)
    changed = schedule.model_copy(
        update={"paused": paused, "paused_at": utcnow() if paused else None}
    )
    _write_schedule(paths, changed)
    return changed


def remove(paths: HangarPaths, name: str) -> None:
    """Unregister ``name`` (a schedule whose file cannot be read too); its nights (and their
    experiments) stay for compare and SQL."""
    path = schedule_dir(paths, name) / SCHEDULE
    if name not in broken_schedules(paths):
        _named(paths, name)  # refuses a name that is not registered
    path.unlink()


# ---- the night's submission ----


def _night_path(paths: HangarPaths, name: str, night: dt.date) -> Path:
    return schedule_dir(paths, name) / NIGHTS / f"{night.isoformat()}.json"


def read_night(paths: HangarPaths, name: str, night: dt.date) -> Night | None:
    try:
        return Night.model_validate_json(_night_path(paths, name, night).read_text())
    except FileNotFoundError:
        return None


def _bases(spec: ExperimentSpec, exp: ResolvedExperiment) -> dict[str, TaskBase]:
    return {t.id: TaskBase(ref=t.base, sha=exp.tasks[t.id].base_sha) for t in spec.tasks}


def night_note(night: Night, before: Night | None) -> str:
    """The experiment's ``nightly`` note: which night of which schedule, and what moved."""
    bases = "; ".join(f"{task} {b.ref} -> {b.sha[:12]}" for task, b in sorted(night.bases.items()))
    moved = moved_bases(before, night)
    if before is None:
        since = "the schedule's first night"
    elif moved:
        since = f"moved since night {before.night} ({before.experiment_id}): " + ", ".join(
            f"{t} {a[:12]} -> {b[:12]}" for t, (a, b) in sorted(moved.items())
        )
    else:
        since = f"no base moved since night {before.night} ({before.experiment_id})"
    return (
        f"night {night.night} of nightly schedule {night.schedule} (spec {night.spec_digest[:19]}): "
        f"{bases}; {since}; {night.trials_reused} of {night.trials_planned} trials reused"
    )


def previous_night(paths: HangarPaths, name: str, night: dt.date) -> Night | None:
    """The schedule's latest night before ``night`` that submitted an experiment."""
    earlier = [n for n in nights(paths, name) if n.night < night and n.experiment_id]
    return earlier[-1] if earlier else None


def _new_night(schedule: Schedule, night: dt.date, before: Night | None) -> Night:
    return Night(
        schedule=schedule.name,
        night=night,
        due_at=night_time(schedule.nightly, night),
        submitted_at=utcnow(),
        spec_digest=schedule.spec_digest,
        previous=before.experiment_id if before is not None else None,
    )


def submit_night(settings: Settings, schedule: Schedule, night: dt.date) -> Night | None:
    """Submit ``schedule``'s experiment for ``night`` once, hand it to the daemon and record
    the night; the night's record when it exists already, None while another tick submits."""
    paths = settings.paths
    with try_lock(schedule_dir(paths, schedule.name) / ".lock") as mine:
        if not mine:
            return None
        if (done := read_night(paths, schedule.name, night)) is not None:
            return done
        eid = night_experiment_id(schedule.name, night, schedule.spec_digest)
        before = previous_night(paths, schedule.name, night)
        spec = schedule.spec()
        record = _new_night(schedule, night, before)
        if (paths.experiment_dir(eid) / RESOLVED).is_file():
            exp = load_resolved(paths, eid)  # a tick that crashed after submitting it
            finish_submit(exp, Store(paths), paths)  # what the crash may have cut off
        else:
            try:
                exp = submit(Path(schedule.spec_path), settings, spec=spec, experiment_id=eid)
            except RefusedForNow as e:  # tried again next tick, until the catch-up ends
                write_atomic(_pending_path(paths, schedule.name, night), str(e))
                return record.model_copy(update={"refused": str(e), "pending": True})
            except SpecError as e:  # the spec itself: not tried again tonight; the next night is
                record = record.model_copy(update={"refused": str(e)})
                write_atomic(
                    _night_path(paths, schedule.name, night), record.model_dump_json(indent=2)
                )
                _pending_path(paths, schedule.name, night).unlink(missing_ok=True)
                return record
        (paths.experiment_dir(eid) / DAEMON_MARKER).touch()
        record = record.model_copy(
            update={
                "experiment_id": eid,
                "bases": _bases(spec, exp),
                "trials_planned": len(exp.trial_keys()),
                "trials_reused": len(exp.reuse.sources) if exp.reuse is not None else 0,
            }
        )
        store = Store(paths)
        # A tick cut off between the note and the record stored the note already.
        if not any(n.kind == "nightly" for n in store.notes(eid)):
            store.put(
                NoteRecord(experiment_id=eid, kind="nightly", message=night_note(record, before))
            )
        write_atomic(_night_path(paths, schedule.name, night), record.model_dump_json(indent=2))
        _pending_path(paths, schedule.name, night).unlink(missing_ok=True)
        return record


def _pending_path(paths: HangarPaths, name: str, night: dt.date) -> Path:
    """The last error of a night the world refused for now (``RefusedForNow``), until it is
    submitted or its catch-up ends (then its record says refused, with that error)."""
    return schedule_dir(paths, name) / NIGHTS / f"{night.isoformat()}.pending"


def _close_pending(settings: Settings, schedule: Schedule, due: dt.date | None) -> list[Night]:
    """Record as refused each night still pending whose catch-up is over (not ``due``)."""
    folder = schedule_dir(settings.paths, schedule.name) / NIGHTS
    closed: list[Night] = []
    for pending in sorted(folder.glob("*.pending")) if folder.is_dir() else []:
        night = dt.date.fromisoformat(pending.name.removesuffix(".pending"))
        if night == due:
            continue
        if read_night(settings.paths, schedule.name, night) is None:
            before = previous_night(settings.paths, schedule.name, night)
            record = _new_night(schedule, night, before).model_copy(
                update={
                    "refused": f"not submitted within the {CATCH_UP} catch-up; the last try "
                    "said: " + pending.read_text()
                }
            )
            write_atomic(
                _night_path(settings.paths, schedule.name, night),
                record.model_dump_json(indent=2),
            )
            closed.append(record)
        pending.unlink()
    return closed


@dataclass(frozen=True)
class TickResult:
    submitted: list[Night]  # what this tick submitted or refused (records written now)
    said: list[str]  # one line per schedule: what happened, or why nothing did


def tick(settings: Settings, now: dt.datetime) -> TickResult:
    """What the ``nightly_experiments`` schedule does at ``now``: submit each registered,
    unpaused schedule's due night that has no record yet. Each schedule on its own: one that
    fails (a broken ``schedule.json``, a bug) says so, its error kept in ``last_error.txt``
    beside it until a tick of it succeeds, and the others go on."""
    paths = settings.paths
    result = TickResult([], [])
    names = sorted(d.name for d in paths.nightly.iterdir()) if paths.nightly.is_dir() else []
    for name in names:
        error = schedule_dir(paths, name) / LAST_ERROR
        try:
            _tick_one(settings, name, now, result)
        except Exception as err:
            said = f"{name}: failed: {type(err).__name__}: {err}"[:4000]
            log.exception("nightly schedule %s failed", name)
            write_atomic(error, f"{now.isoformat()} {said}\n")
            result.said.append(said)
        else:
            error.unlink(missing_ok=True)
    return result


def _tick_one(settings: Settings, name: str, now: dt.datetime, result: TickResult) -> None:
    paths = settings.paths
    schedule = read_schedule(paths, name)
    if schedule is None:  # a folder left by --remove: its nights stay
        return
    nightly = schedule.nightly
    night = due_night(nightly, now)
    for closed in _close_pending(settings, schedule, night):
        result.submitted.append(closed)
        result.said.append(f"{schedule.name}: night {closed.night} {_outcome(closed)}")
    if schedule.paused:
        result.said.append(f"{schedule.name}: paused (`hangar experiment schedule --resume`)")
        return
    if night is None:
        at = next_due(nightly, now).astimezone(nightly.zone)
        result.said.append(f"{schedule.name}: next night is submitted at {at:%Y-%m-%d %H:%M %Z}")
        return
    if (done := read_night(paths, schedule.name, night)) is not None:
        result.said.append(f"{schedule.name}: night {night} {_outcome(done)}")
        return
    record = submit_night(settings, schedule, night)
    if record is None:
        result.said.append(f"{schedule.name}: night {night} is being submitted by another tick")
        return
    result.submitted.append(record)
    result.said.append(f"{schedule.name}: night {night} {_outcome(record)}")


def _outcome(night: Night) -> str:
    if night.pending:
        until = night.due_at + CATCH_UP
        return f"was refused for now, tried again each tick until {until:%Y-%m-%d %H:%M} UTC: {night.refused}"
    if night.experiment_id is None:
        return f"was refused: {night.refused}"
    return (
        f"submitted {night.experiment_id} ({night.trials_planned} trials, "
        f"{night.trials_reused} reused)"
    )
