"""The eval window's two cron schedules: one per experiment at its opening, one drain at its end.

Both fire in the window's zone at its local times, which Dagster's cron keeps
right across DST changes (the rules in window.py). None exist when the
window is ``always``.

**Opening.** A Dagster schedule launches only its own job (the scheduler
daemon creates every run a schedule requests under the schedule's job and
ignores ``RunRequest.job_name``), and the stage jobs are one per experiment,
so each stored experiment gets its own ``<experiment_id>__eval_window_open``
targeting its trials job. It starts the trials of an experiment that waited
for the window: daemon-driven, setup stages succeeded, nothing of it in
flight, pending work that ``queue.blocker`` allows. The driver sensor leaves
such an experiment to it for ``queue.OPEN_GRACE`` and then catches up, so a
tick evaluated later than half of that (the daemon was down at the opening)
skips and leaves the start to the sensor: the two never race for one start.

**Drain.** ``eval_window_drain`` runs at the window's end. It launches
nothing, so it targets an empty asset selection rather than some
experiment's job.

**Nightly.** ``nightly_experiments`` ticks every minute and submits each registered nightly
spec's due night (experiment/nightly.py ``tick``). One schedule reading the registry, not one
per spec: registering, pausing or removing needs no reload of the code location, and the
definitions cost the same however many specs are registered. What it submits is an
experiment like any other, handed to the driver sensor; it launches no run itself.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import dagster as dg

from hangar_dagster.experiment.nightly import tick as nightly_tick
from hangar_dagster.experiment.plan import ResolvedExperiment
from hangar_dagster.orchestration.resources import HangarResource
from hangar_dagster.orchestration.sensors import (
    daemon_driven,
    foreign_daemon,
    in_flight,
    setup_gap,
    stage_runs,
)
from hangar_dagster.orchestration.stages import TAG_STAGE, job_name, run_selection, stage_tags
from hangar_dagster.queue.starts import (
    OPEN_GRACE,
    blocker,
    fit_blocker,
    open_schedule_name,
    pending,
)
from hangar_dagster.queue.window import EvalWindow
from hangar_dagster.results.store import Store
from hangar_dagster.settings import Settings

DRAIN_NAME = "eval_window_drain"
NIGHTLY_NAME = "nightly_experiments"
# A tick evaluated later than this leaves the start to the driver sensor (its grace is twice this).
LATE_TICK = OPEN_GRACE / 2

OnClose = Callable[[dg.ScheduleEvaluationContext], object]  # its result is ignored
Clock = Callable[[], dt.datetime]


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _cron(at: dt.time) -> str:
    return f"{at.minute} {at.hour} * * *"


def open_decision(
    instance: dg.DagsterInstance,
    settings: Settings,
    exp: ResolvedExperiment,
    tick: dt.datetime,
    now: dt.datetime,
) -> dg.RunRequest | dg.SkipReason:
    """What the opening schedule's tick at ``tick`` (evaluated at ``now``) does for ``exp``."""
    eid = exp.experiment_id
    paths, window = settings.paths, settings.window
    if now - tick > LATE_TICK:
        return dg.SkipReason(
            f"{eid}: the tick of {tick.astimezone(window.tz):%Y-%m-%d %H:%M %Z} is evaluated "
            f"{(now - tick).total_seconds():.0f}s late (was the daemon down?); "
            "the experiment_driver sensor starts the trials instead"
        )
    if not daemon_driven(paths, exp):
        return dg.SkipReason(
            f"{eid}: not driven by the daemon (submitted with --wait; that process starts its trials)"
        )
    runs = stage_runs(instance, exp)
    busy = in_flight(runs)
    if busy is not None:
        stage = busy.dagster_run.tags.get(TAG_STAGE, "?")
        return dg.SkipReason(
            f"{eid}: its {stage} run {busy.dagster_run.run_id} is in flight; "
            "the experiment_driver sensor goes on once it ends"
        )
    gap = setup_gap(exp, runs)
    if gap is not None:
        stage, last = gap
        state = "has not run" if last is None else f"ended {last.dagster_run.status.value}"
        return dg.SkipReason(
            f"{eid}: setup stage {stage} {state}; trials start once the setup stages succeed"
        )
    store = Store(paths)
    work = pending(exp, store, settings)
    if not work:
        return dg.SkipReason(f"{eid}: no trial is pending")
    why = blocker(exp, store, settings, now) or fit_blocker(exp, work.keys, store, settings, now)
    if why is not None:
        return dg.SkipReason(f"{eid}: {why}")
    opened = (window.opens_at(now) or now).astimezone(window.tz)
    tags = stage_tags(exp, "trials", work.keys + work.grades, settings.run_partitions)
    return dg.RunRequest(
        run_key=f"{eid}:trials:window-{opened:%Y-%m-%d}",
        tags=tags,
        asset_selection=run_selection(exp, "trials", tags),
    )


def build_open_schedule(
    exp: ResolvedExperiment,
    jobs: list[dg.UnresolvedAssetJobDefinition],
    window: EvalWindow,
    clock: Clock = _utcnow,
) -> list[dg.ScheduleDefinition]:
    """``<experiment_id>__eval_window_open`` on ``exp``'s trials job (in ``jobs``), running by
    default; none when the window is always open. ``clock`` is when a tick is evaluated.

    ``window`` (the definitions' settings) sets the cron; a tick decides with the settings of
    the ``hangar`` resource, read once per tick (the same values: both come from one load)."""
    if window.start is None:
        return []
    [trials_job] = [j for j in jobs if j.name == job_name(exp, "trials")]

    @dg.schedule(
        cron_schedule=_cron(window.start),
        execution_timezone=window.tz.key,
        name=open_schedule_name(exp.experiment_id),
        job=trials_job,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Starts the waiting trials of {exp.name} when the eval window "
        f"({window.describe()}) opens.",
    )
    def eval_window_open(
        context: dg.ScheduleEvaluationContext, hangar: HangarResource
    ) -> dg.RunRequest | dg.SkipReason:
        tick = context.scheduled_execution_time
        settings = hangar.settings()
        if (refused := foreign_daemon(context.instance, settings)) is not None:
            return dg.SkipReason(refused)
        return open_decision(context.instance, settings, exp, tick, clock())

    return [eval_window_open]


def build_drain_schedule(window: EvalWindow, on_close: OnClose) -> list[dg.ScheduleDefinition]:
    """``eval_window_drain``, running by default; none when the window is always open.

    ``on_close`` runs once at each end of the window and should stop what is running.
    """
    if window.end is None:  # always open: nothing to drain
        return []
    described = window.describe()

    @dg.schedule(
        cron_schedule=_cron(window.end),
        execution_timezone=window.tz.key,
        name=DRAIN_NAME,
        target=dg.AssetSelection.assets(),
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Drains running trials at the end of the eval window ({described}).",
    )
    def eval_window_drain(context: dg.ScheduleEvaluationContext) -> dg.SkipReason:
        on_close(context)
        at = context.scheduled_execution_time.astimezone(window.tz)
        return dg.SkipReason(
            f"drained at the end of the eval window {described}"
            f" ({at:%Y-%m-%d %H:%M %Z}); nothing launched"
        )

    return [eval_window_drain]


def build_nightly_schedule() -> dg.ScheduleDefinition:
    """``nightly_experiments``: every minute (nightly.at is to the minute), running by default;
    each tick submits the nights that are due, and launches nothing."""

    @dg.schedule(
        cron_schedule="* * * * *",
        execution_timezone="UTC",
        name=NIGHTLY_NAME,
        target=dg.AssetSelection.assets(),
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description="Submits a fresh experiment of each registered nightly spec at its time "
        "(`hangar experiment schedule --list`).",
    )
    def nightly_experiments(
        context: dg.ScheduleEvaluationContext, hangar: HangarResource
    ) -> dg.SkipReason:
        settings = hangar.settings()
        if (refused := foreign_daemon(context.instance, settings)) is not None:
            return dg.SkipReason(refused)
        # The scheduled minute, not the clock: a tick caught up late still decides its own night.
        done = nightly_tick(settings, context.scheduled_execution_time)
        if any(n.experiment_id for n in done.submitted):
            # Its jobs load with the code location: ask the webserver to reload it, as
            # `hangar experiment run` does (`hangar ui` also reloads when it sees the experiment).
            from hangar_dagster.cli.ui import notify_webserver

            notify_webserver(settings)
        for night in done.submitted:
            context.log.info(
                f"nightly: {night.schedule}: night {night.night}: {night.experiment_id or night.refused}"
            )
        return dg.SkipReason("; ".join(done.said) or "no nightly schedule is registered")

    return nightly_experiments
